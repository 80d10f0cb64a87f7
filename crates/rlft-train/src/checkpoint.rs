//! Checkpoints: everything needed to resume a run exactly, written atomically.
//!
//! `{output_dir}/checkpoint-{step}/` holds:
//!
//! | file                        | what                                                             |
//! |-----------------------------|------------------------------------------------------------------|
//! | `model.safetensors`         | trainable weights (full fine-tuning), HF names                   |
//! | `adapter_model.safetensors` | ... or LoRA adapter weights, with `adapter_config.json` (PEFT)   |
//! | `optimizer.safetensors`     | optimizer tensors as the optimizer names them; its JSON state in the metadata key `rlft.optimizer_state` |
//! | `trainer_state.json`        | HF `Trainer`-like: `global_step`, `epoch`, `log_history`, `best_metric`, ...; rlft's own fields (scheduler step, data position) under `rlft` |
//! | `rng_state.json`            | the trainer's RNG states, opaque JSON                            |
//! | `rlft_checkpoint.json`      | written last: format version, step, size and CRC-32C of every other file |
//!
//! The completeness marker `rlft_checkpoint.json` is what makes a directory a checkpoint:
//! [`latest_checkpoint`] skips directories without a valid one, and [`load_checkpoint`] checks
//! every file's size and CRC against it, so a truncated or damaged file is named, never loaded.
//!
//! Atomicity: [`CheckpointManager::save`] writes into `.checkpoint-{step}.tmp-{pid}/`, fsyncs
//! each file and the directory, then renames it to `checkpoint-{step}` and fsyncs `output_dir`.
//! A failure at any point (disk full, permissions) removes the temporary directory, leaves every
//! earlier checkpoint untouched and returns an error naming the file and the fix. Re-saving an
//! existing step swaps the old directory aside (`.checkpoint-{step}.old-{pid}`) for the instant
//! between two renames; a crash right there leaves the previous checkpoints to resume from.
//!
//! Retention is a pure decision, [`checkpoints_to_delete`], with the semantics of transformers'
//! `save_total_limit`.
//!
//! `trainer_state.json` is for people and tools (`jq .log_history`); transformers'
//! `TrainerState.load_from_json` would reject its extra `rlft` key.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

mod files;
mod retention;

use files::{
    parse_json, parse_safetensors, read_checked, sync_dir, write_file, write_json,
    write_safetensors,
};
use retention::read_manifest;
pub use retention::{
    checkpoint_dir_name, checkpoints_to_delete, latest_checkpoint, parse_checkpoint_dir_name,
    scan_checkpoints, CheckpointEntry,
};

/// Full-model weights file.
pub const MODEL_FILE: &str = "model.safetensors";
/// LoRA adapter weights file (PEFT's name).
pub const ADAPTER_FILE: &str = "adapter_model.safetensors";
/// LoRA adapter config (PEFT's name).
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// Optimizer state file.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// HF-like trainer state.
pub const TRAINER_STATE_FILE: &str = "trainer_state.json";
/// Opaque RNG states.
pub const RNG_STATE_FILE: &str = "rng_state.json";
/// The completeness marker, written last.
pub const MANIFEST_FILE: &str = "rlft_checkpoint.json";
/// Version of the checkpoint layout in [`MANIFEST_FILE`].
pub const FORMAT_VERSION: u32 = 1;
/// Safetensors metadata key holding [`OptimizerState::state`] as JSON text.
pub const OPTIMIZER_STATE_KEY: &str = "rlft.optimizer_state";

