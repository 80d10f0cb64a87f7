//! Reading a run directory: `metrics.jsonl`, `samples.jsonl`, `run_summary.json`, `config.toml`.
//!
//! Everything but `metrics.jsonl` is optional, and every reader is lenient: a report of a run in
//! progress (a torn last line, no summary yet) or of an older/newer trainer (unknown keys) still
//! renders, and what was skipped is listed in [`RunData::notes`].
//!
//! `rlft_train::metrics::read_metrics` is stricter on purpose (a resume must not build on a bad
//! log) and rejects non-numeric values; a report only wants what it can show, so it parses here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{io_err, ReportError};

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricRow {
    /// Optimizer step.
    pub step: u64,
    /// Every numeric value of the line but `step` (non-finite ones included), in logged order.
    pub values: Vec<(String, f64)>,
}

impl MetricRow {
    /// The value of `key`, if the line has it.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.values.iter().find(|(k, _)| k == key).map(|p| p.1)
    }
}

/// One line of `samples.jsonl`: a prompt, one completion and its rewards.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Optimizer step it was logged at.
    pub step: u64,
    /// `train` or `eval`.
    pub split: String,
    /// The prompt text.
    pub prompt: String,
    /// The completion text.
    pub completion: String,
    /// Total (weighted) reward.
    pub reward: f64,
    /// Per-function rewards and their parts (`fn`, `fn/part`), in logged order.
    pub rewards: Vec<(String, f64)>,
    /// Group-relative advantage (train samples).
    pub advantage: Option<f64>,
    /// Completion length in tokens.
    pub completion_tokens: Option<u64>,
    /// Whether generation stopped at `max_completion_length`.
    pub truncated: Option<bool>,
}

/// How a run ended, from `run_summary.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStatus {
    /// Trained to the end.
    Finished,
    /// Stopped early (Ctrl-C), with a checkpoint to resume from.
    Interrupted,
    /// No `run_summary.json` yet: the run is going on (or died without writing one).
    InProgress,
    /// A status this reader does not know.
    Other(String),
}

impl RunStatus {
    /// Short human label.
    pub fn label(&self) -> &str {
        match self {
            RunStatus::Finished => "finished",
            RunStatus::Interrupted => "interrupted",
            RunStatus::InProgress => "in progress",
            RunStatus::Other(s) => s,
        }
    }
}

/// Everything read from a run directory.
#[derive(Debug, Clone)]
pub struct RunData {
    /// The run directory.
    pub dir: PathBuf,
    /// `metrics.jsonl`, in file order (at least one row).
    pub metrics: Vec<MetricRow>,
    /// `samples.jsonl` (empty when absent).
    pub samples: Vec<Sample>,
    /// The run's config: `run_summary.json`'s `config`, else `config.toml` as JSON.
    pub config: Option<Value>,
    /// Model name or path.
    pub model: Option<String>,
    /// How the run ended.
    pub status: RunStatus,
    /// Training wall time in seconds (`run_summary.json`).
    pub wall_time_s: Option<f64>,
    /// Peak resident memory in MiB (`run_summary.json`).
    pub peak_rss_mib: Option<f64>,
    /// Last optimizer step (`run_summary.json`).
    pub global_step: Option<u64>,
    /// Eval metrics before training (`run_summary.json`).
    pub eval_initial: Option<BTreeMap<String, f64>>,
    /// Eval metrics after training (`run_summary.json`).
    pub eval_final: Option<BTreeMap<String, f64>>,
    /// What was missing or skipped while reading, for the reader of the report.
    pub notes: Vec<String>,
}

/// A JSON number, or one of the strings a metrics log writes for non-finite values.
pub(crate) fn json_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "NaN" | "nan" => Some(f64::NAN),
            "Infinity" | "inf" => Some(f64::INFINITY),
            "-Infinity" | "-inf" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

fn json_u64(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|x| *x >= 0.0 && x.fract() == 0.0)
            .map(|x| x as u64)
    })
}

/// Parses the JSON-lines text of `name`, calling `row` on each object. Unparsable lines are
/// skipped and summed up in a note (a torn last line, a run still writing, gets a gentler one).
fn read_jsonl<T>(
    name: &str,
    text: &str,
    notes: &mut Vec<String>,
    mut row: impl FnMut(&Map<String, Value>) -> Result<T, String>,
) -> (Vec<T>, Vec<String>) {
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    let n_lines = text.lines().count();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<Value>(line)
            .map_err(|e| e.to_string())
            .and_then(|v| match v {
                Value::Object(m) => row(&m),
                _ => Err("not a JSON object".into()),
            });
        match parsed {
            Ok(r) => out.push(r),
            Err(_) if i + 1 == n_lines && !text.ends_with('\n') => notes.push(format!(
                "{name}: the last line is incomplete (a run still writing?); skipped"
            )),
            Err(e) => bad.push(format!("line {}: {e}", i + 1)),
        }
    }
    if !bad.is_empty() {
        let shown: Vec<_> = bad.iter().take(3).cloned().collect();
        notes.push(format!(
            "{name}: {} unreadable line(s) skipped ({}{})",
            bad.len(),
            shown.join("; "),
            if bad.len() > 3 { "; ..." } else { "" }
        ));
    }
    (out, bad)
}

