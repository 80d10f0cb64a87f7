//! `type = "python"`: a Python reward function with TRL's signature,
//! `def reward(completions, **kwargs) -> list[float | None]`, run by a long-lived worker.
//!
//! rlft starts `python -u -c <python_worker.py> PATH FUNCTION` once (through the same
//! `Process` machinery as `command`: deadline per batch, process-group kill, stderr tail,
//! restart after a failure) and sends it one JSON line per batch; the worker calls the function
//! with the keyword arguments TRL's `GRPOTrainer._calculate_rewards` passes (`prompts`,
//! `completions`, `completion_ids`, `trainer_state`, every other dataset column) and answers
//! `{"scores": [...]}` or an error with its traceback. No Python runs inside rlft.
//!
//! A Python exception or a wrong return value leaves the worker running (its module state, e.g.
//! a loaded verifier, survives); a timeout, crash or load error kills it and the next batch
//! starts a fresh one.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::command::Process;
use super::parse_scores_body;
use crate::error::excerpt;
use crate::spec::PythonSpec;
use crate::{Reward, RewardError, RewardOutput, Sample, TrainerState};

/// The worker's source, passed with `-c` (no file to write, clean up or keep in sync).
const WORKER: &str = include_str!("python_worker.py");

/// The `python` reward.
pub struct PythonReward {
    name: String,
    /// As the config wrote them, for messages.
    path: String,
    function: String,
    python: String,
    state: TrainerState,
    /// Batches sent so far, to say which one failed.
    batches: u64,
    process: Process,
}

/// One batch as the worker reads it.
#[derive(Serialize)]
struct Request<'a> {
    trainer_state: TrainerState,
    samples: Vec<WireSample<'a>>,
}

#[derive(Serialize)]
struct WireSample<'a> {
    prompt: &'a str,
    completion: &'a str,
    completion_ids: &'a [u32],
    row: &'a Value,
}

/// A failed batch, and whether the worker is still sound: it answered with an error (the
/// function raised or returned garbage), so it can take the next batch with its module state.
struct Failed {
    error: RewardError,
    worker_sound: bool,
}

impl From<RewardError> for Failed {
    fn from(error: RewardError) -> Self {
        Failed {
            error,
            worker_sound: false,
        }
    }
}

/// The worker's `{"error": {...}}` answer.
#[derive(Deserialize)]
struct Failure {
    kind: FailureKind,
    message: String,
    traceback: Option<String>,
}

/// What failed, as `python_worker.py` names it.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum FailureKind {
    /// No such file or function: a config mistake.
    Missing,
    /// Importing the file raised.
    Import,
    /// The function raised.
    Exception,
    /// The function returned something unusable.
    Output,
}

