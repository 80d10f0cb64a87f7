//! Reading and writing HF safetensors checkpoints (single file or sharded with an index).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};

use crate::error::{ModelError, Result};
use crate::weight::LazyWeight;

/// The safetensors files of an HF directory: `model.safetensors`, or the shards named in
/// `model.safetensors.index.json`.
pub fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            ModelError::bad_file(
                &index,
                format!("not valid JSON ({e}); re-download the index"),
            )
        })?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                ModelError::bad_file(&index, "has no `weight_map` object; re-download the index")
            })?;
        let mut files: Vec<String> = map
            .values()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        files.sort();
        files.dedup();
        let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
        for p in &paths {
            if !p.exists() {
                return Err(ModelError::bad_file(
                    p,
                    "shard listed in model.safetensors.index.json is missing; the download is \
                     incomplete",
                ));
            }
        }
        return Ok(paths);
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let mut any: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ModelError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    any.sort();
    if any.is_empty() {
        return Err(ModelError::bad_file(
            dir,
            "no model.safetensors or model.safetensors.index.json; pass an HF model directory \
             (or a .gguf file)",
        ));
    }
    Ok(any)
}

/// Loads every tensor of the given files, converted to `dtype` on `device`; `on_dtype` sees the
/// stored dtype of each tensor (for reports).
pub fn load_tensors(
    files: &[PathBuf],
    dtype: DType,
    device: &Device,
    mut on_dtype: impl FnMut(String),
) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for path in files {
        let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| {
            ModelError::bad_file(
                path,
                format!("corrupt safetensors file ({e}); re-download or re-export it"),
            )
        })?;
        for (name, view) in st.tensors() {
            on_dtype(format!("{:?}", view.dtype()));
            let t = view_to_tensor(&view, device).map_err(|e| {
                ModelError::bad_file(path, format!("tensor `{name}` unreadable: {e}"))
            })?;
            out.insert(name, t.to_dtype(dtype)?);
        }
    }
    Ok(out)
}

fn view_to_tensor(view: &safetensors::tensor::TensorView<'_>, device: &Device) -> Result<Tensor> {
    use safetensors::Dtype as S;
    let shape = view.shape().to_vec();
    let data = view.data();
    let dtype = match view.dtype() {
        S::F32 => DType::F32,
        S::F16 => DType::F16,
        S::BF16 => DType::BF16,
        S::F64 => DType::F64,
        S::I64 => DType::I64,
        S::U32 => DType::U32,
        S::U8 => DType::U8,
        other => {
            return Err(ModelError::Invalid(format!(
                "dtype {other:?} is not supported; export the model in float32, float16 or \
                 bfloat16"
            )))
        }
    };
    Ok(Tensor::from_raw_buffer(data, dtype, &shape, device)?)
}

/// Writes `tensors` (on the CPU) to the safetensors file `path` with PyTorch's `format: pt`
/// metadata, through a temporary file and a rename, readable by others (0644).
pub fn write_file(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "tensors.safetensors".into());
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(tensors.iter().map(|(n, t)| (n, t)), Some(meta), &tmp).map_err(
        |e| {
            ModelError::bad_file(
                &tmp,
                format!("cannot write safetensors ({e}); check disk space"),
            )
        },
    )?;
    // The writer creates its file private (0600); a model file is meant to be shared.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644));
    }
    std::fs::rename(&tmp, path).map_err(|e| ModelError::io(path, e))
}

/// Writes tensors as one `model.safetensors`, or as shards of at most `shard_bytes` with a
/// `model.safetensors.index.json`, converting to `dtype`. Files are written to a temporary name
/// and renamed, so an interrupted save never leaves a truncated file under the final name.
pub fn save_tensors(
    dir: &Path,
    tensors: &[(String, Tensor)],
    dtype: DType,
    shard_bytes: usize,
) -> Result<Vec<PathBuf>> {
    let lazy: Vec<LazyWeight> = tensors
        .iter()
        .map(|(n, t)| LazyWeight::from_tensor(n.clone(), t.clone()))
        .collect();
    save_lazy(dir, &lazy, dtype, shard_bytes)
}

