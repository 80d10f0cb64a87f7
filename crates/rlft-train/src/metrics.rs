//! Training metrics as JSON lines (`metrics.jsonl`), optionally mirrored to TensorBoard.
//!
//! One object per [`MetricsLogger::log`] call, written with a single `write` and no user-space
//! buffering, so a crash keeps every line already logged:
//!
//! ```json
//! {"step":10,"epoch":0.25,"wall_time":1714000000.5,"elapsed_s":12.75,"loss":0.5,"learning_rate":1e-5}
//! ```
//!
//! `step`, `epoch`, `wall_time` (Unix seconds) and `elapsed_s` (training seconds, continued
//! across resumes) come first, then the values in the order given. JSON has no NaN or infinity:
//! those are written as the strings `"NaN"`, `"Infinity"`, `"-Infinity"` (what Python's `json`
//! and pandas understand as such when read with `float(x)`), and [`read_metrics`] reads them
//! back as f64.
//!
//! Resume: [`MetricsLogger::resume`] keeps the lines with `step <= resume_step` (a crash after the
//! last checkpoint leaves later steps that will be logged again), drops a torn last line, rewrites
//! the file atomically and appends; with TensorBoard it starts a new event file with a
//! `SessionLog.START` at `resume_step + 1`, which makes TensorBoard drop the stale points too.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{Map, Number, Value};

use crate::checkpoint::io_hint;
use crate::tensorboard::{unix_time_now, EventFileError, EventWriter};

/// File name of the JSON lines log.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// Keys every line has; metric names may not use them.
pub const RESERVED_KEYS: [&str; 4] = ["step", "epoch", "wall_time", "elapsed_s"];

/// Errors of the metrics logger.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// An I/O operation failed.
    #[error("metrics: cannot {op} `{path}`: {source}{hint}", hint = io_hint(source))]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A metric name that cannot be logged.
    #[error("metrics: cannot log `{name}`: {reason}")]
    BadName {
        /// The name.
        name: String,
        /// Why, and the fix.
        reason: &'static str,
    },
    /// A line of an existing log is not what the logger writes.
    #[error(
        "metrics: `{path}` line {line} is not a metrics record ({reason}); move the file away to \
         start a fresh log, or fix the line"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// TensorBoard output failed.
    #[error(transparent)]
    TensorBoard(#[from] EventFileError),
}

type Result<T> = std::result::Result<T, MetricsError>;

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> MetricsError {
    let path = path.to_owned();
    move |source| MetricsError::Io { op, path, source }
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsRecord {
    /// Optimizer step.
    pub step: u64,
    /// Fractional epoch.
    pub epoch: f64,
    /// Unix seconds when logged.
    pub wall_time: f64,
    /// Training seconds so far (continued across resumes).
    pub elapsed_s: f64,
    /// The metrics, in logged order.
    pub values: Vec<(String, f64)>,
}

fn number(x: f64) -> Value {
    match Number::from_f64(x) {
        Some(n) => Value::Number(n),
        None if x.is_nan() => Value::String("NaN".into()),
        None if x > 0.0 => Value::String("Infinity".into()),
        None => Value::String("-Infinity".into()),
    }
}

fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

impl MetricsRecord {
    /// The JSON line (without the newline).
    pub fn to_json_line(&self) -> String {
        let mut m = Map::new();
        m.insert("step".into(), self.step.into());
        m.insert("epoch".into(), number(self.epoch));
        m.insert("wall_time".into(), number(self.wall_time));
        m.insert("elapsed_s".into(), number(self.elapsed_s));
        for (k, v) in &self.values {
            m.insert(k.clone(), number(*v));
        }
        Value::Object(m).to_string()
    }

    /// Parses a line written by [`MetricsRecord::to_json_line`].
    pub fn from_json_line(line: &str) -> std::result::Result<Self, String> {
        let v: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        let Value::Object(m) = v else {
            return Err("not a JSON object".into());
        };
        let step = m
            .get("step")
            .and_then(Value::as_u64)
            .ok_or("no integer `step`")?;
        let get = |k: &str| m.get(k).and_then(as_f64).ok_or(format!("no numeric `{k}`"));
        let (epoch, wall_time, elapsed_s) = (get("epoch")?, get("wall_time")?, get("elapsed_s")?);
        let mut values = Vec::new();
        for (k, v) in &m {
            if !RESERVED_KEYS.contains(&k.as_str()) {
                values.push((
                    k.clone(),
                    as_f64(v).ok_or(format!("`{k}` is not a number"))?,
                ));
            }
        }
        Ok(MetricsRecord {
            step,
            epoch,
            wall_time,
            elapsed_s,
            values,
        })
    }
}

/// Reads a `metrics.jsonl`. A torn last line (a crash mid-write) is skipped; any other bad
/// line is an error naming it.
pub fn read_metrics(path: &Path) -> Result<Vec<MetricsRecord>> {
    let text = std::fs::read_to_string(path).map_err(io_err("read", path))?;
    Ok(parse_lines(path, &text)?
        .into_iter()
        .map(|(_, r)| r)
        .collect())
}

/// Parsed records with their raw lines; a torn (unterminated, unparsable) last line is dropped.
fn parse_lines<'a>(path: &Path, text: &'a str) -> Result<Vec<(&'a str, MetricsRecord)>> {
    let mut out = Vec::new();
    let n_lines = text.lines().count();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match MetricsRecord::from_json_line(line) {
            Ok(r) => out.push((line, r)),
            Err(_) if i + 1 == n_lines && !text.ends_with('\n') => {}
            Err(reason) => {
                return Err(MetricsError::Corrupt {
                    path: path.to_owned(),
                    line: i + 1,
                    reason,
                })
            }
        }
    }
    Ok(out)
}

