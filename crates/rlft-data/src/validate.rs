//! Checks trainers run before they start: the dataset has rows and the columns they read, and
//! dotted access into nested rows (`reward_model.ground_truth`).

use serde_json::Value;

use crate::dataset::{json_kind, Dataset};
use crate::error::{DataError, Result};

/// Errors unless `dataset` has at least one row and every column in `required`.
///
/// A missing column's error lists the columns that exist and, when one is close (edit distance,
/// case-insensitive), suggests it: `dataset train.jsonl has no column "prompt"; its columns are
/// [promt, answer]; did you mean "promt"?`.
pub fn require_columns(dataset: &Dataset, required: &[&str]) -> Result<()> {
    require_non_empty(dataset)?;
    for &column in required {
        if !dataset.has_column(column) {
            return Err(DataError::MissingColumn {
                source_name: dataset.source_name(),
                column: column.to_string(),
                columns: dataset.columns.clone(),
                suggestion: rlft_suggest::closest(column, &dataset.columns).map(str::to_string),
            });
        }
    }
    Ok(())
}

/// Errors with [`DataError::EmptyDataset`] (naming the file) when `dataset` has no rows.
pub fn require_non_empty(dataset: &Dataset) -> Result<()> {
    if dataset.is_empty() {
        return Err(DataError::EmptyDataset {
            source_name: dataset.source_name(),
        });
    }
    Ok(())
}

/// The value at a dotted `path` in `row`, or `None`.
///
/// Segments walk into objects by key and into arrays by index (`messages.0.content`). A key
/// that itself contains dots (a column named `reward_model.ground_truth` after a flatten) is
/// matched whole before the path is split.
pub fn get_path<'a>(row: &'a Value, path: &str) -> Option<&'a Value> {
    walk(row, path).ok()
}

/// Like [`get_path`], but the error says which segment failed and what was there.
/// `context` names the row in the message (`"row 12 of train.jsonl"`).
pub fn lookup<'a>(row: &'a Value, path: &str, context: &str) -> Result<&'a Value> {
    walk(row, path).map_err(|reason| DataError::MissingPath {
        context: context.to_string(),
        path: path.to_string(),
        reason,
    })
}

fn walk<'a>(mut current: &'a Value, path: &str) -> std::result::Result<&'a Value, String> {
    let mut rest = path;
    let mut walked = String::new();
    loop {
        if let Some(v) = current.as_object().and_then(|o| o.get(rest)) {
            return Ok(v);
        }
        let (segment, tail) = match rest.split_once('.') {
            Some((s, t)) => (s, Some(t)),
            None => (rest, None),
        };
        let next = match current {
            Value::Object(obj) => obj.get(segment).ok_or_else(|| {
                let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
                let at = if walked.is_empty() {
                    "the row".to_string()
                } else {
                    format!("{walked:?}")
                };
                format!("{at} has no key {segment:?} (keys: [{}])", keys.join(", "))
            })?,
            Value::Array(items) => {
                let index: usize = segment.parse().map_err(|_| {
                    format!("{walked:?} is an array; index it with a number, not {segment:?}")
                })?;
                items.get(index).ok_or_else(|| {
                    format!("{walked:?} has {} items, no index {index}", items.len())
                })?
            }
            other => return Err(format!("{walked:?} is {}, not an object", json_kind(other))),
        };
        if !walked.is_empty() {
            walked.push('.');
        }
        walked.push_str(segment);
        match tail {
            Some(t) => {
                current = next;
                rest = t;
            }
            None => return Ok(next),
        }
    }
}
