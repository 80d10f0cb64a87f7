//! The online config's batch arithmetic, and LightRFT's / OpenRLHF's names as aliases.
//!
//! Batch arithmetic (TRL's, spelled out):
//! - a *train batch* is `per_device_train_batch_size x gradient_accumulation_steps` completions:
//!   one optimiser step;
//! - a *rollout* (TRL's generation batch) is `generation_batch_size` completions, by default one
//!   train batch; it holds `generation_batch_size / num_generations` prompts with
//!   `num_generations` completions each, and must be a whole number of train batches;
//! - each rollout is used for `generation_batch_size / train batch x num_iterations` optimiser
//!   steps (policy log-probs of the rollout time are kept as "old" log-probs when that is > 1).
//!
//! LightRFT aliases: `rollout_batch_size` (prompts per rollout) sets `generation_batch_size =
//! rollout_batch_size x num_generations`; `n_samples_per_prompt` = `num_generations`;
//! `train_batch_size` (completions per optimiser step) sets `gradient_accumulation_steps =
//! train_batch_size / per_device_train_batch_size`; `micro_train_batch_size` =
//! `per_device_train_batch_size`; `init_kl_coef` = `beta`; `prompt_max_len` /
//! `generate_max_len` = `max_prompt_length` / `max_completion_length`; `actor_learning_rate` =
//! `learning_rate`; `num_episodes` = `num_train_epochs`; `max_epochs` = `num_iterations`.

use serde::Serialize;

use super::{servers, OnlineConfig, ONLINE_ALIASES};
use crate::config::ConfigError;

/// LightRFT / OpenRLHF names accepted as aliases: (alias, canonical key, meaning).
pub const ALIASES: &[(&str, &str, &str)] = &[
    (
        "n_samples_per_prompt",
        "num_generations",
        "completions per prompt",
    ),
    (
        "micro_train_batch_size",
        "per_device_train_batch_size",
        "completions per micro-batch",
    ),
    ("init_kl_coef", "beta", "KL coefficient"),
    ("prompt_max_len", "max_prompt_length", "prompt tokens"),
    ("generate_max_len", "max_completion_length", "new tokens"),
    ("actor_learning_rate", "learning_rate", "learning rate"),
    (
        "num_episodes",
        "num_train_epochs",
        "passes over the prompts",
    ),
    ("max_epochs", "num_iterations", "passes over each rollout"),
    ("eps_clip", "epsilon", "clip range"),
    ("advantage_clamp", "advantage_clip", "advantage clamp"),
];

/// Aliases whose value converts: (alias, what it sets).
pub(super) const DERIVED_ALIASES: &[&str] =
    &["rollout_batch_size", "train_batch_size", "num_mini_batches"];

/// The derived batch arithmetic of a config, printed at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BatchPlan {
    /// Completions per optimiser step (per_device x accumulation).
    pub train_batch: usize,
    /// Completions per rollout.
    pub rollout_completions: usize,
    /// Prompts per rollout.
    pub rollout_prompts: usize,
    /// Optimiser steps per rollout (train batches per rollout x num_iterations).
    pub steps_per_rollout: usize,
    /// Rollouts in the run.
    pub rollouts: usize,
    /// Optimiser steps in the run.
    pub total_steps: usize,
}

impl std::fmt::Display for BatchPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "batch plan: {} prompts x {} completions = {} completions per rollout; {} \
             completions per optimiser step; {} optimiser step(s) per rollout; {} rollouts = {} \
             optimiser steps",
            self.rollout_prompts,
            self.rollout_completions / self.rollout_prompts.max(1),
            self.rollout_completions,
            self.train_batch,
            self.steps_per_rollout,
            self.rollouts,
            self.total_steps
        )
    }
}

