//! Reward functions for rlft's GRPO trainer: text in, one score per completion out.
//!
//! Rewards see the *completion text only* (never the prompt and completion joined: the prompt of
//! the seed example itself contains `\boxed{answer}`), plus the dataset row the prompt came from,
//! the completion's token count and ids and whether generation was cut at `max_completion_length`;
//! the trainers tell them where training stands ([`TrainerState`]) for TRL-style `python` rewards.
//!
//! ```
//! use rlft_rewards::{RewardSet, RewardSpec, Sample};
//!
//! let specs: Vec<RewardSpec> = vec![
//!     serde_json::from_value(serde_json::json!({"type": "python_expr_rule"}))?,
//!     serde_json::from_value(serde_json::json!({
//!         "type": "overlong", "max_completion_length": 128, "buffer": 32, "weight": 0.5
//!     }))?,
//! ];
//! let mut set = RewardSet::new(&specs, None)?;
//! let row = serde_json::json!({"reward_model": {"ground_truth": "26"}});
//! let batch = [Sample {
//!     prompt: "Compute (13 * 2)...",
//!     completion: "\\boxed{26}",
//!     row: &row,
//!     completion_ids: &[],
//!     completion_tokens: 7,
//!     truncated: false,
//!     environment_reward: None,
//! }];
//! let scores = set.score(&batch)?;
//! assert_eq!(scores.total, vec![1.0]); // 1.0 * python_expr_rule + 0.5 * overlong (0 here)
//! assert_eq!(scores.per_function[0].part("format"), Some(&[1.0][..]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Reward specs
//!
//! A trainer config holds a list of reward specs. In TOML, one `[[rewards]]` table each. Every
//! spec takes these keys, plus the keys of its `type`:
//!
//! - `type`: which reward function (below);
//! - `name`: how logs and metrics call it (default: the `type`; two rewards of one type need
//!   distinct names);
//! - `weight`: its weight in the total (default 1.0; TRL's `reward_weights` can override them all);
//! - `on_error`: the score every sample of a batch gets when the function fails or times out
//!   (default: none, the error stops training). Failures are counted per function.
//!
//! The total of a sample is the weighted sum of its scores, where a function that returns "not
//! applicable" (`None`) counts as 0 (TRL's `nansum`).
//!
//! ## `python_expr_rule`: the seed example's reward
//!
//! `0.1 * format + 0.9 * accuracy`, exactly as LightRFT's `tiny_python_expr` computes it (see
//! [`rules::python_expr_rule`]); parts `format` and `accuracy`.
//!
//! ```toml
//! [[rewards]]
//! type = "python_expr_rule"
//! answer_field = "reward_model.ground_truth"   # dotted path of the ground truth (default)
//! ```
//!
//! ## `boxed_accuracy`
//!
//! 1.0 when the first `\boxed{...}` of the completion, normalised like the seed's rule (`26.0`,
//! `$26$`, `26.` all read `26`), equals the normalised ground truth; else 0.0.
//!
//! ```toml
//! [[rewards]]
//! type = "boxed_accuracy"
//! answer_field = "answer"                      # dotted path in the row (default "answer")
//! ```
//!
//! ## `strict_format`, `regex_format`, `incremental_format`
//!
//! ```toml
//! [[rewards]]
//! type = "strict_format"                       # 1.0 if the regex matches the WHOLE completion
//! pattern = '<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n?'
//!
//! [[rewards]]
//! type = "regex_format"                        # 1.0 if the regex matches anywhere
//! pattern = '\\boxed\{[^{}]+\}'
//!
//! [[rewards]]
//! type = "incremental_format"                  # per_tag for each tag present exactly once,
//! tags = ["<reasoning>\n", "\n</reasoning>\n", "\n<answer>\n", "\n</answer>"]
//! per_tag = 0.125                              # minus trailing_penalty per character after
//! trailing_penalty = 0.001                    # the last tag
//! ```
//!
//! In both regex kinds `.` also matches a newline (write `(?-s)` to turn that off).
//!
//! ## `length`, `overlong`, `repetition`
//!
//! ```toml
//! [[rewards]]
//! type = "length"                              # 0 within target +- tolerance tokens, falling
//! target = 64                                  # linearly to max_penalty at |len - target| =
//! tolerance = 16                               # tolerance + target
//! max_penalty = -1.0
//!
//! [[rewards]]
//! type = "overlong"                            # DAPO's soft overlong punishment
//! max_completion_length = 128
//! buffer = 32
//!
//! [[rewards]]
//! type = "repetition"                          # open-r1's repetition penalty
//! ngram = 3
//! max_penalty = -1.0
//! ```
//!
//! ## `command` and `http`: rewards written in any language
//!
//! ```toml
//! [[rewards]]
//! type = "command"
//! command = ["python3", "my_reward.py"]        # started once, kept running
//! timeout_s = 30.0                             # per batch; on timeout the process is killed
//! batch = false                                # one JSON line per sample (true: one per batch)
//! on_error = 0.0
//!
//! [[rewards]]
//! type = "http"
//! url = "http://127.0.0.1:8000/score"          # plain http only (no TLS dependency)
//! timeout_s = 30.0
//! ```
//!
//! Each sample travels as the JSON object
//! `{"prompt": "...", "completion": "...", "row": {...}, "completion_tokens": 7, "truncated": false}`.
//!
//! - `command`, `batch = false`: rlft writes one such object per line, one line per sample, and
//!   reads one line per sample, in order: a JSON number, `null` (not applicable), or
//!   `{"score": x}` / `{"score": x, "parts": {"format": 1.0}}`.
//! - `command`, `batch = true`: rlft writes one line `{"samples": [...]}` per batch and reads one
//!   line `{"scores": [...]}` holding one such answer per sample.
//! - `http`: rlft POSTs `{"samples": [...]}` and expects `{"scores": [...]}`.
//!
//! Blank lines are skipped; anything else is a protocol error quoting the line. The process
//! should exit when its stdin closes; stderr is captured and its last lines quoted in errors. See
//! `docs/rewards.md` for a complete Python example of each.
//!
//! ## `python`: a reward function written for TRL
//!
//! `def accuracy_reward(completions, ground_truth, **kwargs) -> list[float | None]`, called with
//! TRL's keyword arguments (`prompts`, `completions`, `completion_ids`, `trainer_state`, every
//! other dataset column) by a worker process rlft starts once ([`external::python`]).
//!
//! ```toml
//! [[rewards]]
//! type = "python"
//! path = "rewards.py"                          # relative to the working directory
//! function = "accuracy_reward"
//! timeout_s = 30.0                             # per batch; on timeout the worker is killed
//! python = "python3"                           # the interpreter (default)
//! ```
//!
//! ## `model`: a reward model
//!
//! A reward model's score of prompt + completion (a trained `rlft reward-model`, or any HF
//! `*ForSequenceClassification` directory with one label). This crate holds no model: it parses
//! the spec, and the trainers (crate `rlft`, `reward_model::reward`) load the model once and
//! score each batch with it; see `docs/reward-model.md`.
//!
//! ```toml
//! [[rewards]]
//! type = "model"
//! path = "artifacts/rm/final"                  # or artifacts/rm/adapter (a PEFT SEQ_CLS adapter)
//! # base = "default"                           # an adapter's base (default: its adapter_config)
//! batch_size = 8                               # sequences per forward pass
//! max_length = 0                               # keep the last N tokens of longer ones (0: all)
//! weight = 1.0
//! ```
//!
//! ## `environment`: an environment's reward
//!
//! The sum of the rewards an `[environment]` gave at the steps of the sample's episode
//! (`None`, counted as 0, where it gave none); see `docs/tools.md`. No keys of its own.
//!
//! ```toml
//! [[rewards]]
//! type = "environment"
//! ```
//!
//! # Writing your own in Rust
//!
//! Implement [`Reward`] and add it to a [`RewardSet`] with [`RewardSet::push`].

