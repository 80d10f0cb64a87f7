//! `run_summary.json`: config, wall time, peak memory, eval before/after, status.

use serde_json::json;

use super::{Metrics, RunSummary};
use crate::config::TrainerConfig;
use crate::error::{Result, TrainerError};

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
