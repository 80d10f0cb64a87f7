//! JSON Lines: one JSON object per line (blank lines skipped). A `.json` file whose first
//! non-blank character is `[` is read as one JSON array of objects instead.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

use serde_json::Value;

use crate::atomic;
use crate::dataset::{columns_of, json_kind, normalize_rows, Dataset};
use crate::error::{DataError, Result};

/// Reads a JSONL file (or a `.json` array). Errors name the file and the 1-based line.
pub fn read_jsonl(path: &Path) -> Result<Dataset> {
    let file = File::open(path).map_err(|e| DataError::io("cannot open", path, e))?;
    let mut reader = BufReader::new(file);
    let is_json_ext = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if is_json_ext
        && starts_with_bracket(&mut reader).map_err(|e| DataError::io("cannot read", path, e))?
    {
        return read_json_array(path, reader);
    }
    let mut rows = Vec::new();
    let mut buf = Vec::new();
    let mut line_no = 0usize;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| DataError::io("cannot read", path, e))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let mut line: &[u8] = &buf;
        if line_no == 1 {
            line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line); // UTF-8 BOM
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let value: Value = serde_json::from_slice(line).map_err(|e| DataError::JsonLine {
            path: path.to_path_buf(),
            line: line_no,
            message: e.to_string(),
        })?;
        if !value.is_object() {
            return Err(DataError::NotAnObject {
                location: format!("{}:{line_no}", path.display()),
                found: json_kind(&value),
            });
        }
        rows.push(value);
    }
    finish(path, rows)
}

/// Peeks (without consuming) whether the first non-whitespace byte is `[`.
fn starts_with_bracket(reader: &mut BufReader<File>) -> std::io::Result<bool> {
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(false);
        }
        let buf = buf.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(buf);
        match buf.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(i) => return Ok(buf[i] == b'['),
            None => {
                let len = reader.buffer().len();
                reader.consume(len);
            }
        }
    }
}

fn read_json_array(path: &Path, mut reader: BufReader<File>) -> Result<Dataset> {
    let mut text = String::new();
    reader
        .read_to_string(&mut text)
        .map_err(|e| DataError::io("cannot read", path, e))?;
    let value: Value = serde_json::from_str(text.trim_start_matches('\u{feff}')).map_err(|e| {
        DataError::JsonLine {
            path: path.to_path_buf(),
            line: e.line(),
            message: e.to_string(),
        }
    })?;
    let Value::Array(rows) = value else {
        return Err(DataError::NotAnObject {
            location: path.display().to_string(),
            found: json_kind(&value),
        });
    };
    for (i, row) in rows.iter().enumerate() {
        if !row.is_object() {
            return Err(DataError::NotAnObject {
                location: format!("{} (element {i})", path.display()),
                found: json_kind(row),
            });
        }
    }
    finish(path, rows)
}

fn finish(path: &Path, rows: Vec<Value>) -> Result<Dataset> {
    let columns = columns_of(rows.iter().map(|r| (String::new(), r)))?;
    let rows = normalize_rows(rows, &columns);
    Ok(Dataset {
        columns,
        rows,
        source: Some(path.to_path_buf()),
    })
}

/// Writes `dataset` as JSON Lines (UTF-8, one object per line, keys in column order),
/// atomically. Rows that are not objects are an error naming the row.
pub fn write_jsonl(path: impl AsRef<Path>, dataset: &Dataset) -> Result<()> {
    let path = path.as_ref();
    for (i, row) in dataset.rows.iter().enumerate() {
        if !row.is_object() {
            return Err(DataError::NotAnObject {
                location: format!("row {i}"),
                found: json_kind(row),
            });
        }
    }
    atomic::write_file(path, |w| {
        for row in &dataset.rows {
            serde_json::to_writer(&mut *w, row).map_err(|e| DataError::Write {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
            w.write_all(b"\n")
                .map_err(|e| DataError::io("cannot write", path, e))?;
        }
        Ok(())
    })
}