/// Errors saving, finding or loading checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// An I/O operation failed.
    #[error("cannot {op} `{path}`: {source}{hint}", hint = io_hint(source))]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Saving failed; nothing changed in `output_dir` except the removed partial copy.
    #[error(
        "saving checkpoint-{step} in `{output_dir}` failed; earlier checkpoints are untouched and \
         the partial copy was removed: {source}"
    )]
    Save {
        /// The step being saved.
        step: u64,
        /// The output directory.
        output_dir: PathBuf,
        /// What went wrong.
        source: Box<CheckpointError>,
    },
    /// The path is not there.
    #[error(
        "no checkpoint at `{0}`: pass a `checkpoint-N` directory written by rlft (or, to resume the \
         latest, the run's output directory)"
    )]
    NotFound(PathBuf),
    /// A file the checkpoint needs is missing.
    #[error(
        "checkpoint `{dir}` is incomplete: `{file}` is missing; it was interrupted while saving or \
         copied partially: resume from another checkpoint (`latest_checkpoint` skips incomplete \
         ones) or delete it"
    )]
    Missing {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The missing file's name.
        file: String,
    },
    /// A file is damaged or not what rlft wrote.
    #[error(
        "checkpoint file `{file}` is corrupt: {reason}; it changed after it was saved (disk error, \
         partial copy, edit): resume from another checkpoint"
    )]
    Corrupt {
        /// The damaged file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The data given to save cannot be saved.
    #[error("cannot save checkpoint: {0}")]
    Invalid(String),
    /// Tensor backend errors (device copies).
    #[error("checkpoint tensors in `{file}`: {source}")]
    Tensor {
        /// The file being written or read.
        file: PathBuf,
        /// The backend error.
        source: candle_core::Error,
    },
}

type Result<T> = std::result::Result<T, CheckpointError>;

/// A sentence that tells how to fix common I/O errors ("" for others); starts with "; ".
pub(crate) fn io_hint(e: &io::Error) -> &'static str {
    match (e.kind(), e.raw_os_error()) {
        (io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded, _) | (_, Some(28 | 122)) => {
            "; the disk is full (or over quota): free space, keep fewer checkpoints (keep_last), \
             or write to a larger disk"
        }
        (io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem, _) => {
            "; the directory is not writable by this user: fix its permissions or choose another"
        }
        _ => "",
    }
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CheckpointError {
    let path = path.to_owned();
    move |source| CheckpointError::Io { op, path, source }
}

/// The trainable weights: all of them, or a LoRA adapter with its config.
#[derive(Debug, Clone)]
pub struct Weights {
    /// Named tensors (HF names), saved in this order.
    pub tensors: Vec<(String, Tensor)>,
    /// `Some(config)`: a LoRA adapter, saved as `adapter_model.safetensors` plus
    /// `adapter_config.json`; `None`: `model.safetensors`.
    pub adapter_config: Option<Value>,
}

/// Optimizer state: tensors named by the optimizer (e.g. [`crate::AdamW::state_tensors`]'s
/// `state.{i}.exp_avg`, or `{param}.exp_avg`) and any JSON (step counters, hyperparameters).
#[derive(Debug, Clone)]
pub struct OptimizerState {
    /// Named state tensors, saved in this order.
    pub tensors: Vec<(String, Tensor)>,
    /// Free-form state; stored in the safetensors metadata under [`OPTIMIZER_STATE_KEY`].
    pub state: Value,
}

/// Where the data loader stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    /// Epochs completed.
    pub epoch: u64,
    /// Index of the next example in this epoch's shuffled order.
    pub index: u64,
}

/// rlft's own resume fields, under `rlft` in `trainer_state.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RlftState {
    /// Steps the LR scheduler has taken.
    pub scheduler_step: u64,
    /// Data loader position.
    pub data_position: DataPosition,
    /// Anything else the trainer wants back on resume.
    #[serde(default)]
    pub extra: Map<String, Value>,
}

/// `trainer_state.json`: transformers' `TrainerState` fields rlft uses, plus [`RlftState`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps taken; the checkpoint is `checkpoint-{global_step}`.
    pub global_step: u64,
    /// Fractional epoch (`2.5` = half-way through the third epoch).
    pub epoch: f64,
    /// Total optimizer steps of the run.
    pub max_steps: Option<u64>,
    /// Epochs of the run.
    pub num_train_epochs: Option<f64>,
    /// Log every N steps.
    pub logging_steps: Option<u64>,
    /// Evaluate every N steps.
    pub eval_steps: Option<u64>,
    /// Save every N steps.
    pub save_steps: Option<u64>,
    /// Per-device batch size.
    pub train_batch_size: Option<u64>,
    /// Tokens consumed so far.
    #[serde(default)]
    pub num_input_tokens_seen: u64,
    /// One dict per logging event (`{"loss": .., "learning_rate": .., "step": .., "epoch": ..}`).
    #[serde(default)]
    pub log_history: Vec<Map<String, Value>>,
    /// Best value of the metric chosen for model selection.
    pub best_metric: Option<f64>,
    /// Step of the best checkpoint (protected from deletion).
    pub best_global_step: Option<u64>,
    /// Path of the best checkpoint.
    pub best_model_checkpoint: Option<String>,
    /// rlft's own fields.
    #[serde(default)]
    pub rlft: RlftState,
}

