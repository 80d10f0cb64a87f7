//! A pure-Rust, panic-free reader for GGUF files (llama.cpp's model format) with
//! dequantisation of tensors to f32.
//!
//! # Format
//!
//! A GGUF file (versions 2 and 3, little-endian) is a header (magic `GGUF`, version, tensor
//! count, metadata count), a table of typed metadata key/values (integers, floats, bools,
//! strings and possibly nested arrays of those), a table of tensor infos (name, dims with
//! `ne[0]` first, ggml type, offset), padding to `general.alignment` (default 32), then the data
//! section holding each tensor's raw (usually block-quantised) bytes at its offset.
//!
//! # Robustness
//!
//! [`GgufFile::from_bytes`] validates everything before anything is trusted: each read is
//! length-checked, each count is checked against the bytes that remain before any allocation,
//! array nesting is bounded ([`MAX_ARRAY_DEPTH`]), and each tensor's shape, type, alignment and
//! data range are checked against the file length with overflow-checked arithmetic. Malformed
//! or truncated input yields a [`GgufError`] that says what was being read and where; the crate
//! has no `unsafe` code and is fuzzed (`fuzz/` at the workspace root).
//!
//! # Example
//!
//! ```no_run
//! # fn main() -> Result<(), rlft_gguf::GgufError> {
//! let gguf = rlft_gguf::GgufFile::open("model.gguf")?;
//! println!("architecture: {:?}", gguf.architecture());
//! let vocab = gguf.metadata().get_string_array("tokenizer.ggml.tokens")?;
//! let n_layer = gguf.metadata().get_u32("llama.block_count")?;
//! for info in gguf.tensors() {
//!     let (shape, data) = gguf.read_f32(&info.name)?;
//!     println!("{} {:?} {} -> {} values", info.name, shape, info.ggml_type, data.len());
//! }
//! # let _ = (vocab, n_layer);
//! # Ok(()) }
//! ```
//!
//! # Modules
//!
//! - `reader`: the bounds-checked cursor and the header parser.
//! - `value` and `metadata`: [`Value`], [`Array`] and the ordered [`Metadata`] table with
//!   typed getters.
//! - `file`: [`GgufFile`] and [`TensorInfo`].
//! - `types`: [`GgmlType`] (ids, block sizes, byte sizes).
//! - `dequant` and `kquants`: bit-exact ports of ggml's `dequantize_row_*`, run in
//!   parallel with rayon for large tensors ([`dequantize`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod dequant;
mod error;
mod file;
mod kquants;
mod metadata;
mod reader;
mod types;
mod value;

pub use dequant::dequantize;
pub use error::{GgufError, Result};
pub use file::{GgufFile, TensorInfo};
pub use metadata::Metadata;
pub use reader::{DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use types::GgmlType;
pub use value::{Array, Value, ValueType};

#[cfg(test)]
mod tests;