/// Writes `metrics.jsonl` (and optionally TensorBoard event files) in a run's output directory.
#[derive(Debug)]
pub struct MetricsLogger {
    path: PathBuf,
    file: File,
    tensorboard: Option<EventWriter>,
    started: Instant,
    elapsed_before: f64,
}

impl MetricsLogger {
    /// Starts a fresh log `dir/metrics.jsonl` (truncating an old one); with `tensorboard`, also
    /// event files in `dir/tensorboard/`.
    pub fn create(dir: &Path, tensorboard: bool) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
        let path = dir.join(METRICS_FILE);
        let file = File::create(&path).map_err(io_err("create", &path))?;
        let tensorboard = if tensorboard {
            Some(EventWriter::create(&dir.join("tensorboard"))?)
        } else {
            None
        };
        Ok(Self {
            path,
            file,
            tensorboard,
            started: Instant::now(),
            elapsed_before: 0.0,
        })
    }

    /// Continues the log of a run resumed from `resume_step`: drops lines with a larger step
    /// (and a torn last line), then appends. A missing log starts fresh.
    pub fn resume(dir: &Path, resume_step: u64, tensorboard: bool) -> Result<Self> {
        let path = dir.join(METRICS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(io_err("read", &path)(e)),
        };
        std::fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
        let kept: Vec<_> = parse_lines(&path, &text)?
            .into_iter()
            .filter(|(_, r)| r.step <= resume_step)
            .collect();
        let elapsed_before = kept.last().map_or(0.0, |(_, r)| r.elapsed_s);
        let mut body = String::with_capacity(text.len());
        for (line, _) in &kept {
            body.push_str(line);
            body.push('\n');
        }
        if body != text {
            let tmp = dir.join(format!(".{METRICS_FILE}.tmp-{}", std::process::id()));
            let write = || -> io::Result<()> {
                let mut f = File::create(&tmp)?;
                f.write_all(body.as_bytes())?;
                f.sync_all()?;
                std::fs::rename(&tmp, &path)
            };
            if let Err(e) = write() {
                let _ = std::fs::remove_file(&tmp);
                return Err(io_err("rewrite", &path)(e));
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err("open", &path))?;
        let tensorboard = if tensorboard {
            let mut w = EventWriter::create(&dir.join("tensorboard"))?;
            w.add_session_start(resume_step as i64 + 1)?;
            Some(w)
        } else {
            None
        };
        Ok(Self {
            path,
            file,
            tensorboard,
            started: Instant::now(),
            elapsed_before,
        })
    }

    /// The `metrics.jsonl` path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The TensorBoard event file, if any.
    pub fn tensorboard_path(&self) -> Option<&Path> {
        self.tensorboard.as_ref().map(EventWriter::path)
    }

    /// Training seconds so far (including those before a resume).
    pub fn elapsed_s(&self) -> f64 {
        self.elapsed_before + self.started.elapsed().as_secs_f64()
    }

    /// Logs `values` at `step` as one line (flushed to the OS before returning) and, with
    /// TensorBoard on, as scalars tagged by their names. Names must be non-empty, unique, and not
    /// one of [`RESERVED_KEYS`].
    pub fn log(&mut self, step: u64, epoch: f64, values: &[(&str, f64)]) -> Result<MetricsRecord> {
        for (i, (name, _)) in values.iter().enumerate() {
            let bad = |reason| {
                Err(MetricsError::BadName {
                    name: name.to_string(),
                    reason,
                })
            };
            if name.is_empty() {
                return bad("metric names must not be empty");
            }
            if RESERVED_KEYS.contains(name) {
                return bad(
                    "the name is reserved for the line's own fields; prefix it, e.g. `train/step`",
                );
            }
            if values[..i].iter().any(|(n, _)| n == name) {
                return bad("it appears twice in one call; log each metric once per step");
            }
        }
        let record = MetricsRecord {
            step,
            epoch,
            wall_time: unix_time_now(),
            elapsed_s: self.elapsed_s(),
            values: values.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        };
        let mut line = record.to_json_line();
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(io_err("write", &self.path))?;
        if let Some(tb) = &mut self.tensorboard {
            tb.add_scalars(step as i64, values)?;
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_f64_round_trips_exactly() {
        // A wall time that serde_json's fast float parser (without `float_roundtrip`) read back
        // one ulp off.
        let mut x = 1796072673.4322157f64;
        for i in 0..2000 {
            let r = MetricsRecord {
                step: i,
                epoch: x * 1e-9,
                wall_time: x,
                elapsed_s: 1.0 / (i as f64 + 3.0),
                values: vec![("v".into(), x.sin())],
            };
            assert_eq!(MetricsRecord::from_json_line(&r.to_json_line()).unwrap(), r);
            x += 0.001_234_567;
        }
    }

    #[test]
    fn non_finite_values_round_trip() {
        let r = MetricsRecord {
            step: 3,
            epoch: 0.5,
            wall_time: 1.0,
            elapsed_s: 2.0,
            values: vec![
                ("a".into(), f64::NAN),
                ("b".into(), f64::INFINITY),
                ("c".into(), -f64::INFINITY),
                ("d".into(), 1e-5),
            ],
        };
        let line = r.to_json_line();
        assert_eq!(
            line,
            r#"{"step":3,"epoch":0.5,"wall_time":1.0,"elapsed_s":2.0,"a":"NaN","b":"Infinity","c":"-Infinity","d":0.00001}"#
        );
        let back = MetricsRecord::from_json_line(&line).unwrap();
        assert!(back.values[0].1.is_nan());
        assert_eq!(back.values[1..], r.values[1..]);
    }
}
