//! [`GgufFile`]: a parsed GGUF file that owns its bytes, and [`TensorInfo`].

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use crate::error::{GgufError, Result};
use crate::metadata::Metadata;
use crate::reader::{parse_header, parse_header_of};
use crate::value::Value;
use crate::GgmlType;

/// One entry of the tensor-info table.
///
/// `dims` are in GGUF order (`ne[0]`, the contiguous dimension, first); [`TensorInfo::shape`]
/// gives the row-major shape that candle and PyTorch use (the dims reversed).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in GGUF order, `ne[0]` first.
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Absolute byte range of the data in the file (validated by the parser).
    range: Range<usize>,
}

impl TensorInfo {
    pub(crate) fn new(name: String, dims: Vec<u64>, ggml_type: GgmlType, offset: u64) -> Self {
        TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            range: 0..0,
        }
    }

    /// Validates the shape and the data range against the file; records the range.
    pub(crate) fn locate(&mut self, data_offset: u64, alignment: u64, file_len: u64) -> Result<()> {
        let overflow = || GgufError::ShapeOverflow {
            tensor: self.name.clone(),
            dims: self.dims.clone(),
        };
        // The product of the non-zero dims must fit in i64 (as in ggml), so that consumers
        // can multiply the dims in any order without overflow, even for an empty tensor.
        let nonzero = self
            .dims
            .iter()
            .filter(|&&d| d != 0)
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&p| p <= i64::MAX as u64)
            .ok_or_else(overflow)?;
        let n_elements = if self.dims.contains(&0) { 0 } else { nonzero };
        let block_size = self.ggml_type.block_size();
        let ne0 = self.dims.first().copied().unwrap_or(1);
        if !ne0.is_multiple_of(block_size as u64) {
            return Err(GgufError::NotBlockMultiple {
                tensor: self.name.clone(),
                dims: self.dims.clone(),
                ne0,
                ggml_type: self.ggml_type,
                block_size,
            });
        }
        let size = self.ggml_type.bytes_for(n_elements).ok_or_else(overflow)?;
        // The f32 output must be addressable too.
        usize::try_from(n_elements)
            .ok()
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(overflow)?;
        if !self.offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedTensor {
                tensor: self.name.clone(),
                offset: self.offset,
                alignment,
            });
        }
        let out_of_bounds = || GgufError::TensorOutOfBounds {
            tensor: self.name.clone(),
            offset: self.offset,
            size,
            data_start: data_offset,
            file_len,
        };
        let start = data_offset
            .checked_add(self.offset)
            .ok_or_else(out_of_bounds)?;
        let end = start.checked_add(size).ok_or_else(out_of_bounds)?;
        if end > file_len {
            return Err(out_of_bounds());
        }
        // Both bounds are at most the length of an in-memory slice, so they fit in usize.
        self.range = start as usize..end as usize;
        Ok(())
    }

    /// Row-major shape (dims reversed), as candle and PyTorch see it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims
            .iter()
            .rev()
            .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
            .collect()
    }

    /// Number of elements (the product of the dims; 1 for a tensor with no dims).
    pub fn n_elements(&self) -> usize {
        self.dims.iter().fold(1usize, |acc, &d| {
            acc.saturating_mul(usize::try_from(d).unwrap_or(usize::MAX))
        })
    }

    /// Bytes the tensor's data occupies in the file.
    pub fn size_in_bytes(&self) -> usize {
        self.range.len()
    }

    /// Absolute byte range of the tensor's data in the file.
    pub fn data_range(&self) -> Range<usize> {
        self.range.clone()
    }
}

/// A parsed GGUF (v2 or v3, little-endian) file that owns its bytes.
///
/// Parsing validates the whole header: every count against the remaining bytes, every tensor's
/// type, shape and data range against the file length. Tensor data is only dequantised when
/// asked for, with [`GgufFile::read_f32`].
#[derive(Debug, Clone)]
pub struct GgufFile {
    bytes: Vec<u8>,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl GgufFile {
    /// Parses a GGUF file held in memory (the bytes are copied; see [`GgufFile::from_vec`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<GgufFile> {
        Self::from_vec(bytes.to_vec())
    }

