//! File plumbing of checkpoints: fsynced, checksummed writes (with a simulated full disk for
//! tests), streamed safetensors, and reads checked against the manifest.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::{io_err, CheckpointError, FileEntry, Manifest, Result};
use crate::crc32c::{crc32c, Crc32c};

/// Tensors with their names, in file order.
pub(super) type NamedTensors = Vec<(String, Tensor)>;

/// A file being written: counts bytes, checksums them, and can simulate a full disk.
struct Tracked<'a> {
    file: File,
    crc: Crc32c,
    bytes: u64,
    budget: Option<&'a Cell<u64>>,
}

impl Write for Tracked<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut buf = buf;
        if let Some(budget) = self.budget {
            let left = budget.get();
            if left == 0 && !buf.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    "No space left on device (simulated)",
                ));
            }
            buf = &buf[..buf.len().min(usize::try_from(left).unwrap_or(usize::MAX))];
        }
        let n = self.file.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        if let Some(budget) = self.budget {
            budget.set(budget.get() - n as u64);
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Writes `dir/name` with `body`, fsyncs it, and returns its manifest entry.
pub(super) fn write_file(
    dir: &Path,
    name: &str,
    budget: Option<&Cell<u64>>,
    body: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<FileEntry> {
    let path = dir.join(name);
    let file = File::create(&path).map_err(io_err("create", &path))?;
    let mut w = BufWriter::with_capacity(
        1 << 20,
        Tracked {
            file,
            crc: Crc32c::new(),
            bytes: 0,
            budget,
        },
    );
    body(&mut w).map_err(|e| match e {
        CheckpointError::Io { source, .. } => io_err("write", &path)(source),
        other => other,
    })?;
    let tracked = w
        .into_inner()
        .map_err(|e| io_err("write", &path)(e.into_error()))?;
    tracked.file.sync_all().map_err(io_err("fsync", &path))?;
    Ok(FileEntry {
        bytes: tracked.bytes,
        crc32c: tracked.crc.finish(),
    })
}

pub(super) fn write_json(w: &mut dyn Write, value: &impl Serialize) -> Result<()> {
    let mut text =
        serde_json::to_vec_pretty(value).map_err(|e| CheckpointError::Invalid(e.to_string()))?;
    text.push(b'\n');
    w.write_all(&text).map_err(io_err("write", Path::new("")))
}

/// Raw little-endian bytes of a tensor (copied to the CPU).
fn tensor_bytes(t: &Tensor) -> candle_core::Result<Vec<u8>> {
    macro_rules! bytes {
        ($ty:ty) => {
            t.flatten_all()?
                .to_vec1::<$ty>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect()
        };
    }
    Ok(match t.dtype() {
        DType::U8 => t.flatten_all()?.to_vec1::<u8>()?,
        DType::U32 => bytes!(u32),
        DType::I64 => bytes!(i64),
        DType::BF16 => bytes!(half::bf16),
        DType::F16 => bytes!(half::f16),
        DType::F32 => bytes!(f32),
        DType::F64 => bytes!(f64),
        other => candle_core::bail!(
            "dtype {other:?} cannot be checkpointed; use f32/bf16/f16/f64/u8/u32/i64"
        ),
    })
}

/// Streams a safetensors file (same header layout as the `safetensors` crate writes).
pub(super) fn write_safetensors(
    w: &mut dyn Write,
    file: &Path,
    tensors: &[(String, Tensor)],
    metadata: HashMap<String, String>,
) -> Result<()> {
    let mut seen = HashSet::new();
    let mut infos = Vec::with_capacity(tensors.len());
    let mut offset = 0usize;
    for (name, t) in tensors {
        if !seen.insert(name.as_str()) {
            return Err(CheckpointError::Invalid(format!(
                "tensor `{name}` appears twice in `{}`",
                file.display()
            )));
        }
        let n = t.elem_count() * t.dtype().size_in_bytes();
        let info = safetensors::tensor::TensorInfo {
            dtype: t.dtype().into(),
            shape: t.dims().to_vec(),
            data_offsets: (offset, offset + n),
        };
        offset += n;
        infos.push((name.clone(), info));
    }
    let meta = safetensors::tensor::Metadata::new(Some(metadata), infos)
        .map_err(|e| CheckpointError::Invalid(format!("`{}`: {e}", file.display())))?;
    let mut header =
        serde_json::to_vec(&meta).map_err(|e| CheckpointError::Invalid(e.to_string()))?;
    header.resize(header.len().next_multiple_of(8), b' ');
    let io = |e| io_err("write", file)(e);
    w.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(&header).map_err(io)?;
    for (_, t) in tensors {
        let bytes = tensor_bytes(t).map_err(|source| CheckpointError::Tensor {
            file: file.to_owned(),
            source,
        })?;
        w.write_all(&bytes).map_err(io)?;
    }
    Ok(())
}

pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    // Directories cannot be opened for fsync on Windows; the rename is as durable as it gets there.
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Reads `dir/name`, checking its size and CRC against the manifest.
pub(super) fn read_checked(dir: &Path, m: &Manifest, name: &str) -> Result<Vec<u8>> {
    let entry = m.files.get(name).ok_or_else(|| CheckpointError::Missing {
        dir: dir.to_owned(),
        file: name.into(),
    })?;
    let path = dir.join(name);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(CheckpointError::Missing {
                dir: dir.to_owned(),
                file: name.into(),
            })
        }
        Err(e) => return Err(io_err("read", &path)(e)),
    };
    let corrupt = |reason| CheckpointError::Corrupt {
        file: path.clone(),
        reason,
    };
    if bytes.len() as u64 != entry.bytes {
        return Err(corrupt(format!(
            "{} bytes, expected {}",
            bytes.len(),
            entry.bytes
        )));
    }
    let crc = crc32c(&bytes);
    if crc != entry.crc32c {
        return Err(corrupt(format!(
            "CRC-32C is {crc:#010x}, expected {:#010x}",
            entry.crc32c
        )));
    }
    Ok(bytes)
}

pub(super) fn parse_json<T: for<'de> Deserialize<'de>>(
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| CheckpointError::Corrupt {
        file: dir.join(name),
        reason: e.to_string(),
    })
}

/// Tensors of a safetensors buffer in file order, and its metadata.
pub(super) fn parse_safetensors(
    file: &Path,
    bytes: &[u8],
    device: &Device,
) -> Result<(NamedTensors, HashMap<String, String>)> {
    use candle_core::safetensors::Load;
    let corrupt = |reason: String| CheckpointError::Corrupt {
        file: file.to_owned(),
        reason,
    };
    let (_, meta) =
        safetensors::SafeTensors::read_metadata(bytes).map_err(|e| corrupt(e.to_string()))?;
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| corrupt(e.to_string()))?;
    let mut out = Vec::new();
    for name in meta.offset_keys() {
        let view = st.tensor(&name).map_err(|e| corrupt(e.to_string()))?;
        let t = view
            .load(device)
            .map_err(|source| CheckpointError::Tensor {
                file: file.to_owned(),
                source,
            })?;
        out.push((name, t));
    }
    Ok((out, meta.metadata().clone().unwrap_or_default()))
}