/// Everything a checkpoint holds.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Trainable weights.
    pub weights: Weights,
    /// Optimizer state (`None` to save weights only).
    pub optimizer: Option<OptimizerState>,
    /// Step, epoch, history, scheduler and data position.
    pub trainer_state: TrainerState,
    /// The trainer's RNG states.
    pub rng_state: Value,
}

/// Size and CRC-32C of one file, as recorded in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Length in bytes.
    pub bytes: u64,
    /// CRC-32C of the contents.
    pub crc32c: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format_version: u32,
    step: u64,
    files: BTreeMap<String, FileEntry>,
}

/// Writes every file of `ckpt` into the (empty) directory `dir`, the manifest last.
fn write_all_files(dir: &Path, ckpt: &Checkpoint, budget: Option<&Cell<u64>>) -> Result<u64> {
    let mut files = BTreeMap::new();
    let st_meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let w = &ckpt.weights;
    let weights_name = if w.adapter_config.is_some() {
        ADAPTER_FILE
    } else {
        MODEL_FILE
    };
    let path = dir.join(weights_name);
    let e = write_file(dir, weights_name, budget, |o| {
        write_safetensors(o, &path, &w.tensors, st_meta.clone())
    })?;
    files.insert(weights_name.to_string(), e);
    if let Some(cfg) = &w.adapter_config {
        files.insert(
            ADAPTER_CONFIG_FILE.into(),
            write_file(dir, ADAPTER_CONFIG_FILE, budget, |o| write_json(o, cfg))?,
        );
    }
    if let Some(opt) = &ckpt.optimizer {
        let mut meta = st_meta.clone();
        meta.insert(OPTIMIZER_STATE_KEY.into(), opt.state.to_string());
        let path = dir.join(OPTIMIZER_FILE);
        let e = write_file(dir, OPTIMIZER_FILE, budget, |o| {
            write_safetensors(o, &path, &opt.tensors, meta)
        })?;
        files.insert(OPTIMIZER_FILE.into(), e);
    }
    let ts = &ckpt.trainer_state;
    files.insert(
        TRAINER_STATE_FILE.into(),
        write_file(dir, TRAINER_STATE_FILE, budget, |o| write_json(o, ts))?,
    );
    let rng = &ckpt.rng_state;
    files.insert(
        RNG_STATE_FILE.into(),
        write_file(dir, RNG_STATE_FILE, budget, |o| write_json(o, rng))?,
    );
    let total = files.values().map(|e| e.bytes).sum();
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        step: ts.global_step,
        files,
    };
    write_file(dir, MANIFEST_FILE, budget, |o| write_json(o, &manifest))?;
    sync_dir(dir)?;
    Ok(total)
}

/// What [`CheckpointManager::save`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedCheckpoint {
    /// The new checkpoint directory.
    pub path: PathBuf,
    /// Its step.
    pub step: u64,
    /// Bytes written (all files but the manifest).
    pub bytes: u64,
    /// Steps of the older checkpoints deleted by the retention policy.
    pub deleted: Vec<u64>,
    /// Checkpoints the policy wanted deleted but could not be, with the reason.
    pub not_deleted: Vec<(u64, String)>,
}

/// Steps deleted, and steps that could not be deleted with the reason.
type Rotation = (Vec<u64>, Vec<(u64, String)>);