impl PythonReward {
    /// Validates the spec and checks that the file exists; the worker starts on the first batch.
    pub fn new(name: String, spec: &PythonSpec) -> Result<Self, RewardError> {
        let bad = |message: String| Err(RewardError::config(&name, message));
        if spec.function.trim().is_empty() {
            return bad(
                "`function` is empty; give the name of the reward function in `path`, e.g. \
                 function = \"accuracy_reward\""
                    .into(),
            );
        }
        if spec.python.trim().is_empty() {
            return bad(
                "`python` is empty; give the interpreter, e.g. \"python3\" or \".venv/bin/python\""
                    .into(),
            );
        }
        let file = Path::new(&spec.path);
        if !file.is_file() {
            let cwd = std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_else(|_| "?".into());
            return bad(format!(
                "`path` {} is not a file; give the .py file that defines `{}` (a relative path \
                 is read from the working directory, {cwd})",
                spec.path, spec.function
            ));
        }
        // The worker gets an absolute path: the file stays found whatever it does with its cwd.
        let absolute = std::path::absolute(file)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| spec.path.clone());
        let argv = vec![
            spec.python.clone(),
            "-u".into(),
            "-c".into(),
            WORKER.into(),
            absolute,
            spec.function.clone(),
        ];
        let shown = format!(
            "`{}` (rlft's worker calling `{}` from {})",
            spec.python, spec.function, spec.path
        );
        Ok(PythonReward {
            process: Process::new(name.clone(), argv, shown, "python", spec.timeout_s)?,
            name,
            path: spec.path.clone(),
            function: spec.function.clone(),
            python: spec.python.clone(),
            state: TrainerState::default(),
            batches: 0,
        })
    }

    fn try_score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, Failed> {
        let n = batch.len();
        self.batches += 1;
        let request = Request {
            trainer_state: self.state,
            samples: batch
                .iter()
                .map(|s| WireSample {
                    prompt: s.prompt,
                    completion: s.completion,
                    completion_ids: s.completion_ids,
                    row: s.row,
                })
                .collect(),
        };
        let mut payload = serde_json::to_vec(&request).expect("JSON values serialise");
        payload.push(b'\n');
        let deadline = self.process.send(payload, n)?;
        let line = self.process.next_line(deadline, 0, n)?;
        let failure = serde_json::from_str::<Value>(&line)
            .ok()
            .and_then(|v| v.get("error").cloned())
            .map(serde_json::from_value::<Failure>);
        match failure {
            None => Ok(parse_scores_body(&line, n).map_err(|e| self.process.protocol(e))?),
            Some(Ok(failure)) => Err(Failed {
                worker_sound: matches!(failure.kind, FailureKind::Exception | FailureKind::Output),
                error: self.failed(failure, batch),
            }),
            Some(Err(e)) => Err(self
                .process
                .protocol(format!(
                    "the worker's error answer is malformed ({e}): `{}`",
                    excerpt(&line, 300)
                ))
                .into()),
        }
    }

    /// The error for a worker's `{"error": ...}` answer about `batch`.
    fn failed(&self, f: Failure, batch: &[Sample<'_>]) -> RewardError {
        let reward = self.name.clone();
        let function = format!("`{}` ({})", self.function, self.path);
        let traceback = f
            .traceback
            .map(|t| format!(":\n  {}", t.replace('\n', "\n  ")))
            .unwrap_or_default();
        match f.kind {
            FailureKind::Exception => RewardError::Python {
                reward,
                message: format!(
                    "{function} {} on {}{traceback}",
                    f.message,
                    self.which_batch(batch)
                ),
            },
            FailureKind::Output => RewardError::Output {
                reward,
                message: format!("{function}, on {}, {}", self.which_batch(batch), f.message),
            },
            FailureKind::Import => {
                let hint = if traceback.contains("ModuleNotFoundError") {
                    format!(
                        "; the worker runs `{}`: install the module for it, or set `python` to \
                         the interpreter that has it (e.g. \".venv/bin/python\")",
                        self.python
                    )
                } else {
                    String::new()
                };
                RewardError::Python {
                    reward,
                    message: format!("{}{hint}{traceback}", f.message),
                }
            }
            FailureKind::Missing => RewardError::config(&reward, f.message),
        }
    }

    /// "batch 3 (8 completions, global_step 2; first prompt: `...`)": which batch failed.
    fn which_batch(&self, batch: &[Sample<'_>]) -> String {
        let first = batch.first().map_or_else(String::new, |s| {
            let prompt = match s.row.get("prompt") {
                Some(Value::String(p)) => p.clone(),
                Some(other) => other.to_string(),
                None => s.prompt.to_string(),
            };
            format!("; first prompt: `{}`", excerpt(&prompt, 160))
        });
        format!(
            "batch {} ({} completions, global_step {}{first})",
            self.batches,
            batch.len(),
            self.state.global_step
        )
    }
}

impl Reward for PythonReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        if batch.is_empty() {
            return Ok(RewardOutput::default());
        }
        self.try_score(batch).map_err(|failed| {
            if !failed.worker_sound {
                // A fresh worker next batch: after a load error it imports the file afresh (it
                // may have been fixed), after a protocol error it starts clean.
                self.process.reset();
            }
            failed.error
        })
    }

    fn set_trainer_state(&mut self, state: TrainerState) {
        self.state = state;
    }
}
