//! The Hugging Face `datasets` `save_to_disk` layout.
//!
//! A `Dataset` directory holds
//! - `data-00000-of-0000N.arrow`: the rows as Arrow IPC **stream** files (shards),
//! - `state.json`: `_data_files` (the shard names, in order), `_fingerprint`, `_split`, format
//!   settings,
//! - `dataset_info.json`: `features`, the schema in `datasets`' own notation.
//!
//! A `DatasetDict` directory holds `dataset_dict.json` (`{"splits": ["train", "test"]}`) and one
//! `Dataset` directory per split.

use std::fs::{self, File};
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_ipc::reader::{FileReader, StreamReader};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::ArrowError;
use serde_json::{json, Value};
use sha2::Digest;

use crate::atomic::{self, HashingWriter};
use crate::dataset::Dataset;
use crate::error::{DataError, Result};
use crate::features::features_of;
use crate::to_arrow::dataset_batches;
use crate::to_json::append_batch;

/// The shard name `datasets` uses for a one-shard split.
const SHARD: &str = "data-00000-of-00001.arrow";

fn layout_err(path: &Path, message: impl Into<String>) -> DataError {
    DataError::HfLayout {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = fs::read_to_string(path).map_err(|e| DataError::io("cannot read", path, e))?;
    serde_json::from_str(&text).map_err(|e| layout_err(path, format!("invalid JSON: {e}")))
}

/// The split names listed in a `DatasetDict` directory's `dataset_dict.json`.
pub fn read_splits(dir: &Path) -> Result<Vec<String>> {
    let file = dir.join("dataset_dict.json");
    let meta = read_json(&file)?;
    let splits = meta
        .get("splits")
        .and_then(Value::as_array)
        .ok_or_else(|| layout_err(&file, "expected {\"splits\": [\"train\", ...]}"))?;
    splits
        .iter()
        .map(|s| {
            s.as_str()
                .map(str::to_string)
                .ok_or_else(|| layout_err(&file, "split names must be strings"))
        })
        .collect()
}

/// Loads one split of a `DatasetDict` directory; `None` is an error listing the splits.
pub(crate) fn read_dataset_dict(dir: &Path, split: Option<&str>) -> Result<Dataset> {
    let splits = read_splits(dir)?;
    let Some(split) = split else {
        return Err(DataError::SplitRequired {
            path: dir.to_path_buf(),
            splits,
        });
    };
    if !splits.iter().any(|s| s == split) {
        let suggestion = rlft_suggest::closest(split, &splits).map(str::to_string);
        return Err(DataError::UnknownSplit {
            path: dir.to_path_buf(),
            split: split.to_string(),
            splits,
            suggestion,
        });
    }
    read_dataset_dir(&dir.join(split))
}

/// The `_split` recorded in a `Dataset` directory's state.json (often null).
pub(crate) fn recorded_split(dir: &Path) -> Option<String> {
    let state = read_json(&dir.join("state.json")).ok()?;
    state.get("_split")?.as_str().map(str::to_string)
}

/// Loads a `Dataset` directory: every shard listed in `state.json`, in order.
pub(crate) fn read_dataset_dir(dir: &Path) -> Result<Dataset> {
    let state_path = dir.join("state.json");
    if !state_path.is_file() {
        return Err(layout_err(dir, "state.json is missing"));
    }
    let state = read_json(&state_path)?;
    let files = state
        .get("_data_files")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            layout_err(
                &state_path,
                "`_data_files` (a list of {\"filename\": ...}) is missing",
            )
        })?;
    let mut columns: Option<Vec<String>> = None;
    let mut rows = Vec::new();
    for entry in files {
        let name = entry
            .get("filename")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                layout_err(
                    &state_path,
                    "every `_data_files` entry needs a \"filename\"",
                )
            })?;
        if name.contains('/') || name.contains('\\') || name.contains("..") {
            return Err(layout_err(
                &state_path,
                format!("shard name {name:?} must be a plain file name"),
            ));
        }
        let shard = dir.join(name);
        let shard_columns = read_arrow_file(&shard, &mut rows)?;
        match &columns {
            None => columns = Some(shard_columns),
            Some(c) if *c != shard_columns => {
                return Err(layout_err(
                    &shard,
                    format!(
                        "its columns [{}] differ from the first shard's [{}]",
                        shard_columns.join(", "),
                        c.join(", ")
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(Dataset {
        columns: columns.unwrap_or_default(),
        rows,
        source: Some(dir.to_path_buf()),
    })
}

/// Appends the rows of one `.arrow` file (IPC stream, or IPC file format, detected by its
/// `ARROW1` magic) to `rows`; returns its column names.
pub fn read_arrow_file(path: &Path, rows: &mut Vec<Value>) -> Result<Vec<String>> {
    let decode = |e: ArrowError| DataError::Decode {
        path: path.to_path_buf(),
        message: format!("cannot read Arrow IPC data: {e}"),
    };
    let mut file = File::open(path).map_err(|e| DataError::io("cannot open", path, e))?;
    let mut magic = [0u8; 6];
    let is_file_format = file.read_exact(&mut magic).is_ok() && &magic == b"ARROW1";
    file.seek(SeekFrom::Start(0))
        .map_err(|e| DataError::io("cannot read", path, e))?;
    let (schema, batches): (
        _,
        Box<dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>>>,
    ) = if is_file_format {
        let reader = FileReader::try_new_buffered(file, None).map_err(decode)?;
        (reader.schema(), Box::new(reader))
    } else {
        let reader = StreamReader::try_new(BufReader::new(file), None).map_err(decode)?;
        (reader.schema(), Box::new(reader))
    };
    for batch in batches {
        append_batch(path, &batch.map_err(decode)?, rows)?;
    }
    Ok(schema.fields().iter().map(|f| f.name().clone()).collect())
}

/// Checks a split name the way `datasets` does (`^\w+(\.\w+)*$`).
fn check_split_name(dir: &Path, name: &str) -> Result<()> {
    let word = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_');
    if name.split('.').all(word) {
        Ok(())
    } else {
        Err(DataError::Write {
            path: dir.to_path_buf(),
            message: format!(
                "split name {name:?} must be letters, digits and '_' (dots between words allowed)"
            ),
        })
    }
}

/// Saves `splits` as a `DatasetDict` directory that `datasets.load_from_disk` reads, atomically
/// (written next to `dir`, then renamed; an existing dataset directory there is replaced).
///
/// Each split's Arrow schema is inferred from its rows (see the crate docs); one shard per split.
pub fn save_dataset_dict(dir: impl AsRef<Path>, splits: &[(&str, &Dataset)]) -> Result<()> {
    let dir = dir.as_ref();
    for (i, (name, _)) in splits.iter().enumerate() {
        check_split_name(dir, name)?;
        if splits[..i].iter().any(|(n, _)| n == name) {
            return Err(DataError::Write {
                path: dir.to_path_buf(),
                message: format!("split {name:?} given twice"),
            });
        }
    }
    atomic::write_dir(dir, |tmp| {
        for (name, dataset) in splits {
            let split_dir = tmp.join(name);
            fs::create_dir(&split_dir)
                .map_err(|e| DataError::io("cannot create directory", &split_dir, e))?;
            write_dataset_files(&split_dir, &dir.join(name), dataset, Some(name))?;
        }
        let names: Vec<&str> = splits.iter().map(|(n, _)| *n).collect();
        write_json(&tmp.join("dataset_dict.json"), &json!({"splits": names}))
    })
}

/// Saves one `Dataset` directory (no splits) that `datasets.load_from_disk` reads, atomically.
pub fn save_dataset(dir: impl AsRef<Path>, dataset: &Dataset) -> Result<()> {
    let dir = dir.as_ref();
    atomic::write_dir(dir, |tmp| write_dataset_files(tmp, dir, dataset, None))
}

/// Writes the shard, `dataset_info.json` and `state.json` of one dataset into `tmp`; `dest` is
/// the final location, for error messages.
fn write_dataset_files(
    tmp: &Path,
    dest: &Path,
    dataset: &Dataset,
    split: Option<&str>,
) -> Result<()> {
    let shard_dest: PathBuf = dest.join(SHARD);
    let (schema, batches) = dataset_batches(dataset, &shard_dest)?;
    let encode = |e: ArrowError| DataError::Write {
        path: shard_dest.clone(),
        message: e.to_string(),
    };
    let shard = tmp.join(SHARD);
    let file = File::create(&shard).map_err(|e| DataError::io("cannot create", &shard, e))?;
    let hashing = HashingWriter {
        inner: std::io::BufWriter::new(file),
        hasher: sha2::Sha256::new(),
    };
    let mut writer = StreamWriter::try_new(hashing, &schema).map_err(encode)?;
    for batch in &batches {
        writer.write(batch).map_err(encode)?;
    }
    writer.finish().map_err(encode)?;
    let hashing = writer.into_inner().map_err(encode)?;
    let digest = hashing.hasher.finalize();
    let file = hashing
        .inner
        .into_inner()
        .map_err(|e| DataError::io("cannot write", &shard, e.into_error()))?;
    file.sync_all()
        .map_err(|e| DataError::io("cannot write", &shard, e))?;

    let features = features_of(&schema).map_err(|message| DataError::Write {
        path: shard_dest.clone(),
        message,
    })?;
    let info = json!({
        "citation": "",
        "description": "",
        "features": features,
        "homepage": "",
        "license": "",
    });
    write_json(&tmp.join("dataset_info.json"), &info)?;
    // A content hash stands in for datasets' random/transform-chain fingerprint: 16 hex digits.
    let fingerprint: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let state = json!({
        "_data_files": [{"filename": SHARD}],
        "_fingerprint": fingerprint,
        "_format_columns": null,
        "_format_kwargs": {},
        "_format_type": null,
        "_output_all_columns": false,
        "_split": split,
    });
    write_json(&tmp.join("state.json"), &state)
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| DataError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    fs::write(path, text).map_err(|e| DataError::io("cannot write", path, e))
}
