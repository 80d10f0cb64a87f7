//! Typed errors of the model runtime. Every message says what is wrong and how to fix it.

use std::path::PathBuf;

/// Errors from loading, running or saving a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A config value is missing, inconsistent or unsupported.
    #[error("invalid model config: {0}")]
    Config(String),
    /// The architecture is not one rlft implements.
    #[error("unknown architecture {0}")]
    UnknownArchitecture(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file exists but its content is unusable.
    #[error("{path}: {msg}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        msg: String,
    },
    /// A weight the architecture needs is absent.
    #[error("missing weight `{name}` in {source_desc}; the checkpoint does not match its config.json (architecture or layer count)")]
    MissingWeight {
        /// HF tensor name.
        name: String,
        /// Where we looked.
        source_desc: String,
    },
    /// A weight has the wrong shape for the config.
    #[error("weight `{name}` has shape {got:?} but the config implies {expected:?}; check hidden_size/num_heads/head_dim in config.json")]
    ShapeMismatch {
        /// HF tensor name.
        name: String,
        /// Shape in the file.
        got: Vec<usize>,
        /// Shape the config implies.
        expected: Vec<usize>,
    },
    /// GGUF reader errors.
    #[error(transparent)]
    Gguf(#[from] rlft_gguf::GgufError),
    /// A model argument that is an unknown name, or a built-in model that could not be fetched.
    #[error(transparent)]
    Fetch(#[from] rlft_fetch::FetchError),
    /// Tokenizer or chat template errors.
    #[error(transparent)]
    Text(#[from] rlft_text::TextError),
    /// Bad arguments to a runtime call.
    #[error("{0}")]
    Invalid(String),
    /// Tensor backend errors.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
}

impl ModelError {
    /// A config error.
    pub fn config(msg: impl Into<String>) -> Self {
        ModelError::Config(msg.into())
    }

    /// A bad-file error.
    pub fn bad_file(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        ModelError::BadFile {
            path: path.into(),
            msg: msg.into(),
        }
    }

    /// An IO error on a path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
