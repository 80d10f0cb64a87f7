//! What a run reports ([`RunSummary`]) and `run_summary.json`: config, wall time, peak
//! memory, eval before/after, status.

use serde_json::json;

use std::path::PathBuf;

use super::Metrics;
use crate::config::TrainerConfig;
use crate::error::{Result, TrainerError};

/// What a finished (or interrupted) run reports.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// Optimiser steps taken in total.
    pub global_step: u64,
    /// Eval metrics before training (None without eval data or when resuming).
    pub eval_initial: Option<Metrics>,
    /// Eval metrics at the end.
    pub eval_final: Option<Metrics>,
    /// Metrics of every step run in this process.
    pub steps: Vec<Metrics>,
    /// Steps skipped for a non-finite loss or gradient norm.
    pub skipped_steps: u64,
    /// Whether Ctrl-C stopped the run early.
    pub interrupted: bool,
    /// Where the final model (merged, with LoRA) was written.
    pub final_dir: Option<PathBuf>,
    /// Wall seconds of this process's training.
    pub wall_time_s: f64,
}

impl RunSummary {
    /// Eval metric `key` before training.
    pub fn initial_metric(&self, key: &str) -> Option<f64> {
        find(self.eval_initial.as_deref()?, key)
    }

    /// Eval metric `key` at the end.
    pub fn final_metric(&self, key: &str) -> Option<f64> {
        find(self.eval_final.as_deref()?, key)
    }

    /// Metric `key` of every step run in this process that logged it.
    pub fn step_values(&self, key: &str) -> Vec<f64> {
        self.steps.iter().filter_map(|m| find(m, key)).collect()
    }
}

pub(super) fn find(m: &[(String, f64)], key: &str) -> Option<f64> {
    m.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}

/// This process's peak resident memory (VmHWM), in MiB.
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
}

fn metrics_json(m: &Option<Metrics>) -> serde_json::Value {
    match m {
        Some(m) => {
            let mut o = serde_json::Map::new();
            for (k, v) in m {
                o.insert(k.clone(), json!(v));
            }
            serde_json::Value::Object(o)
        }
        None => serde_json::Value::Null,
    }
}

/// Writes `output_dir/run_summary.json` (atomically).
pub(super) fn write_run_summary<C: TrainerConfig>(
    cfg: &C,
    s: &RunSummary,
    finished: bool,
) -> Result<()> {
    let args = cfg.args();
    let v = json!({
        "config": serde_json::to_value(cfg).unwrap_or_default(),
        "model": args.model,
        "wall_time_s": s.wall_time_s,
        "peak_rss_mib": peak_rss_mib(),
        "global_step": s.global_step,
        "skipped_steps": s.skipped_steps,
        "eval_initial": metrics_json(&s.eval_initial),
        "eval_final": metrics_json(&s.eval_final),
        "status": if finished { "finished" } else { "interrupted" },
        "final_dir": s.final_dir,
    });
    let path = args.output_dir.join("run_summary.json");
    let tmp = args.output_dir.join(".run_summary.json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&v).unwrap_or_default())
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(TrainerError::io(&path))
}