    /// Parses a GGUF file held in memory, taking ownership of the buffer.
    pub fn from_vec(bytes: Vec<u8>) -> Result<GgufFile> {
        let header = parse_header(&bytes)?;
        Ok(GgufFile {
            bytes,
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            tensor_index: header.tensor_index,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    /// Reads and parses the file at `path`; errors name the path.
    ///
    /// The whole file is read into memory (no memory map, so this crate needs no `unsafe`).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        Self::from_vec(bytes).map_err(|error| GgufError::InFile {
            path: path.to_path_buf(),
            error: Box::new(error),
        })
    }

    /// Reads only the header of the file at `path`: metadata and tensor infos (every tensor's
    /// range checked against the file length), without its tensor data. For what a model is
    /// (config, tokenizer) without loading it, e.g. to plan memory. Reading a tensor whose data
    /// lies past the part read fails with [`GgufError::TensorOutOfBounds`]; [`GgufFile::bytes`]
    /// is that part only.
    ///
    /// Reads 1 MiB, then twice as much until the header fits (the vocabulary of a large
    /// tokenizer takes a few MiB).
    pub fn open_header(path: impl AsRef<Path>) -> Result<GgufFile> {
        use std::io::Read;
        let path = path.as_ref();
        let in_file = |error| GgufError::InFile {
            path: path.to_path_buf(),
            error: Box::new(error),
        };
        let io = |error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        };
        let mut file = std::fs::File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut bytes = Vec::new();
        let mut want: u64 = 1 << 20;
        loop {
            let target = want.min(file_len);
            let have = bytes.len() as u64;
            (&mut file)
                .take(target - have)
                .read_to_end(&mut bytes)
                .map_err(io)?;
            match parse_header_of(&bytes, file_len) {
                Ok(header) => {
                    return Ok(GgufFile {
                        bytes,
                        version: header.version,
                        metadata: header.metadata,
                        tensors: header.tensors,
                        tensor_index: header.tensor_index,
                        alignment: header.alignment,
                        data_offset: header.data_offset,
                    })
                }
                Err(GgufError::Truncated { .. } | GgufError::CountTooLarge { .. })
                    if (bytes.len() as u64) < file_len && bytes.len() as u64 == target =>
                {
                    want = want.saturating_mul(2);
                }
                Err(e) => return Err(in_file(e)),
            }
        }
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata table.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The value of metadata key `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// `general.architecture` (e.g. `"llama"`), if present.
    pub fn architecture(&self) -> Option<&str> {
        self.metadata.architecture()
    }

    /// The data-section alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of the tensor called `name`, if any.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
    }

    fn find(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| GgufError::TensorNotFound {
            name: name.to_string(),
        })
    }

    /// The raw (still quantised) bytes of tensor `name`.
    pub fn tensor_data(&self, name: &str) -> Result<&[u8]> {
        let info = self.find(name)?;
        self.bytes
            .get(info.data_range())
            .ok_or_else(|| GgufError::TensorOutOfBounds {
                tensor: name.to_string(),
                offset: info.offset,
                size: info.size_in_bytes() as u64,
                data_start: self.data_offset,
                file_len: self.bytes.len() as u64,
            })
    }

    /// Dequantises tensor `name` to f32; returns its row-major shape and data.
    ///
    /// Large tensors are dequantised in parallel (rayon). Fails for unknown names and for
    /// types without a dequantiser ([`GgmlType::can_dequantize`]).
    pub fn read_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let info = self.find(name)?;
        if !info.ggml_type.can_dequantize() {
            return Err(GgufError::UnsupportedType {
                tensor: name.to_string(),
                ggml_type: info.ggml_type,
            });
        }
        let data = self.tensor_data(name)?;
        let mut out = vec![0f32; info.n_elements()];
        crate::dequant::dequantize(info.ggml_type, data, &mut out)?;
        Ok((info.shape(), out))
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}
