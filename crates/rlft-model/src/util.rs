//! Small file helpers: atomic writes.

use std::path::Path;

use crate::error::{ModelError, Result};

/// Writes `bytes` to `path` through a temporary file and a rename, so readers never see a
/// partial file and a failed write leaves the previous content intact.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).map_err(|e| ModelError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| ModelError::io(path, e))
}

/// Pretty-prints a JSON value to `path` atomically.
pub fn write_json_atomic(path: &Path, v: &serde_json::Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(v).expect("JSON values serialise");
    text.push('\n');
    write_atomic(path, text.as_bytes())
}
