//! Format detection and [`load_dataset`].

use std::path::Path;

use crate::dataset::Dataset;
use crate::error::{DataError, Result};
use crate::{hf, jsonl, parquet_io};

/// The on-disk formats [`load_dataset`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.jsonl` / `.json`: one JSON object per line (or a `.json` array of objects).
    Jsonl,
    /// `.parquet`.
    Parquet,
    /// A single `.arrow` file (IPC stream or file format).
    Arrow,
    /// A `Dataset.save_to_disk` directory (`state.json` + `.arrow` shards).
    HfDataset,
    /// A `DatasetDict.save_to_disk` directory (`dataset_dict.json` + one directory per split).
    HfDatasetDict,
}

/// Detects the format of `path` from its extension (files) or marker files (directories).
pub fn detect_format(path: &Path) -> Result<Format> {
    if !path.exists() {
        return Err(DataError::NotFound {
            path: path.to_path_buf(),
        });
    }
    if path.is_dir() {
        if path.join("dataset_dict.json").is_file() {
            return Ok(Format::HfDatasetDict);
        }
        if path.join("state.json").is_file() {
            return Ok(Format::HfDataset);
        }
        return Err(DataError::UnknownFormat {
            path: path.to_path_buf(),
            reason: "it is a directory without dataset_dict.json or state.json (for a folder of \
                     data files, pass the file itself)"
                .into(),
        });
    }
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "jsonl" | "json" | "ndjson" => Ok(Format::Jsonl),
        "parquet" => Ok(Format::Parquet),
        "arrow" => Ok(Format::Arrow),
        "" => Err(DataError::UnknownFormat {
            path: path.to_path_buf(),
            reason: "the file has no extension".into(),
        }),
        other => Err(DataError::UnknownFormat {
            path: path.to_path_buf(),
            reason: format!("extension .{other}"),
        }),
    }
}

/// Loads a dataset from a JSONL/JSON file, a Parquet file, an `.arrow` file, or a
/// `save_to_disk` directory (`Dataset` or `DatasetDict`).
///
/// `split` picks a split of a `DatasetDict` (required there: the error lists the splits;
/// trainers pass `"train"` by default). Single-split sources accept no split or `"train"`
/// (the name `datasets` gives a lone data file), and a `Dataset` directory also the split
/// name recorded in its `state.json`; any other split is an error rather than silently
/// returning the wrong rows.
pub fn load_dataset(path: impl AsRef<Path>, split: Option<&str>) -> Result<Dataset> {
    let path = path.as_ref();
    let format = detect_format(path)?;
    let recorded = match format {
        Format::HfDataset => hf::recorded_split(path),
        _ => None,
    };
    if format != Format::HfDatasetDict {
        if let Some(s) = split {
            if s != "train" && recorded.as_deref() != Some(s) {
                return Err(DataError::NoSuchSplit {
                    path: path.to_path_buf(),
                    split: s.to_string(),
                    recorded,
                });
            }
        }
    }
    match format {
        Format::Jsonl => jsonl::read_jsonl(path),
        Format::Parquet => parquet_io::read_parquet(path),
        Format::Arrow => {
            let mut rows = Vec::new();
            let columns = hf::read_arrow_file(path, &mut rows)?;
            Ok(Dataset {
                columns,
                rows,
                source: Some(path.to_path_buf()),
            })
        }
        Format::HfDataset => hf::read_dataset_dir(path),
        Format::HfDatasetDict => hf::read_dataset_dict(path, split),
    }
}

/// The splits of a `DatasetDict` directory, or `["train"]` for any single-split source.
pub fn list_splits(path: impl AsRef<Path>) -> Result<Vec<String>> {
    let path = path.as_ref();
    match detect_format(path)? {
        Format::HfDatasetDict => hf::read_splits(path),
        _ => Ok(vec!["train".to_string()]),
    }
}