/// Saves checkpoints into an output directory and applies the keep-last-N policy.
#[derive(Debug, Clone)]
pub struct CheckpointManager {
    output_dir: PathBuf,
    keep_last: Option<usize>,
    disk_budget: Option<u64>,
}

impl CheckpointManager {
    /// Checkpoints go to `output_dir/checkpoint-{step}`; all are kept.
    pub fn new(output_dir: impl Into<PathBuf>) -> Self {
        Self {
            output_dir: output_dir.into(),
            keep_last: None,
            disk_budget: None,
        }
    }

    /// Keep only the newest `n` checkpoints (plus the best, see [`checkpoints_to_delete`]);
    /// `None` keeps all (transformers' `save_total_limit`).
    pub fn keep_last(mut self, n: Option<usize>) -> Self {
        self.keep_last = n;
        self
    }

    /// Test hook: every save behaves as if the disk filled up after `bytes` bytes.
    #[doc(hidden)]
    pub fn simulate_disk_full_after(mut self, bytes: u64) -> Self {
        self.disk_budget = Some(bytes);
        self
    }

    /// The output directory.
    pub fn output_dir(&self) -> &Path {
        &self.output_dir
    }

    /// Writes `checkpoint-{global_step}` atomically (replacing one of the same step), then
    /// deletes what the retention policy says, protecting `best_global_step` and the new one.
    pub fn save(&self, ckpt: &Checkpoint) -> Result<SavedCheckpoint> {
        let step = ckpt.trainer_state.global_step;
        let fail = |source| CheckpointError::Save {
            step,
            output_dir: self.output_dir.clone(),
            source: Box::new(source),
        };
        let out = &self.output_dir;
        std::fs::create_dir_all(out).map_err(|e| fail(io_err("create directory", out)(e)))?;
        remove_stale_temp_dirs(out);
        let pid = std::process::id();
        let tmp = out.join(format!(".checkpoint-{step}.tmp-{pid}"));
        if tmp.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            std::fs::remove_dir_all(&tmp).map_err(|e| fail(io_err("remove stale", &tmp)(e)))?;
        }
        std::fs::create_dir(&tmp).map_err(|e| fail(io_err("create directory", &tmp)(e)))?;
        let budget = self.disk_budget.map(Cell::new);
        let bytes = match write_all_files(&tmp, ckpt, budget.as_ref()) {
            Ok(b) => b,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(fail(e));
            }
        };
        let dest = out.join(checkpoint_dir_name(step));
        if let Err(e) = replace_dir(&tmp, &dest, out, step, pid) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(fail(e));
        }
        sync_dir(out).map_err(fail)?;
        let (deleted, not_deleted) = self.rotate(step, ckpt.trainer_state.best_global_step)?;
        Ok(SavedCheckpoint {
            path: dest,
            step,
            bytes,
            deleted,
            not_deleted,
        })
    }

    fn rotate(&self, saved: u64, best: Option<u64>) -> Result<Rotation> {
        if self.keep_last.is_none() {
            return Ok((Vec::new(), Vec::new()));
        }
        let entries = scan_checkpoints(&self.output_dir)?;
        let steps: Vec<u64> = entries.iter().map(|e| e.step).collect();
        let (mut deleted, mut failed) = (Vec::new(), Vec::new());
        for step in checkpoints_to_delete(&steps, self.keep_last, best) {
            if step == saved {
                continue; // a newer stale checkpoint exists; never delete what was just saved
            }
            let path = self.output_dir.join(checkpoint_dir_name(step));
            match std::fs::remove_dir_all(&path) {
                Ok(()) => deleted.push(step),
                Err(e) => failed.push((step, format!("cannot delete `{}`: {e}", path.display()))),
            }
        }
        Ok((deleted, failed))
    }
}