/// [`save_tensors`] for weights made as they are written: each is made, converted and written
/// in turn, so at most one of them is in memory at a time (besides what the model holds).
pub fn save_lazy(
    dir: &Path,
    tensors: &[LazyWeight],
    dtype: DType,
    shard_bytes: usize,
) -> Result<Vec<PathBuf>> {
    let size = |t: &LazyWeight| t.shape.iter().product::<usize>() * dtype.size_in_bytes();
    let total: usize = tensors.iter().map(size).sum();
    let mut shards: Vec<Vec<&LazyWeight>> = vec![Vec::new()];
    let mut cur = 0usize;
    for t in tensors {
        if cur > 0 && cur + size(t) > shard_bytes {
            shards.push(Vec::new());
            cur = 0;
        }
        cur += size(t);
        shards.last_mut().expect("non-empty").push(t);
    }
    let count = shards.len();
    let mut written = Vec::new();
    let mut weight_map = BTreeMap::new();
    for (i, shard) in shards.into_iter().enumerate() {
        let name = if count == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, count)
        };
        for t in &shard {
            weight_map.insert(t.name.clone(), name.clone());
        }
        let path = dir.join(&name);
        write_streamed(&path, &shard, dtype)?;
        written.push(path);
    }
    if count > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        crate::util::write_json_atomic(&dir.join("model.safetensors.index.json"), &index)?;
    }
    Ok(written)
}

/// safetensors' name of a dtype this writer stores.
fn st_dtype(d: DType) -> Result<&'static str> {
    match d {
        DType::F32 => Ok("F32"),
        DType::BF16 => Ok("BF16"),
        DType::F16 => Ok("F16"),
        other => Err(ModelError::Invalid(format!(
            "cannot write {other:?} tensors; use f32, bf16 or f16"
        ))),
    }
}

/// One safetensors file written as it is made: the header (from the shapes alone, PyTorch's
/// `format: pt` metadata, padded to 8 bytes as the format asks), then each tensor's bytes in
/// header order, through a temporary file and a rename, readable by others (0644).
fn write_streamed(path: &Path, tensors: &[&LazyWeight], dtype: DType) -> Result<()> {
    use std::io::Write;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "tensors.safetensors".into());
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let st = st_dtype(dtype)?;
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0usize;
    for t in tensors {
        let n = t.shape.iter().product::<usize>() * dtype.size_in_bytes();
        header.insert(
            t.name.clone(),
            json!({"dtype": st, "shape": t.shape, "data_offsets": [offset, offset + n]}),
        );
        offset += n;
    }
    let mut head = serde_json::to_vec(&Value::Object(header))
        .map_err(|e| ModelError::Invalid(format!("safetensors header: {e}")))?;
    head.resize(head.len().next_multiple_of(8), b' ');
    let io = |e: std::io::Error| {
        ModelError::bad_file(
            &tmp,
            format!("cannot write safetensors ({e}); check disk space"),
        )
    };
    let file = std::fs::File::create(&tmp).map_err(io)?;
    let mut w = std::io::BufWriter::new(file);
    w.write_all(&(head.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(&head).map_err(io)?;
    for t in tensors {
        let v = t.tensor()?.to_dtype(dtype)?.to_device(&Device::Cpu)?;
        if v.dims() != t.shape.as_slice() {
            return Err(ModelError::ShapeMismatch {
                name: t.name.clone(),
                got: v.dims().to_vec(),
                expected: t.shape.clone(),
            });
        }
        w.write_all(&safetensors::View::data(&v)).map_err(io)?;
    }
    let file = w.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644));
    }
    std::fs::rename(&tmp, path).map_err(|e| ModelError::io(path, e))
}