fn metric_row(m: &Map<String, Value>) -> Result<MetricRow, String> {
    let step = m
        .get("step")
        .and_then(json_u64)
        .ok_or("no integer `step`")?;
    let values = m
        .iter()
        .filter(|(k, _)| k.as_str() != "step")
        .filter_map(|(k, v)| json_f64(v).map(|x| (k.clone(), x)))
        .collect();
    Ok(MetricRow { step, values })
}

fn sample(m: &Map<String, Value>) -> Result<Sample, String> {
    let text = |k: &str| match m.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    let rewards = match m.get("rewards") {
        Some(Value::Object(r)) => r
            .iter()
            .filter_map(|(k, v)| json_f64(v).map(|x| (k.clone(), x)))
            .collect(),
        _ => Vec::new(),
    };
    Ok(Sample {
        step: m
            .get("step")
            .and_then(json_u64)
            .ok_or("no integer `step`")?,
        split: m
            .get("split")
            .and_then(Value::as_str)
            .unwrap_or("train")
            .to_owned(),
        prompt: text("prompt"),
        completion: text("completion"),
        reward: m.get("reward").and_then(json_f64).unwrap_or(f64::NAN),
        rewards,
        advantage: m.get("advantage").and_then(json_f64),
        completion_tokens: m.get("completion_tokens").and_then(json_u64),
        truncated: m.get("truncated").and_then(Value::as_bool),
    })
}

fn eval_map(v: Option<&Value>) -> Option<BTreeMap<String, f64>> {
    let Some(Value::Object(m)) = v else {
        return None;
    };
    Some(
        m.iter()
            .filter_map(|(k, v)| json_f64(v).map(|x| (k.clone(), x)))
            .collect(),
    )
}

/// Reads a file that may be absent: `Ok(None)` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, ReportError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", path)(e)),
    }
}

/// Reads a run directory. Fails only when `metrics.jsonl` is missing, empty or unreadable.
pub fn read_run(dir: &Path) -> Result<RunData, ReportError> {
    if !dir.is_dir() {
        return Err(ReportError::NotADirectory { dir: dir.into() });
    }
    let mut notes = Vec::new();
    let metrics_path = dir.join("metrics.jsonl");
    let Some(text) = read_optional(&metrics_path)? else {
        return Err(ReportError::MissingMetrics { dir: dir.into() });
    };
    let (metrics, bad) = read_jsonl("metrics.jsonl", &text, &mut notes, metric_row);
    if metrics.is_empty() {
        let detail = match bad.first() {
            Some(first) => format!(" ({} unreadable line(s); {first})", bad.len()),
            None if text.trim().is_empty() => " (the file is empty)".into(),
            None => " (only an incomplete line)".into(),
        };
        return Err(ReportError::EmptyMetrics {
            path: metrics_path,
            detail,
        });
    }

    let samples = match read_optional(&dir.join("samples.jsonl"))? {
        Some(t) => read_jsonl("samples.jsonl", &t, &mut notes, sample).0,
        None => {
            notes.push("no samples.jsonl: no rollout cases to show".into());
            Vec::new()
        }
    };

    let summary = match read_optional(&dir.join("run_summary.json"))? {
        Some(t) => match serde_json::from_str::<Value>(&t) {
            Ok(v @ Value::Object(_)) => Some(v),
            Ok(_) | Err(_) => {
                notes.push("run_summary.json is not a JSON object; ignored".into());
                None
            }
        },
        None => None,
    };
    let config_toml = match read_optional(&dir.join("config.toml"))? {
        Some(t) => match toml::from_str::<toml::Table>(&t) {
            Ok(table) => serde_json::to_value(table).ok(),
            Err(e) => {
                notes.push(format!("config.toml does not parse ({e}); ignored"));
                None
            }
        },
        None => None,
    };

    let s = summary.as_ref();
    let field = |k: &str| s.and_then(|s| s.get(k));
    let config = field("config")
        .filter(|c| c.is_object())
        .cloned()
        .or(config_toml);
    let model = field("model")
        .and_then(Value::as_str)
        .or_else(|| config.as_ref()?.get("model")?.as_str())
        .map(str::to_owned);
    let status = match (s, field("status").and_then(Value::as_str)) {
        (None, _) => RunStatus::InProgress,
        (Some(_), Some("finished")) => RunStatus::Finished,
        (Some(_), Some("interrupted")) => RunStatus::Interrupted,
        (Some(_), Some(other)) => RunStatus::Other(other.to_owned()),
        (Some(_), None) => RunStatus::Other("unknown".into()),
    };
    Ok(RunData {
        dir: dir.to_owned(),
        metrics,
        samples,
        model,
        status,
        wall_time_s: field("wall_time_s").and_then(json_f64),
        peak_rss_mib: field("peak_rss_mib").and_then(json_f64),
        global_step: field("global_step").and_then(json_u64),
        eval_initial: eval_map(field("eval_initial")),
        eval_final: eval_map(field("eval_final")),
        config,
        notes,
    })
}
