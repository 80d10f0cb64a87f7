//! Atomic writes: everything is written under a temporary name next to the destination and
//! renamed into place, so a reader never sees a half-written file or directory and a failed
//! write leaves the old contents untouched.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{DataError, Result};

/// A sibling of `dest` named `.{name}.{tag}-{pid}-{n}`, unique within this process.
fn sibling(dest: &Path, tag: &str) -> Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = dest.file_name().ok_or_else(|| DataError::Write {
        path: dest.to_path_buf(),
        message: "the destination has no file name".into(),
    })?;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = format!(
        ".{}.{tag}-{}-{n}",
        name.to_string_lossy(),
        std::process::id()
    );
    Ok(dest.with_file_name(tmp))
}

fn create_parent(dest: &Path) -> Result<()> {
    match dest.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => fs::create_dir_all(parent)
            .map_err(|e| DataError::io("cannot create directory", parent, e)),
        _ => Ok(()),
    }
}

/// Writes a file through `write`, then renames it onto `dest` (replacing any old file).
pub(crate) fn write_file(
    dest: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    create_parent(dest)?;
    let tmp = sibling(dest, "tmp")?;
    let result = (|| {
        let file = File::create(&tmp).map_err(|e| DataError::io("cannot create", &tmp, e))?;
        let mut w = BufWriter::new(file);
        write(&mut w)?;
        let file = w
            .into_inner()
            .map_err(|e| DataError::io("cannot write", &tmp, e.into_error()))?;
        file.sync_all()
            .map_err(|e| DataError::io("cannot write", &tmp, e))?;
        fs::rename(&tmp, dest)
            .map_err(|e| DataError::io("cannot rename a temporary file onto", dest, e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Fills a fresh temporary directory through `fill`, then moves it to `dest`.
///
/// An existing `dest` is replaced only if it is an empty directory or a dataset directory
/// (it holds `dataset_dict.json` or `state.json`); anything else is an error, so a mistyped
/// output path never deletes unrelated files.
pub(crate) fn write_dir(dest: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if dest.exists() {
        check_replaceable(dest)?;
    }
    create_parent(dest)?;
    let tmp = sibling(dest, "tmp")?;
    fs::create_dir(&tmp).map_err(|e| DataError::io("cannot create directory", &tmp, e))?;
    let result = fill(&tmp).and_then(|()| swap_in(&tmp, dest));
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result
}

fn check_replaceable(dest: &Path) -> Result<()> {
    let refuse = |why: &str| DataError::Write {
        path: dest.to_path_buf(),
        message: format!("{why}; choose another output path or remove it first"),
    };
    if !dest.is_dir() {
        return Err(refuse("it exists and is not a directory"));
    }
    let is_dataset = dest.join("dataset_dict.json").is_file() || dest.join("state.json").is_file();
    let is_empty = fs::read_dir(dest)
        .map_err(|e| DataError::io("cannot read", dest, e))?
        .next()
        .is_none();
    if !is_dataset && !is_empty {
        return Err(refuse(
            "it is a non-empty directory that is not a saved dataset",
        ));
    }
    Ok(())
}

/// Moves `tmp` to `dest`; an old `dest` is moved aside first and deleted after, or put back if
/// the move fails.
fn swap_in(tmp: &Path, dest: &Path) -> Result<()> {
    if !dest.exists() {
        return fs::rename(tmp, dest)
            .map_err(|e| DataError::io("cannot move the new dataset to", dest, e));
    }
    let old = sibling(dest, "old")?;
    fs::rename(dest, &old).map_err(|e| DataError::io("cannot move aside the old", dest, e))?;
    if let Err(e) = fs::rename(tmp, dest) {
        let _ = fs::rename(&old, dest);
        return Err(DataError::io("cannot move the new dataset to", dest, e));
    }
    let _ = fs::remove_dir_all(&old);
    Ok(())
}

/// A writer that also feeds every byte to SHA-256 (for `_fingerprint`).
pub(crate) struct HashingWriter<W> {
    pub(crate) inner: W,
    pub(crate) hasher: sha2::Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        sha2::Digest::update(&mut self.hasher, &buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
