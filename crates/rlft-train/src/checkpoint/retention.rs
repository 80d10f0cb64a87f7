//! Which checkpoints exist, which is the latest complete one, and which to delete.

use std::io;
use std::path::{Path, PathBuf};

use super::{io_err, CheckpointError, Manifest, Result, FORMAT_VERSION, MANIFEST_FILE};

/// The name of the checkpoint directory of `step`.
pub fn checkpoint_dir_name(step: u64) -> String {
    format!("checkpoint-{step}")
}

/// The step of a `checkpoint-{step}` directory name (`None` for anything else).
pub fn parse_checkpoint_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("checkpoint-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Which checkpoints to delete after a save, as transformers' `save_total_limit` does: keep the
/// newest `keep_last`, where the `protect`ed (best) checkpoint, if present, takes the
/// second-newest slot; with `keep_last == 1` and a best that is not the newest, both are kept.
/// `None` keeps everything; `Some(0)` acts as `Some(1)` (the newest is never deleted).
/// Returns steps in ascending order.
pub fn checkpoints_to_delete(
    existing_steps: &[u64],
    keep_last: Option<usize>,
    protect: Option<u64>,
) -> Vec<u64> {
    let Some(limit) = keep_last else {
        return Vec::new();
    };
    let mut steps = existing_steps.to_vec();
    steps.sort_unstable();
    steps.dedup();
    let mut limit = limit.max(1);
    if let Some(pos) = protect.and_then(|p| steps.iter().position(|&s| s == p)) {
        let n = steps.len();
        if pos + 1 < n {
            let best = steps.remove(pos);
            steps.insert(n - 2, best);
            if limit == 1 {
                limit = 2;
            }
        }
    }
    let n_delete = steps.len().saturating_sub(limit);
    let mut out = steps[..n_delete].to_vec();
    out.sort_unstable();
    out
}

/// One `checkpoint-{step}` directory found by [`scan_checkpoints`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointEntry {
    /// Its step.
    pub step: u64,
    /// Its path.
    pub path: PathBuf,
    /// Why it cannot be resumed from (`None`: complete).
    pub problem: Option<String>,
}

/// The `checkpoint-{step}` directories of `output_dir`, ascending by step, each checked for a
/// valid manifest whose files exist with the recorded sizes (CRCs are checked on load).
/// Temporary `.checkpoint-*` directories are not listed.
pub fn scan_checkpoints(output_dir: &Path) -> Result<Vec<CheckpointEntry>> {
    if !output_dir.is_dir() {
        return Err(CheckpointError::NotFound(output_dir.to_owned()));
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(output_dir).map_err(io_err("list", output_dir))? {
        let entry = entry.map_err(io_err("list", output_dir))?;
        let Some(step) = entry
            .file_name()
            .to_str()
            .and_then(parse_checkpoint_dir_name)
        else {
            continue;
        };
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        let problem = read_manifest(&path)
            .and_then(|m| check_sizes(&path, &m))
            .err()
            .map(|e| e.to_string());
        out.push(CheckpointEntry {
            step,
            path,
            problem,
        });
    }
    out.sort_by_key(|e| e.step);
    Ok(out)
}

/// The newest complete checkpoint in `output_dir` (for `--resume`); `Ok(None)` if it has none.
/// Errors if `output_dir` does not exist.
pub fn latest_checkpoint(output_dir: &Path) -> Result<Option<PathBuf>> {
    let entries = scan_checkpoints(output_dir)?;
    Ok(entries
        .into_iter()
        .rev()
        .find(|e| e.problem.is_none())
        .map(|e| e.path))
}

pub(super) fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST_FILE);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(CheckpointError::Missing {
                dir: dir.to_owned(),
                file: MANIFEST_FILE.into(),
            })
        }
        Err(e) => return Err(io_err("read", &path)(e)),
    };
    let m: Manifest = serde_json::from_slice(&text).map_err(|e| CheckpointError::Corrupt {
        file: path.clone(),
        reason: e.to_string(),
    })?;
    if m.format_version > FORMAT_VERSION {
        let reason = format!(
            "format version {} is newer than this rlft's {FORMAT_VERSION}; upgrade rlft",
            m.format_version
        );
        return Err(CheckpointError::Corrupt { file: path, reason });
    }
    let name_step = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_checkpoint_dir_name);
    if name_step.is_some_and(|s| s != m.step) {
        let reason = format!(
            "it is for step {} but the directory is named for another step",
            m.step
        );
        return Err(CheckpointError::Corrupt { file: path, reason });
    }
    Ok(m)
}

pub(super) fn check_sizes(dir: &Path, m: &Manifest) -> Result<()> {
    for (name, entry) in &m.files {
        let path = dir.join(name);
        match std::fs::metadata(&path) {
            Ok(md) if md.len() == entry.bytes => {}
            Ok(md) => {
                let reason = format!("{} bytes, expected {}", md.len(), entry.bytes);
                return Err(CheckpointError::Corrupt { file: path, reason });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CheckpointError::Missing {
                    dir: dir.to_owned(),
                    file: name.clone(),
                })
            }
            Err(e) => return Err(io_err("stat", &path)(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_names() {
        assert_eq!(
            parse_checkpoint_dir_name(&checkpoint_dir_name(120)),
            Some(120)
        );
        for bad in [
            "checkpoint-",
            "checkpoint-1a",
            "checkpoint--1",
            "checkpoint-+1",
            ".checkpoint-3.tmp-9",
            "ckpt-3",
        ] {
            assert_eq!(parse_checkpoint_dir_name(bad), None, "{bad}");
        }
    }
}