/// Rewrites every alias of `table` into its canonical key (TRL's server keys, LightRFT's and
/// OpenRLHF's names, the batch sizes that convert).
pub(super) fn resolve_aliases(table: &mut toml::Table) -> Result<(), ConfigError> {
    servers::resolve_trl_keys(table)?;
    for (alias, key, _) in ALIASES.iter().chain(ONLINE_ALIASES) {
        if let Some(v) = table.remove(*alias) {
            if table.contains_key(*key) {
                return Err(ConfigError::Invalid(format!(
                    "both `{alias}` and `{key}` are set; `{alias}` is an alias of `{key}`, keep one"
                )));
            }
            table.insert(key.to_string(), v);
        }
    }
    // `advantage_estimator = "rloo"` alone trains RLOO's own loss, as it always has (and as
    // `rlft rloo` does); a `loss_type` beside it picks another.
    if table
        .get("advantage_estimator")
        .and_then(|v| v.as_str())
        .is_some_and(|e| e.trim().eq_ignore_ascii_case("rloo"))
        && !table.contains_key("loss_type")
    {
        table.insert("loss_type".into(), "rloo".into());
    }
    let int = |t: &toml::Table, k: &str| -> Result<Option<usize>, ConfigError> {
        match t.get(k) {
            None => Ok(None),
            Some(toml::Value::Integer(i)) if *i > 0 => Ok(Some(*i as usize)),
            Some(v) => Err(ConfigError::Invalid(format!(
                "`{k}` must be a positive integer (got {v})"
            ))),
        }
    };
    let defaults = OnlineConfig::default();
    let g = int(table, "num_generations")?.unwrap_or(defaults.num_generations);
    let micro = int(table, "per_device_train_batch_size")?
        .unwrap_or(defaults.args.per_device_train_batch_size);
    if let Some(prompts) = int(table, "rollout_batch_size")? {
        if table.contains_key("generation_batch_size") {
            return Err(ConfigError::Invalid(
                "both `rollout_batch_size` (prompts) and `generation_batch_size` (completions) \
                 are set; keep one"
                    .into(),
            ));
        }
        table.remove("rollout_batch_size");
        table.insert(
            "generation_batch_size".into(),
            toml::Value::Integer((prompts * g) as i64),
        );
    }
    if let Some(minis) = int(table, "num_mini_batches")? {
        // TRL PPO: a rollout is `num_mini_batches` train batches.
        if table.contains_key("generation_batch_size") {
            return Err(ConfigError::Invalid(
                "both `num_mini_batches` and `generation_batch_size` (or `rollout_batch_size`) \
                 are set; keep one"
                    .into(),
            ));
        }
        table.remove("num_mini_batches");
        let accumulation = int(table, "gradient_accumulation_steps")?.unwrap_or(1);
        let train = int(table, "train_batch_size")?.unwrap_or(micro * accumulation);
        table.insert(
            "generation_batch_size".into(),
            toml::Value::Integer((minis * train) as i64),
        );
    }
    if let Some(train) = int(table, "train_batch_size")? {
        if table.contains_key("gradient_accumulation_steps") {
            return Err(ConfigError::Invalid(
                "both `train_batch_size` and `gradient_accumulation_steps` are set; keep one"
                    .into(),
            ));
        }
        if train % micro != 0 {
            return Err(ConfigError::Invalid(format!(
                "train_batch_size {train} is not a multiple of per_device_train_batch_size \
                 {micro}; make it {} or {}",
                (train / micro).max(1) * micro,
                (train / micro + 1) * micro
            )));
        }
        table.remove("train_batch_size");
        table.insert(
            "gradient_accumulation_steps".into(),
            toml::Value::Integer((train / micro) as i64),
        );
    }
    Ok(())
}

impl OnlineConfig {
    /// Completions per optimiser step.
    pub fn train_batch(&self) -> usize {
        self.args.train_batch()
    }

    /// Completions per rollout.
    pub fn rollout_completions(&self) -> usize {
        if self.generation_batch_size == 0 {
            self.train_batch()
        } else {
            self.generation_batch_size
        }
    }

    /// The batch arithmetic for a dataset of `num_prompts` training prompts.
    pub fn plan(&self, num_prompts: usize) -> BatchPlan {
        let train_batch = self.train_batch();
        let rollout_completions = self.rollout_completions();
        let rollout_prompts = rollout_completions / self.num_generations;
        let steps_per_rollout = rollout_completions / train_batch * self.num_iterations;
        let (rollouts, total_steps) = if self.args.max_steps > 0 {
            let m = self.args.max_steps;
            (m.div_ceil(steps_per_rollout), m)
        } else {
            let per_epoch = num_prompts as f64 / rollout_prompts as f64;
            let r = (per_epoch * self.args.num_train_epochs).ceil().max(1.0) as usize;
            (r, r * steps_per_rollout)
        };
        BatchPlan {
            train_batch,
            rollout_completions,
            rollout_prompts,
            steps_per_rollout,
            rollouts,
            total_steps,
        }
    }
}
