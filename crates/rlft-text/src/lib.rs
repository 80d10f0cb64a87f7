//! # rlft-text
//!
//! The text side of rlft: everything between strings and token ids, with no tensors.
//!
//! - [`bpe`]: build a `tokenizers::Tokenizer` from the tokenizer arrays of a GGUF file
//!   ([`build_bpe_tokenizer`], [`BpeSpec`]), reproducing each model's own tokenizer.json.
//! - [`hfdir`]: a tokenizer with its special tokens and chat template ([`TextBundle`]), read from
//!   a Hugging Face directory ([`load_tokenizer_dir`]) or written to one that transformers loads
//!   ([`save_tokenizer_dir`]).
//! - [`chat`]: chat templates rendered byte-identically to transformers' `apply_chat_template`
//!   ([`ChatTemplate`], [`RenderOptions`], [`Message`]).
//! - [`decode`]: streaming detokenization ([`IncrementalDecoder`]) and stop strings
//!   ([`StopStrings`], [`StopMatcher`]) for generation.
//!
//! Typical use: `let bundle = load_tokenizer_dir(dir)?; let chat = bundle.compile_chat_template()?;
//! let prompt = chat.render(&messages, &bundle.render_options(true))?;
//! let ids = bundle.encode(&prompt, false)?;`

pub mod bpe;
pub mod chat;
pub mod decode;
mod error;
pub mod hfdir;
mod jinja;
mod pyfmt;

pub use bpe::{build_bpe_tokenizer, token_type, BpeSpec, PreTokenizerKind};
pub use chat::{ChatTemplate, Content, Message, RenderOptions, SpecialTokens};
pub use decode::{IncrementalDecoder, StopMatch, StopMatcher, StopStrings};
pub use error::{Result, TextError};
pub use hfdir::{load_tokenizer_dir, save_tokenizer_dir, TextBundle};
/// Re-exported so callers name the same `tokenizers` version.
pub use tokenizers;
