//! The one error type of this crate. Every message says what is wrong and how to fix it.

use std::path::PathBuf;

/// Errors from building tokenizers, reading/writing tokenizer directories, rendering chat templates
/// and decoding.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// The GGUF-style vocabulary arrays are inconsistent or unusable.
    #[error("invalid tokenizer vocabulary: {reason}. Fix: {fix}")]
    InvalidVocab {
        /// What is wrong.
        reason: String,
        /// How to fix it.
        fix: String,
    },

    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know.
    #[error(
        "unsupported pre-tokenizer `tokenizer.ggml.pre = {name:?}`; supported: {supported}. \
         Fix: load the model from a Hugging Face directory with its tokenizer.json instead, or add \
         the split regex llama.cpp uses for {name:?} to `PreTokenizerKind` in rlft-text/src/bpe.rs"
    )]
    UnsupportedPreTokenizer {
        /// The name found in the GGUF metadata.
        name: String,
        /// The names that are supported, comma-separated.
        supported: String,
    },

    /// An error from the `tokenizers` crate (building, encoding, decoding, saving).
    #[error("tokenizer error while {context}: {message}")]
    Tokenizer {
        /// What we were doing.
        context: String,
        /// The underlying message.
        message: String,
    },

    /// A Hugging Face tokenizer directory has no `tokenizer.json`.
    #[error(
        "no tokenizer.json in {dir}. Fix: point to a Hugging Face model directory that has one, \
         or create it with Python: `AutoTokenizer.from_pretrained(<model>).save_pretrained({dir:?})` \
         (this also converts slow sentencepiece tokenizers to the fast format)"
    )]
    MissingTokenizerJson {
        /// The directory that was searched.
        dir: PathBuf,
    },

    /// A file could not be read or written.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// "read" or "write" etc.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },

    /// A JSON file has the wrong shape.
    #[error("invalid {path}: {reason}. Fix: {fix}")]
    InvalidConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
        /// How to fix it.
        fix: String,
    },

    /// A token string (bos/eos/pad/unk) is not in the tokenizer's vocabulary.
    #[error(
        "{role} token {token:?} is not in the vocabulary. Fix: set {role}_token in \
         tokenizer_config.json to a token of tokenizer.json (or remove it)"
    )]
    UnknownSpecialToken {
        /// "bos", "eos", "pad" or "unk".
        role: &'static str,
        /// The token string.
        token: String,
    },

    /// The model has no chat template but one was needed.
    #[error(
        "this tokenizer has no chat template. Fix: add `chat_template` to tokenizer_config.json or \
         a chat_template.jinja file, or pass a template explicitly"
    )]
    NoChatTemplate,

    /// The chat template does not compile.
    #[error("chat template does not compile: {message}{}. Fix: correct the Jinja syntax of the template", line_suffix(*line))]
    TemplateSyntax {
        /// The parser's message.
        message: String,
        /// 1-based line in the template source, when known.
        line: Option<usize>,
    },

    /// The chat template raised an error with `raise_exception(message)` (as in transformers,
    /// where it raises `jinja2.exceptions.TemplateError(message)`).
    #[error("chat template raised an exception: {message}")]
    TemplateRaised {
        /// The message the template passed to `raise_exception`.
        message: String,
    },

    /// Rendering the chat template failed for another reason (bad variable type, missing filter...).
    #[error("chat template failed to render: {message}{}. Fix: check the messages/kwargs passed match what the template expects", line_suffix(*line))]
    TemplateRender {
        /// The renderer's message.
        message: String,
        /// 1-based line in the template source, when known.
        line: Option<usize>,
    },

    /// Invalid argument to an API of this crate (e.g. an empty stop string).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

fn line_suffix(line: Option<usize>) -> String {
    match line {
        Some(l) => format!(" (template line {l})"),
        None => String::new(),
    }
}

impl TextError {
    pub(crate) fn tokenizer(context: impl Into<String>, err: impl std::fmt::Display) -> Self {
        TextError::Tokenizer {
            context: context.into(),
            message: err.to_string(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = TextError> = std::result::Result<T, E>;