/// Renames `tmp` to `dest`; an existing `dest` is swapped aside first and removed after.
fn replace_dir(tmp: &Path, dest: &Path, out: &Path, step: u64, pid: u32) -> Result<()> {
    if dest.symlink_metadata().is_err() {
        return std::fs::rename(tmp, dest).map_err(io_err("rename into place", dest));
    }
    let old = out.join(format!(".checkpoint-{step}.old-{pid}"));
    std::fs::rename(dest, &old).map_err(io_err("move aside", dest))?;
    if let Err(e) = std::fs::rename(tmp, dest) {
        let _ = std::fs::rename(&old, dest);
        return Err(io_err("rename into place", dest)(e));
    }
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// Removes `.checkpoint-*.tmp-{pid}` / `.old-{pid}` directories left by processes that are no
/// longer running (Linux only: elsewhere liveness is unknown and nothing is removed).
fn remove_stale_temp_dirs(out: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(out) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(".checkpoint-") {
            continue;
        }
        let pid = name
            .rsplit_once(".tmp-")
            .or_else(|| name.rsplit_once(".old-"))
            .map(|(_, p)| p);
        let Some(pid) = pid.and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
            && entry.path().is_dir()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Saves `ckpt` under `output_dir` keeping every checkpoint (see [`CheckpointManager`]).
pub fn save_checkpoint(output_dir: &Path, ckpt: &Checkpoint) -> Result<SavedCheckpoint> {
    CheckpointManager::new(output_dir).save(ckpt)
}

/// Loads a checkpoint directory written by [`CheckpointManager::save`], tensors on `device`,
/// after checking every file against the manifest. Errors name the missing or damaged file.
pub fn load_checkpoint(dir: &Path, device: &Device) -> Result<Checkpoint> {
    if !dir.is_dir() {
        return Err(CheckpointError::NotFound(dir.to_owned()));
    }
    let m = read_manifest(dir)?;
    let weights = if m.files.contains_key(ADAPTER_FILE) {
        let (tensors, _) = parse_safetensors(
            &dir.join(ADAPTER_FILE),
            &read_checked(dir, &m, ADAPTER_FILE)?,
            device,
        )?;
        let config = parse_json(
            dir,
            ADAPTER_CONFIG_FILE,
            &read_checked(dir, &m, ADAPTER_CONFIG_FILE)?,
        )?;
        Weights {
            tensors,
            adapter_config: Some(config),
        }
    } else {
        let (tensors, _) = parse_safetensors(
            &dir.join(MODEL_FILE),
            &read_checked(dir, &m, MODEL_FILE)?,
            device,
        )?;
        Weights {
            tensors,
            adapter_config: None,
        }
    };
    let optimizer = if m.files.contains_key(OPTIMIZER_FILE) {
        let file = dir.join(OPTIMIZER_FILE);
        let (tensors, meta) =
            parse_safetensors(&file, &read_checked(dir, &m, OPTIMIZER_FILE)?, device)?;
        let state = match meta.get(OPTIMIZER_STATE_KEY) {
            Some(text) => serde_json::from_str(text).map_err(|e| CheckpointError::Corrupt {
                file: file.clone(),
                reason: format!("metadata `{OPTIMIZER_STATE_KEY}`: {e}"),
            })?,
            None => Value::Null,
        };
        Some(OptimizerState { tensors, state })
    } else {
        None
    };
    let trainer_state: TrainerState = parse_json(
        dir,
        TRAINER_STATE_FILE,
        &read_checked(dir, &m, TRAINER_STATE_FILE)?,
    )?;
    if trainer_state.global_step != m.step {
        let reason = format!(
            "global_step {} but the manifest says step {}",
            trainer_state.global_step, m.step
        );
        return Err(CheckpointError::Corrupt {
            file: dir.join(TRAINER_STATE_FILE),
            reason,
        });
    }
    let rng_state = parse_json(dir, RNG_STATE_FILE, &read_checked(dir, &m, RNG_STATE_FILE)?)?;
    Ok(Checkpoint {
        weights,
        optimizer,
        trainer_state,
        rng_state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_hints() {
        assert!(io_hint(&io::Error::from_raw_os_error(28)).contains("disk is full"));
        assert!(io_hint(&io::Error::new(io::ErrorKind::StorageFull, "x")).contains("disk is full"));
        assert!(
            io_hint(&io::Error::new(io::ErrorKind::PermissionDenied, "x")).contains("permissions")
        );
        assert_eq!(io_hint(&io::Error::other("x")), "");
    }
}
