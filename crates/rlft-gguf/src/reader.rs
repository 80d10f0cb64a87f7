//! Bounds-checked parsing of the GGUF header, metadata and tensor infos.
//!
//! Every read goes through [`Cursor`], which checks the length before touching a byte, and every
//! count is checked against the bytes that remain before anything is allocated for it. No
//! function here indexes a slice without a check, so malformed input yields a [`GgufError`].

use std::collections::HashMap;

use crate::error::{GgufError, Result};
use crate::file::TensorInfo;
use crate::metadata::Metadata;
use crate::value::{Array, Value, ValueType};
use crate::GgmlType;

/// Arrays nested deeper than this are rejected (bounds the parser's recursion).
pub const MAX_ARRAY_DEPTH: usize = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// Data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Fewest bytes a metadata entry occupies: key length (8), empty key, type (4), one byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Fewest bytes a tensor info occupies: name length (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// Copies up to `N` bytes of `src` into a fixed array (callers pass exactly `N` bytes).
pub(crate) fn le<const N: usize>(src: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    for (d, s) in out.iter_mut().zip(src) {
        *d = *s;
    }
    out
}

/// A read position in a byte slice; every read is length-checked.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, pos: 0 }
    }

    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    pub(crate) fn remaining(&self) -> u64 {
        self.bytes.len().saturating_sub(self.pos) as u64
    }

    /// Takes `n` bytes, or fails with [`GgufError::Truncated`] naming `what`.
    pub(crate) fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8]> {
        let truncated = |what: String| GgufError::Truncated {
            what,
            offset: self.pos(),
            needed: n,
            available: self.remaining(),
        };
        if n > self.remaining() {
            return Err(truncated(what()));
        }
        let end = self.pos.saturating_add(n as usize);
        match self.bytes.get(self.pos..end) {
            Some(slice) => {
                self.pos = end;
                Ok(slice)
            }
            None => Err(truncated(what())),
        }
    }

    fn fixed<const N: usize>(&mut self, what: impl FnOnce() -> String) -> Result<[u8; N]> {
        self.take(N as u64, what).map(le::<N>)
    }

    pub(crate) fn u8(&mut self, what: impl FnOnce() -> String) -> Result<u8> {
        self.fixed::<1>(what).map(|b| b[0])
    }

    pub(crate) fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32> {
        self.fixed(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64> {
        self.fixed(what).map(u64::from_le_bytes)
    }

    /// A length-prefixed string; the length is checked against the remaining bytes.
    pub(crate) fn string(&mut self, what: impl Fn() -> String) -> Result<String> {
        let len = self.u64(|| format!("length of {}", what()))?;
        let bytes = self.take(len, || format!("{} ({len} bytes)", what()))?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// Fails with [`GgufError::CountTooLarge`] unless `count` items of at least `min_size`
    /// bytes each fit in the remaining input.
    fn check_count(&self, count: u64, min_size: u64, what: impl FnOnce() -> String) -> Result<()> {
        match count.checked_mul(min_size) {
            Some(needed) if needed <= self.remaining() => Ok(()),
            needed => Err(GgufError::CountTooLarge {
                what: what(),
                offset: self.pos(),
                count,
                min_bytes: needed.unwrap_or(u64::MAX),
                available: self.remaining(),
            }),
        }
    }
}

/// Everything in a GGUF file except the tensor data.
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// Parses and validates the header of `bytes` (the whole file).
pub(crate) fn parse_header(bytes: &[u8]) -> Result<Header> {
    parse_header_of(bytes, bytes.len() as u64)
}

/// Parses and validates the header held at the start of `bytes`, a prefix of a file of
/// `file_len` bytes: tensor data ranges are checked against `file_len`. A prefix too short for
/// the header fails with [`GgufError::Truncated`] or [`GgufError::CountTooLarge`].
pub(crate) fn parse_header_of(bytes: &[u8], file_len: u64) -> Result<Header> {
    if bytes.get(..4) != Some(b"GGUF".as_slice()) {
        return Err(GgufError::BadMagic {
            found: bytes.iter().take(4).copied().collect(),
        });
    }
    let mut c = Cursor::new(bytes);
    c.take(4, || "magic".into())?;
    let version = c.u32(|| "version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let tensor_count = c.u64(|| "tensor count".into())?;
    let kv_count = c.u64(|| "metadata entry count".into())?;
    c.check_count(kv_count, MIN_KV_BYTES, || "metadata entry count".into())?;
    c.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, || {
        "tensor count".into()
    })?;

    let mut metadata = Metadata::default();
    for i in 0..kv_count {
        let key_offset = c.pos();
        let key = c.string(|| format!("key of metadata entry {i}"))?;
        let type_offset = c.pos();
        let type_id = c.u32(|| format!("value type of key '{key}'"))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            what: format!("key '{key}'"),
            offset: type_offset,
            type_id,
        })?;
        let value = read_value(&mut c, ty, &key, 0)?;
        if let Err(key) = metadata.insert_new(key, value) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: key_offset,
            });
        }
    }

    c.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, || {
        "tensor count".into()
    })?;
    let mut tensors = Vec::with_capacity(tensor_count as usize);
    let mut tensor_index = HashMap::with_capacity(tensor_count as usize);
    for i in 0..tensor_count {
        let name_offset = c.pos();
        let name = c.string(|| format!("name of tensor info {i}"))?;
        let dims_offset = c.pos();
        let n_dims = c.u32(|| format!("dimension count of tensor '{name}'"))?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name,
                n_dims,
                offset: dims_offset,
                max: MAX_DIMS,
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(c.u64(|| format!("dimension {d} of tensor '{name}'"))?);
        }
        let type_offset = c.pos();
        let type_id = c.u32(|| format!("ggml type of tensor '{name}'"))?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownGgmlType {
            tensor: name.clone(),
            type_id,
            offset: type_offset,
        })?;
        let offset = c.u64(|| format!("data offset of tensor '{name}'"))?;
        if tensor_index.contains_key(&name) {
            return Err(GgufError::DuplicateTensor {
                name,
                offset: name_offset,
            });
        }
        tensor_index.insert(name.clone(), tensors.len());
        tensors.push(TensorInfo::new(name, dims, ggml_type, offset));
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u32() {
            Some(a) if a.is_power_of_two() => u64::from(a),
            _ => {
                return Err(GgufError::InvalidAlignment {
                    found: v.describe(),
                })
            }
        },
    };
    // The cursor position is at most the input length and the alignment at most 2^31, so
    // this cannot overflow; checked anyway.
    let data_offset =
        c.pos()
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| GgufError::InvalidAlignment {
                found: format!("{alignment} (data offset overflows)"),
            })?;
    for t in &mut tensors {
        t.locate(data_offset, alignment, file_len)?;
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        tensor_index,
        alignment,
        data_offset,
    })
}

