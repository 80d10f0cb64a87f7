//! The in-memory [`Dataset`]: column names plus rows as JSON objects.

use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::error::{DataError, Result};

/// A table held in memory: every row is a JSON object with one key per column, in column order.
///
/// Nested Arrow data stays nested (`row["reward_model"]["ground_truth"]`); see the crate docs
/// for the exact Arrow -> JSON mapping. Readers fill absent top-level columns with `null`, so
/// every row has exactly the keys of `columns`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// Column names, in file order.
    pub columns: Vec<String>,
    /// Rows, each a JSON object keyed by `columns`.
    pub rows: Vec<Value>,
    /// The file or directory the rows were read from (`None` for in-memory data); used in
    /// error messages.
    pub source: Option<PathBuf>,
}

impl Dataset {
    /// A dataset from rows of JSON objects. Columns are the union of the rows' keys in order
    /// of first appearance; a row missing a column gets `null` there.
    ///
    /// Errors with [`DataError::NotAnObject`] naming the row if a row is not an object.
    pub fn from_rows(rows: Vec<Value>) -> Result<Self> {
        let columns = columns_of(
            rows.iter()
                .enumerate()
                .map(|(i, r)| (format!("row {i}"), r)),
        )?;
        let rows = normalize_rows(rows, &columns);
        Ok(Dataset {
            columns,
            rows,
            source: None,
        })
    }

    /// A dataset with the given columns and rows, as they are (no checks, no null filling).
    pub fn new(columns: Vec<String>, rows: Vec<Value>) -> Self {
        Dataset {
            columns,
            rows,
            source: None,
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The rows.
    pub fn iter(&self) -> std::slice::Iter<'_, Value> {
        self.rows.iter()
    }

    /// Whether a top-level column of that name exists.
    pub fn has_column(&self, name: &str) -> bool {
        self.columns.iter().any(|c| c == name)
    }

    /// The values of one top-level column (`null` where a row lacks it).
    pub fn column(&self, name: &str) -> Vec<&Value> {
        self.rows
            .iter()
            .map(|r| r.get(name).unwrap_or(&Value::Null))
            .collect()
    }

    /// A new dataset with the rows at `indices` (in that order; repeats allowed), same columns
    /// and source. Panics if an index is out of range.
    pub fn select(&self, indices: &[usize]) -> Dataset {
        Dataset {
            columns: self.columns.clone(),
            rows: indices.iter().map(|&i| self.rows[i].clone()).collect(),
            source: self.source.clone(),
        }
    }

    /// How error messages name this dataset: its path, or `(in memory)`.
    pub fn source_name(&self) -> String {
        match &self.source {
            Some(p) => p.display().to_string(),
            None => "(in memory)".to_string(),
        }
    }
}

impl<'a> IntoIterator for &'a Dataset {
    type Item = &'a Value;
    type IntoIter = std::slice::Iter<'a, Value>;
    fn into_iter(self) -> Self::IntoIter {
        self.rows.iter()
    }
}

/// The union of the rows' keys in order of first appearance; each row is `(location, value)`
/// where `location` names it in an error.
pub(crate) fn columns_of<'a>(
    rows: impl IntoIterator<Item = (String, &'a Value)>,
) -> Result<Vec<String>> {
    let mut columns: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (location, row) in rows {
        let obj = row.as_object().ok_or_else(|| DataError::NotAnObject {
            location,
            found: json_kind(row),
        })?;
        for key in obj.keys() {
            if !seen.contains(key.as_str()) {
                seen.insert(key.clone());
                columns.push(key.clone());
            }
        }
    }
    Ok(columns)
}

/// Rebuilds every row (all objects, checked by the caller) with exactly `columns` as keys, in
/// that order, filling absent ones with `null`.
pub(crate) fn normalize_rows(rows: Vec<Value>, columns: &[String]) -> Vec<Value> {
    rows.into_iter()
        .map(|row| {
            let Value::Object(mut obj) = row else {
                return row;
            };
            let in_order =
                obj.len() == columns.len() && obj.keys().zip(columns).all(|(a, b)| a == b);
            if in_order {
                return Value::Object(obj);
            }
            let mut out = Map::with_capacity(columns.len());
            for c in columns {
                out.insert(c.clone(), obj.remove(c).unwrap_or(Value::Null));
            }
            Value::Object(out)
        })
        .collect()
}

/// The JSON kind of a value, for error messages.
pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a float",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
