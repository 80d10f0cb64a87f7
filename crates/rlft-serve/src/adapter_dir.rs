//! Where `/v1/load_lora_adapter` may read adapters from. Runtime loading is off unless the
//! operator names a directory (`rlft serve --allow-runtime-lora DIR`, as vLLM keeps it off
//! unless `VLLM_ALLOW_RUNTIME_LORA_UPDATING`); then a requested `lora_path` is resolved
//! (relative paths against DIR), canonicalised, and refused unless it lies under DIR's canonical
//! path, so `..` and symlinks cannot leave it. The files in the adapter directory are checked
//! the same way (a symlink there could point anywhere).
//!
//! Simplified: the check and the read are two steps, so someone who can write under DIR could
//! swap a checked directory for a symlink in between; DIR is meant to be writable only by the
//! operator and the trainer.

use std::path::{Component, Path, PathBuf};

/// Why a `lora_path` is refused.
#[derive(Debug, thiserror::Error)]
pub enum AdapterPathError {
    /// The allowed directory itself is missing.
    #[error(
        "this server loads adapters only from under {}, which does not exist ({source}); \
         create it, or restart rlft serve with --allow-runtime-lora naming the directory the \
         adapters are written to", dir.display()
    )]
    RootMissing {
        /// The allowed directory.
        dir: PathBuf,
        /// Why it could not be resolved.
        source: std::io::Error,
    },
    /// The path (or a file in it) resolves outside the allowed directory.
    #[error(
        "lora_path `{path}` resolves to {}, outside {}, the only directory this server loads \
         adapters from (rlft serve --allow-runtime-lora); write the adapter under it",
        resolved.display(), dir.display()
    )]
    Outside {
        /// The requested path.
        path: String,
        /// Where it (or a file in it) resolves, as far as it could be resolved.
        resolved: PathBuf,
        /// The allowed directory.
        dir: PathBuf,
    },
    /// Under the allowed directory, but missing or not a directory.
    #[error("lora_path `{path}` is not a readable directory under {} ({why})", dir.display())]
    NotADirectory {
        /// The requested path.
        path: String,
        /// The allowed directory.
        dir: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// The directory runtime adapters must come from.
#[derive(Debug, Clone)]
pub struct AdapterDir {
    dir: PathBuf,
}

impl AdapterDir {
    /// Adapters under `dir` (made absolute against the current directory now; it may be
    /// created later, e.g. by the trainer).
    pub fn new(dir: &Path) -> std::io::Result<AdapterDir> {
        Ok(AdapterDir {
            dir: std::path::absolute(dir)?,
        })
    }

    /// The directory as configured (absolute).
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The canonical directory to load `requested` from, or why not.
    pub fn resolve(&self, requested: &str) -> Result<PathBuf, AdapterPathError> {
        let root = self
            .dir
            .canonicalize()
            .map_err(|source| AdapterPathError::RootMissing {
                dir: self.dir.clone(),
                source,
            })?;
        let joined = self.dir.join(requested);
        let outside = |resolved: PathBuf| AdapterPathError::Outside {
            path: requested.to_string(),
            resolved,
            dir: self.dir.clone(),
        };
        let not_dir = |why: String| AdapterPathError::NotADirectory {
            path: requested.to_string(),
            dir: self.dir.clone(),
            why,
        };
        let path = match joined.canonicalize() {
            Ok(p) => p,
            Err(e) => {
                // Missing: say so only for a path that is under the directory as written, so
                // the answer does not tell whether a path elsewhere exists.
                let lexical = normalize(&joined);
                if lexical.starts_with(&self.dir) || lexical.starts_with(&root) {
                    return Err(not_dir(e.to_string()));
                }
                return Err(outside(lexical));
            }
        };
        if !path.starts_with(&root) {
            return Err(outside(path));
        }
        if !path.is_dir() {
            return Err(not_dir("not a directory".into()));
        }
        let entries = std::fs::read_dir(&path).map_err(|e| not_dir(e.to_string()))?;
        for entry in entries.flatten() {
            // A dangling link is refused by the loader if it is a file it reads.
            if let Ok(t) = entry.path().canonicalize() {
                if !t.starts_with(&root) {
                    return Err(outside(t));
                }
            }
        }
        Ok(path)
    }
}

/// `p` with `.` and `..` resolved by name, without touching the file system.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, AdapterDir) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("adapters");
        std::fs::create_dir_all(root.join("step-1")).unwrap();
        std::fs::write(root.join("step-1/adapter_config.json"), "{}").unwrap();
        std::fs::create_dir_all(tmp.path().join("elsewhere")).unwrap();
        let d = AdapterDir::new(&root).unwrap();
        (tmp, d)
    }

    #[test]
    fn paths_under_the_directory_resolve() {
        let (tmp, d) = setup();
        let want = tmp.path().join("adapters/step-1").canonicalize().unwrap();
        let abs = tmp.path().join("adapters/step-1");
        assert_eq!(d.resolve(abs.to_str().unwrap()).unwrap(), want);
        assert_eq!(d.resolve("step-1").unwrap(), want);
        assert_eq!(d.resolve("./step-1/../step-1").unwrap(), want);
    }

    #[test]
    fn dot_dot_and_absolute_paths_outside_are_refused() {
        let (tmp, d) = setup();
        let elsewhere = tmp.path().join("elsewhere");
        for p in [
            "../elsewhere".to_string(),
            elsewhere.display().to_string(),
            format!("{}/adapters/../elsewhere", tmp.path().display()),
            "/".to_string(),
            "../missing".to_string(),
        ] {
            let e = d.resolve(&p).unwrap_err();
            assert!(matches!(e, AdapterPathError::Outside { .. }), "{p}: {e}");
            assert!(
                e.to_string().contains(&d.path().display().to_string()),
                "{e}"
            );
        }
        let e = d.resolve("missing").unwrap_err();
        assert!(matches!(e, AdapterPathError::NotADirectory { .. }), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_out_of_the_directory_are_refused() {
        let (tmp, d) = setup();
        let root = tmp.path().join("adapters");
        let elsewhere = tmp.path().join("elsewhere");
        std::os::unix::fs::symlink(&elsewhere, root.join("escape")).unwrap();
        let e = d.resolve("escape").unwrap_err();
        assert!(matches!(e, AdapterPathError::Outside { .. }), "{e}");
        // A file inside an adapter directory that links out.
        std::fs::write(elsewhere.join("secret"), "x").unwrap();
        std::fs::create_dir_all(root.join("step-2")).unwrap();
        std::os::unix::fs::symlink(
            elsewhere.join("secret"),
            root.join("step-2/adapter_model.safetensors"),
        )
        .unwrap();
        let e = d.resolve("step-2").unwrap_err();
        assert!(matches!(e, AdapterPathError::Outside { .. }), "{e}");
        // A link that stays inside is fine.
        std::os::unix::fs::symlink(root.join("step-1"), root.join("latest")).unwrap();
        assert!(d.resolve("latest").is_ok());
    }

    #[test]
    fn a_missing_directory_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let d = AdapterDir::new(&tmp.path().join("not-yet")).unwrap();
        let e = d.resolve("step-0").unwrap_err();
        assert!(matches!(e, AdapterPathError::RootMissing { .. }), "{e}");
        assert!(e.to_string().contains("not-yet"), "{e}");
    }
}