/// Reads one value of type `ty` for metadata key `key`.
fn read_value(c: &mut Cursor<'_>, ty: ValueType, key: &str, depth: usize) -> Result<Value> {
    let what = || format!("{} value of key '{key}'", ty.name());
    Ok(match ty {
        ValueType::U8 => Value::U8(c.u8(what)?),
        ValueType::I8 => Value::I8(c.u8(what)? as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.fixed(what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.fixed(what)?)),
        ValueType::U32 => Value::U32(c.u32(what)?),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.fixed(what)?)),
        ValueType::U64 => Value::U64(c.u64(what)?),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.fixed(what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.fixed(what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.fixed(what)?)),
        ValueType::Bool => {
            let offset = c.pos();
            Value::Bool(parse_bool(c.u8(what)?, offset, &what)?)
        }
        ValueType::String => Value::String(c.string(what)?),
        ValueType::Array => Value::Array(read_array(c, key, depth)?),
    })
}

fn parse_bool(byte: u8, offset: u64, what: &dyn Fn() -> String) -> Result<bool> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(GgufError::InvalidBool {
            what: what(),
            offset,
            byte,
        }),
    }
}

/// Reads `count` fixed-size little-endian numbers.
fn numbers<const N: usize, T>(
    c: &mut Cursor<'_>,
    count: u64,
    what: impl FnOnce() -> String,
    conv: fn([u8; N]) -> T,
) -> Result<Vec<T>> {
    let raw = c.take(count.saturating_mul(N as u64), what)?;
    Ok(raw.chunks_exact(N).map(|b| conv(le::<N>(b))).collect())
}

/// Reads an array header (element type, count) and its elements.
fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<Array> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            key: key.to_string(),
            offset: c.pos(),
            max: MAX_ARRAY_DEPTH,
        });
    }
    let type_offset = c.pos();
    let type_id = c.u32(|| format!("array element type of key '{key}'"))?;
    let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
        what: format!("array elements of key '{key}'"),
        offset: type_offset,
        type_id,
    })?;
    let n = c.u64(|| format!("array length of key '{key}'"))?;
    let what = || format!("{n} {} elements of key '{key}'", ty.name());
    c.check_count(n, ty.min_disk_size(), what)?;
    // `n` items of at least one byte fit in the remaining input, so `n` fits in usize.
    let len = n as usize;
    Ok(match ty {
        ValueType::U8 => Array::U8(c.take(n, what)?.to_vec()),
        ValueType::I8 => Array::I8(numbers(c, n, what, i8::from_le_bytes)?),
        ValueType::U16 => Array::U16(numbers(c, n, what, u16::from_le_bytes)?),
        ValueType::I16 => Array::I16(numbers(c, n, what, i16::from_le_bytes)?),
        ValueType::U32 => Array::U32(numbers(c, n, what, u32::from_le_bytes)?),
        ValueType::I32 => Array::I32(numbers(c, n, what, i32::from_le_bytes)?),
        ValueType::U64 => Array::U64(numbers(c, n, what, u64::from_le_bytes)?),
        ValueType::I64 => Array::I64(numbers(c, n, what, i64::from_le_bytes)?),
        ValueType::F32 => Array::F32(numbers(c, n, what, f32::from_le_bytes)?),
        ValueType::F64 => Array::F64(numbers(c, n, what, f64::from_le_bytes)?),
        ValueType::Bool => {
            let offset = c.pos();
            let raw = c.take(n, what)?;
            let mut out = Vec::with_capacity(len);
            for (i, &b) in raw.iter().enumerate() {
                let elem = || format!("element {i} of bool array of key '{key}'");
                out.push(parse_bool(b, offset + i as u64, &elem)?);
            }
            Array::Bool(out)
        }
        ValueType::String => {
            let mut out = Vec::with_capacity(len);
            for i in 0..n {
                out.push(c.string(|| format!("string {i} of array of key '{key}'"))?);
            }
            Array::String(out)
        }
        ValueType::Array => {
            let mut out = Vec::with_capacity(len);
            for _ in 0..n {
                out.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(out)
        }
    })
}
