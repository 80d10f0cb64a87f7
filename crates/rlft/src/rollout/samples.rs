//! `samples.jsonl`: completions with their rewards, written every `logging_steps` (and at each
//! eval), so a run can be read as text, not just curves.
//!
//! One object per line: `{"step", "split", "prompt", "completion", "reward", "rewards": {"<fn>":
//! x, "<fn>/<part>": y}, "advantage", "completion_tokens", "truncated"}` (`reward` is `null` for
//! a completion no reward function scored), and `"transcript"` (tool answers included) after
//! `"completion"` (the model's own turns) when the completion called tools. On resume the lines
//! past the checkpoint's step are dropped (they will be written again).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use rlft_rewards::Scores;
use serde_json::{Map, Value};

use super::eval::sample_reward_parts;
use super::Sample;
use crate::data::prompts::PromptItem;

/// File name of the samples log.
pub const SAMPLES_FILE: &str = "samples.jsonl";

/// Appends sample lines.
pub struct SampleLog {
    path: PathBuf,
    file: File,
}

fn num(v: f64) -> Value {
    serde_json::Number::from_f64(v)
        .map(Value::Number)
        .unwrap_or_else(|| Value::String(format!("{v}")))
}

/// One logged completion.
pub struct LoggedSample<'a> {
    /// "train" or "eval".
    pub split: &'a str,
    /// Rendered prompt.
    pub prompt: &'a str,
    /// Completion text (what the rewards scored: the model's own turns).
    pub completion: &'a str,
    /// With tools or an environment: the whole completion, tool answers and observations
    /// included.
    pub transcript: Option<&'a str>,
    /// Weighted total reward; `None` (written as `null`) when no function scored it.
    pub reward: Option<f64>,
    /// Per-function scores and parts.
    pub rewards: Vec<(String, f64)>,
    /// Advantage (training only).
    pub advantage: Option<f64>,
    /// Completion length in tokens.
    pub completion_tokens: usize,
    /// Hit max_completion_length.
    pub truncated: bool,
}

/// The samples.jsonl lines of completions `picks` (indices into `samples`, those past its end
/// left out) of a scored batch of prompts `items`; `advantages` for training rollouts.
pub fn pick<'a>(
    split: &'a str,
    items: &'a [PromptItem],
    samples: &'a [Sample],
    scored: (&[String], &Scores),
    advantages: Option<&[f64]>,
    picks: impl IntoIterator<Item = usize>,
) -> Vec<LoggedSample<'a>> {
    let (names, scores) = scored;
    picks
        .into_iter()
        .filter(|&i| i < samples.len())
        .map(|i| {
            let s = &samples[i];
            LoggedSample {
                split,
                prompt: &s.prompt_item(items).text,
                completion: &s.text,
                transcript: s.turns.as_ref().map(|t| t.transcript.as_str()),
                reward: scores.is_scored(i).then_some(scores.total[i]),
                rewards: sample_reward_parts(names, scores, i),
                advantage: advantages.map(|a| a[i]),
                completion_tokens: s.completion_ids.len(),
                truncated: s.truncated,
            }
        })
        .collect()
}

impl SampleLog {
    /// Starts a new log in `dir` (replacing an old one), or with `resume_step` keeps the lines
    /// with `step <= resume_step`.
    pub fn open(dir: &Path, resume_step: Option<u64>) -> std::io::Result<Self> {
        let path = dir.join(SAMPLES_FILE);
        let kept = match resume_step {
            Some(step) => std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    serde_json::from_str::<Value>(l)
                        .ok()
                        .and_then(|v| v.get("step").and_then(Value::as_u64))
                        .is_some_and(|s| s <= step)
                })
                .map(|l| format!("{l}\n"))
                .collect::<String>(),
            None => String::new(),
        };
        let tmp = dir.join(format!(".{SAMPLES_FILE}.tmp"));
        std::fs::write(&tmp, kept.as_bytes())?;
        std::fs::rename(&tmp, &path)?;
        let file = OpenOptions::new().append(true).open(&path)?;
        Ok(SampleLog { path, file })
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends samples of `step` (one write per call).
    pub fn write(&mut self, step: u64, samples: &[LoggedSample<'_>]) -> std::io::Result<()> {
        let mut buf = String::new();
        for s in samples {
            let mut o = Map::new();
            o.insert("step".into(), Value::from(step));
            o.insert("split".into(), Value::from(s.split));
            o.insert("prompt".into(), Value::from(s.prompt));
            o.insert("completion".into(), Value::from(s.completion));
            if let Some(t) = s.transcript {
                o.insert("transcript".into(), Value::from(t));
            }
            o.insert("reward".into(), s.reward.map_or(Value::Null, num));
            let mut r = Map::new();
            for (k, v) in &s.rewards {
                r.insert(k.clone(), num(*v));
            }
            o.insert("rewards".into(), Value::Object(r));
            if let Some(a) = s.advantage {
                o.insert("advantage".into(), num(a));
            }
            o.insert("completion_tokens".into(), Value::from(s.completion_tokens));
            o.insert("truncated".into(), Value::from(s.truncated));
            buf.push_str(&Value::Object(o).to_string());
            buf.push('\n');
        }
        self.file.write_all(buf.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_keeps_earlier_steps() {
        let dir = tempfile::tempdir().unwrap();
        let s = |c: &'static str| LoggedSample {
            split: "train",
            prompt: "p",
            completion: c,
            transcript: None,
            reward: (c != "a").then_some(f64::NAN),
            rewards: vec![("acc".into(), 1.0)],
            advantage: Some(0.5),
            completion_tokens: 3,
            truncated: false,
        };
        let mut log = SampleLog::open(dir.path(), None).unwrap();
        log.write(1, &[s("a")]).unwrap();
        log.write(2, &[s("b")]).unwrap();
        drop(log);
        let mut log = SampleLog::open(dir.path(), Some(1)).unwrap();
        log.write(2, &[s("c")]).unwrap();
        let text = std::fs::read_to_string(log.path()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["completion"], "c");
        assert_eq!(lines[0]["reward"], Value::Null);
        assert_eq!(lines[1]["reward"], "NaN");
    }
}
