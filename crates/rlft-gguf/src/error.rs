//! The one error type of this crate.

use std::path::PathBuf;

use crate::GgmlType;

/// Everything that can go wrong while reading a GGUF file.
///
/// Every variant carries enough context to print a useful message on its own: which key or
/// tensor was being read, at which byte offset, and what was expected. The messages include the
/// underlying cause, so the variants deliberately expose no `source()` chain (printing the chain
/// as well would repeat it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be read from disk.
    #[error("cannot read GGUF file {}: {error}", path.display())]
    Io {
        /// The path that was opened.
        path: PathBuf,
        /// The operating-system error.
        error: std::io::Error,
    },

    /// A parse error in a file opened by path; wraps the error with the path.
    #[error("{}: {error}", path.display())]
    InFile {
        /// The path that was opened.
        path: PathBuf,
        /// What went wrong inside the file.
        error: Box<GgufError>,
    },

    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: the first bytes are {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic {
        /// The bytes found at offset 0 (fewer than four if the input is shorter).
        found: Vec<u8>,
    },

    /// The version field is neither 2 nor 3 (version 1 and big-endian files are not supported).
    #[error("unsupported GGUF version {version}{}; this reader supports little-endian versions 2 and 3",
        if version.swap_bytes() == 2 || version.swap_bytes() == 3 { " (this looks like a big-endian GGUF file)" } else { "" })]
    UnsupportedVersion {
        /// The version number as read (little-endian).
        version: u32,
    },

    /// The input ends (or a length field points) beyond the end of the data.
    #[error("truncated GGUF data: {what} at offset {offset} needs {needed} bytes, but only {available} remain")]
    Truncated {
        /// What was being read.
        what: String,
        /// Byte offset of the read.
        offset: u64,
        /// Bytes the read needs.
        needed: u64,
        /// Bytes left in the input from `offset`.
        available: u64,
    },

    /// A count (of keys, tensors or array elements) that cannot fit in the remaining bytes.
    #[error("corrupt count: {what} at offset {offset} declares {count} items, which need at least {min_bytes} bytes, but only {available} remain")]
    CountTooLarge {
        /// What the count counts.
        what: String,
        /// Byte offset of the items (just after the count).
        offset: u64,
        /// The declared count.
        count: u64,
        /// Lower bound of the bytes those items occupy (saturated at `u64::MAX`).
        min_bytes: u64,
        /// Bytes left in the input from `offset`.
        available: u64,
    },

    /// A metadata value type id outside the GGUF specification (0..=12).
    #[error("unknown metadata value type {type_id} for {what} at offset {offset} (valid: 0..=12)")]
    UnknownValueType {
        /// Where the value type was read.
        what: String,
        /// Byte offset of the type id.
        offset: u64,
        /// The id found.
        type_id: u32,
    },

    /// A boolean byte other than 0 or 1.
    #[error("invalid boolean byte {byte} for {what} at offset {offset} (expected 0 or 1)")]
    InvalidBool {
        /// Which value.
        what: String,
        /// Byte offset.
        offset: u64,
        /// The byte found.
        byte: u8,
    },

    /// Arrays nested deeper than [`crate::MAX_ARRAY_DEPTH`].
    #[error("metadata key '{key}': arrays nested deeper than {max} levels at offset {offset}")]
    NestingTooDeep {
        /// The key whose value nests too deep.
        key: String,
        /// Byte offset of the innermost array header.
        offset: u64,
        /// The limit.
        max: usize,
    },

    /// The same metadata key appears twice.
    #[error("duplicate metadata key '{key}' at offset {offset}")]
    DuplicateKey {
        /// The key.
        key: String,
        /// Byte offset of the second occurrence.
        offset: u64,
    },

    /// The same tensor name appears twice.
    #[error("duplicate tensor name '{name}' at offset {offset}")]
    DuplicateTensor {
        /// The tensor name.
        name: String,
        /// Byte offset of the second occurrence.
        offset: u64,
    },

    /// A tensor's ggml type id is not a type this reader knows.
    #[error("tensor '{tensor}': unknown ggml type id {type_id} at offset {offset}")]
    UnknownGgmlType {
        /// The tensor name.
        tensor: String,
        /// The type id found.
        type_id: u32,
        /// Byte offset of the type id.
        offset: u64,
    },

    /// A tensor with more dimensions than ggml supports.
    #[error(
        "tensor '{tensor}': {n_dims} dimensions at offset {offset}, ggml supports at most {max}"
    )]
    TooManyDims {
        /// The tensor name.
        tensor: String,
        /// Dimensions declared.
        n_dims: u32,
        /// Byte offset of the dimension count.
        offset: u64,
        /// The limit (4).
        max: u32,
    },

    /// The element count or byte size of a tensor overflows.
    #[error("tensor '{tensor}': dims {dims:?} overflow the element count or byte size")]
    ShapeOverflow {
        /// The tensor name.
        tensor: String,
        /// Its dims in GGUF order.
        dims: Vec<u64>,
    },

    /// The first (innermost) dimension is not a multiple of the type's block size.
    #[error("tensor '{tensor}': first dimension {ne0} of dims {dims:?} is not a multiple of the {ggml_type} block size {block_size}")]
    NotBlockMultiple {
        /// The tensor name.
        tensor: String,
        /// Its dims in GGUF order.
        dims: Vec<u64>,
        /// The first dimension.
        ne0: u64,
        /// The tensor's type.
        ggml_type: GgmlType,
        /// Elements per block of that type.
        block_size: usize,
    },

    /// A tensor offset that is not a multiple of the file's alignment.
    #[error(
        "tensor '{tensor}': data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        /// The tensor name.
        tensor: String,
        /// Offset relative to the start of the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },

    /// A tensor's data lies (partly) outside the file.
    #[error("tensor '{tensor}': needs {size} bytes at offset {offset} of the data section (which starts at byte {data_start}), but the file has only {file_len} bytes")]
    TensorOutOfBounds {
        /// The tensor name.
        tensor: String,
        /// Offset relative to the start of the data section.
        offset: u64,
        /// Bytes the tensor occupies.
        size: u64,
        /// Absolute byte offset of the data section.
        data_start: u64,
        /// Length of the whole file.
        file_len: u64,
    },

    /// `general.alignment` is not a non-zero power of two that fits in a `u32`.
    #[error("general.alignment must be a non-zero power of two u32, found {found}")]
    InvalidAlignment {
        /// The value found, formatted.
        found: String,
    },

    /// A metadata key asked for by a typed getter is absent.
    #[error("metadata key '{key}' is missing")]
    MissingKey {
        /// The key.
        key: String,
    },

    /// A metadata value has a type the getter cannot convert (or is out of the target's range).
    #[error("metadata key '{key}': expected {expected}, found {found}")]
    WrongType {
        /// The key.
        key: String,
        /// What the getter wanted.
        expected: &'static str,
        /// A short description of the value found.
        found: String,
    },

    /// No tensor with this name.
    #[error("no tensor named '{name}' in the GGUF file")]
    TensorNotFound {
        /// The name asked for.
        name: String,
    },

    /// The tensor's ggml type is known but dequantising it is not implemented.
    #[error("tensor '{tensor}': dequantising {ggml_type} to f32 is not supported")]
    UnsupportedType {
        /// The tensor name (empty when dequantising raw bytes).
        tensor: String,
        /// Its type.
        ggml_type: GgmlType,
    },

    /// Raw data handed to [`crate::dequantize`] does not match the requested element count.
    #[error("{ggml_type}: {elements} elements need {expected} bytes, got {bytes}")]
    SizeMismatch {
        /// The type.
        ggml_type: GgmlType,
        /// Elements requested.
        elements: usize,
        /// Bytes those elements occupy (0 when `elements` is not a multiple of the block size).
        expected: usize,
        /// Bytes given.
        bytes: usize,
    },
}

/// Shorthand for `Result<T, GgufError>`.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;