#![warn(missing_docs)]

use serde::Serialize;

mod error;
pub mod external;
pub mod format;
pub mod http_client;
pub mod normalize;
pub mod rules;
mod set;
mod spec;

pub use error::RewardError;
pub use set::{RewardSet, Scores};
pub use spec::{
    build_reward, BoxedAccuracySpec, CommandSpec, HttpSpec, IncrementalFormatSpec, LengthSpec,
    ModelSpec, OverlongSpec, PythonExprRuleSpec, PythonSpec, RegexFormatSpec, RepetitionSpec,
    RewardKind, RewardSpec, StrictFormatSpec,
};

/// One completion to score.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    /// The prompt as the model saw it (after the chat template). Rule rewards ignore it; external
    /// ones receive it.
    pub prompt: &'a str,
    /// The generated text only.
    pub completion: &'a str,
    /// The dataset row the prompt came from (a JSON object), e.g. holding the ground truth.
    pub row: &'a serde_json::Value,
    /// The generated token ids (an ending eos included), as TRL's `completion_ids`; empty where
    /// the caller has no ids (`rlft reward test` scores text).
    pub completion_ids: &'a [u32],
    /// Number of generated tokens.
    pub completion_tokens: usize,
    /// True when generation stopped at `max_completion_length` instead of an end token.
    pub truncated: bool,
    /// The `[environment]`'s reward of the episode (the sum of its steps' rewards); `None`
    /// without an environment or when no step gave one. The `environment` reward reads it.
    pub environment_reward: Option<f64>,
}

/// Scores of one reward function over a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RewardOutput {
    /// One score per sample; `None` means "not applicable" (counted as 0 in the total).
    pub scores: Vec<Option<f64>>,
    /// Optional named components, one value per sample, e.g. `("format", ..)`, `("accuracy", ..)`,
    /// for logging. External rewards fill NaN where a sample's answer lacked a part.
    pub parts: Vec<(String, Vec<f64>)>,
}

impl RewardOutput {
    /// An output where every sample has a score and there are no parts.
    pub fn from_scores(scores: Vec<f64>) -> Self {
        RewardOutput {
            scores: scores.into_iter().map(Some).collect(),
            parts: Vec::new(),
        }
    }

    /// The values of the part called `name`, if there is one.
    pub fn part(&self, name: &str) -> Option<&[f64]> {
        self.parts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Where training stands when a batch is scored: the fields of transformers' `TrainerState`
/// that TRL hands reward functions as `trainer_state` (curriculum rewards read them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TrainerState {
    /// Optimiser steps taken so far (0 outside training).
    pub global_step: u64,
    /// Optimiser steps of the whole run (0 outside training).
    pub max_steps: u64,
    /// Fractional epochs done.
    pub epoch: f64,
}

/// A reward function: scores a batch of completions.
///
/// `score` takes `&mut self` so that functions may keep state (an external process, a cache).
pub trait Reward: Send {
    /// The name logs and metrics use.
    fn name(&self) -> &str;
    /// One score per sample of `batch`, in order.
    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError>;
    /// Tells the function where training stands; the trainers call it (through
    /// [`RewardSet::set_trainer_state`]) before each rollout and eval. Functions that do not
    /// read it ignore it, which is the default.
    fn set_trainer_state(&mut self, state: TrainerState) {
        let _ = state;
    }
}
