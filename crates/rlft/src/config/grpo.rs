//! `rlft grpo --config grpo.toml`: GRPO settings with TRL's `GRPOConfig` names and meanings,
//! LightRFT's rollout/train batch terms as documented aliases, and the derived batch
//! arithmetic.
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

use std::path::{Path, PathBuf};

use rlft_rewards::RewardSpec;
use serde::{Deserialize, Serialize};

use super::sft::{LoraSettings, LORA_KEYS};
use super::{apply_overrides, check_keys, read_table, ConfigError};
use crate::grpo::algo::{LossType, ScaleRewards};

/// GRPO config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoConfig {
    /// Model: an HF directory, a .gguf file, or "default" (the embedded SmolLM2-135M-Instruct).
    pub model: String,
    /// Where checkpoints, metrics, samples, the final model and the report go.
    pub output_dir: PathBuf,
    /// Prompts: JSONL, Parquet, or an HF `save_to_disk` directory (Dataset or DatasetDict).
    pub dataset: PathBuf,
    /// Split to train on when `dataset` is a DatasetDict.
    pub dataset_split: String,
    /// Eval prompts (same formats); when unset, `dataset`'s `eval_split` is used if it exists.
    pub eval_dataset: Option<PathBuf>,
    /// Eval split ("test" by default when the DatasetDict has it).
    pub eval_split: Option<String>,
    /// Column holding the prompt: a string (sent as one user message) or a list of messages.
    pub prompt_column: String,
    /// System message put first in conversations that have none.
    pub system_prompt: Option<String>,
    /// Longest prompt in tokens (after the chat template).
    pub max_prompt_length: usize,
    /// Longer prompts: "drop" or "truncate" (keeps the last tokens); both counted and reported.
    pub prompt_truncation: String,
    /// Most new tokens per completion; a completion that reaches it is "truncated".
    pub max_completion_length: usize,
    /// Completions per prompt (the group size G).
    pub num_generations: usize,
    /// Completions per rollout; 0 = one train batch (per_device x accumulation).
    pub generation_batch_size: usize,
    /// Sampling temperature of the rollouts.
    pub temperature: f64,
    /// Nucleus sampling of the rollouts (1.0 = off).
    pub top_p: f64,
    /// Top-k sampling of the rollouts (0 = off).
    pub top_k: usize,
    /// Min-p sampling of the rollouts (0 = off).
    pub min_p: f64,
    /// Repetition penalty of the rollouts (1.0 = off).
    pub repetition_penalty: f64,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// "constant", "linear", "cosine" or "cosine_with_min_lr".
    pub lr_scheduler_type: String,
    /// Final LR as a fraction of the peak, for cosine_with_min_lr.
    pub min_lr_rate: f64,
    /// Warmup as a fraction of the total steps.
    pub warmup_ratio: f64,
    /// Warmup in steps (wins over warmup_ratio when > 0).
    pub warmup_steps: usize,
    /// Decoupled weight decay (biases and norms are not decayed).
    pub weight_decay: f64,
    /// AdamW beta1.
    pub adam_beta1: f64,
    /// AdamW beta2.
    pub adam_beta2: f64,
    /// AdamW epsilon.
    pub adam_epsilon: f64,
    /// Global gradient-norm clip (0 = off).
    pub max_grad_norm: f64,
    /// Completions per micro-batch (forward+backward at once).
    pub per_device_train_batch_size: usize,
    /// Micro-batches per optimiser step.
    pub gradient_accumulation_steps: usize,
    /// Passes over the prompts (when max_steps is 0).
    pub num_train_epochs: f64,
    /// Optimiser steps to run; 0 = derive from num_train_epochs.
    pub max_steps: usize,
    /// KL coefficient (k3 estimator, in the loss); 0 skips the reference model entirely.
    pub beta: f64,
    /// Lower clip range of the importance ratio (1 - epsilon).
    pub epsilon: f64,
    /// Upper clip range (1 + epsilon_high); unset = epsilon. DAPO's clip-higher uses 0.28.
    pub epsilon_high: Option<f64>,
    /// Optimisation passes over each rollout (PPO epochs); > 1 keeps old log-probs.
    pub num_iterations: usize,
    /// Loss aggregation: "grpo" (token mean per sequence, then mean), "bnpo" (token mean over
    /// the micro-batch), "dr_grpo" (sum / (completions x max_completion_length)), "dapo" (token
    /// mean over the whole optimiser step; TRL's default).
    pub loss_type: LossType,
    /// Advantage scaling: "group" (divide by the group's std), "batch" (by the rollout's std),
    /// "none" (Dr. GRPO: only subtract the group mean).
    pub scale_rewards: ScaleRewards,
    /// Added to the std before dividing (TRL 1e-4; LightRFT 1e-9).
    pub advantage_epsilon: f64,
    /// Clamp advantages to [-advantage_clip, advantage_clip] (0 = off; LightRFT uses 10).
    pub advantage_clip: f64,
    /// Weights of the reward functions, in order; unset = each reward's own `weight`.
    pub reward_weights: Option<Vec<f64>>,
    /// Exclude completions that hit max_completion_length from the loss (DAPO).
    pub mask_truncated_completions: bool,
    /// Run each prompt once per micro-batch and let its completions attend to its keys and
    /// values (policy, old and reference passes); same log-probs and gradients as recomputing
    /// the prompt per completion, fewer tokens. false = the plain rows (for comparison).
    pub share_prompts: bool,
    /// Seed of sampling, shuffling and LoRA initialisation/dropout.
    pub seed: u64,
    /// bf16 weights/activations with f32 master weights (f32 stays the default on CPU).
    pub bf16: bool,
    /// Keep only each decoder layer's input during the training forward and recompute the
    /// layer in the backward (transformers' `gradient_checkpointing`): much less activation
    /// memory for about one more forward pass of compute. `rlft plan` shows the saving.
    pub gradient_checkpointing: bool,
    /// Train LoRA adapters instead of all weights (the reference model is then the base with
    /// adapters off: no second copy).
    pub use_peft: bool,
    /// LoRA settings (used when use_peft).
    pub lora: LoraSettings,
    /// Log metrics every this many steps (samples go to samples.jsonl at the same cadence).
    pub logging_steps: usize,
    /// Completions written to samples.jsonl per logging step.
    pub num_completions_to_log: usize,
    /// Evaluate on the eval split every this many steps (0 = before and after training only).
    pub eval_steps: usize,
    /// Eval decoding: "greedy" or "sampled" (pass@1 with the rollout sampling settings).
    pub eval_decoding: String,
    /// Evaluate at most this many eval prompts (0 = all).
    pub eval_max_prompts: usize,
    /// Save a checkpoint every this many steps (0 = only at the end).
    pub save_steps: usize,
    /// Keep at most this many checkpoints (0 = all).
    pub save_total_limit: usize,
    /// Metric sinks: "jsonl", "tensorboard".
    pub report_to: Vec<String>,
    /// Warn when the mean k3 KL exceeds this.
    pub kl_warning_threshold: f64,
    /// Warn when this many consecutive steps have reward_std near 0.
    pub zero_std_warning_steps: usize,
    /// Reward functions, in order (`[[rewards]]` tables; see `docs/rewards.md`).
    pub rewards: Vec<RewardSpec>,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        GrpoConfig {
            model: "default".into(),
            output_dir: PathBuf::from("artifacts/grpo"),
            dataset: PathBuf::new(),
            dataset_split: "train".into(),
            eval_dataset: None,
            eval_split: None,
            prompt_column: "prompt".into(),
            system_prompt: None,
            max_prompt_length: 512,
            prompt_truncation: "drop".into(),
            max_completion_length: 256,
            num_generations: 8,
            generation_batch_size: 0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            learning_rate: 1e-6,
            lr_scheduler_type: "linear".into(),
            min_lr_rate: 0.0,
            warmup_ratio: 0.0,
            warmup_steps: 0,
            weight_decay: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_epsilon: 1e-8,
            max_grad_norm: 1.0,
            per_device_train_batch_size: 8,
            gradient_accumulation_steps: 1,
            num_train_epochs: 1.0,
            max_steps: 0,
            beta: 0.0,
            epsilon: 0.2,
            epsilon_high: None,
            num_iterations: 1,
            loss_type: LossType::Dapo,
            scale_rewards: ScaleRewards::Group,
            advantage_epsilon: 1e-4,
            advantage_clip: 0.0,
            reward_weights: None,
            mask_truncated_completions: false,
            share_prompts: true,
            seed: 42,
            bf16: false,
            gradient_checkpointing: false,
            use_peft: false,
            lora: LoraSettings::default(),
            logging_steps: 1,
            num_completions_to_log: 4,
            eval_steps: 0,
            eval_decoding: "greedy".into(),
            eval_max_prompts: 0,
            save_steps: 0,
            save_total_limit: 0,
            report_to: vec!["jsonl".into(), "tensorboard".into()],
            kl_warning_threshold: 1.0,
            zero_std_warning_steps: 5,
            rewards: Vec::new(),
        }
    }
}

/// Top-level keys of [`GrpoConfig`].
pub const GRPO_KEYS: &[&str] = &[
    "model",
    "output_dir",
    "dataset",
    "dataset_split",
    "eval_dataset",
    "eval_split",
    "prompt_column",
    "system_prompt",
    "max_prompt_length",
    "prompt_truncation",
    "max_completion_length",
    "num_generations",
    "generation_batch_size",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "learning_rate",
    "lr_scheduler_type",
    "min_lr_rate",
    "warmup_ratio",
    "warmup_steps",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "beta",
    "epsilon",
    "epsilon_high",
    "num_iterations",
    "loss_type",
    "scale_rewards",
    "advantage_epsilon",
    "advantage_clip",
    "reward_weights",
    "mask_truncated_completions",
    "share_prompts",
    "seed",
    "bf16",
    "gradient_checkpointing",
    "use_peft",
    "lora",
    "logging_steps",
    "num_completions_to_log",
    "eval_steps",
    "eval_decoding",
    "eval_max_prompts",
    "save_steps",
    "save_total_limit",
    "report_to",
    "kl_warning_threshold",
    "zero_std_warning_steps",
    "rewards",
];

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
const DERIVED_ALIASES: &[&str] = &["rollout_batch_size", "train_batch_size"];

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

fn resolve_aliases(table: &mut toml::Table) -> Result<(), ConfigError> {
    for (alias, key, _) in ALIASES {
        if let Some(v) = table.remove(*alias) {
            if table.contains_key(*key) {
                return Err(ConfigError::Invalid(format!(
                    "both `{alias}` and `{key}` are set; `{alias}` is an alias of `{key}`, keep one"
                )));
            }
            table.insert(key.to_string(), v);
        }
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
    let g = int(table, "num_generations")?.unwrap_or(GrpoConfig::default().num_generations);
    let micro = int(table, "per_device_train_batch_size")?
        .unwrap_or(GrpoConfig::default().per_device_train_batch_size);
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

impl GrpoConfig {
    /// Reads `path`, applies `key=value` overrides, resolves aliases, checks keys and values.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let mut table = read_table(path)?;
        apply_overrides(&mut table, overrides)?;
        Self::from_table(table, &path.display().to_string())
    }

    /// Builds from a parsed TOML table (`origin` names it in errors).
    pub fn from_table(mut table: toml::Table, origin: &str) -> Result<Self, ConfigError> {
        let mut valid: Vec<&str> = GRPO_KEYS.to_vec();
        valid.extend(ALIASES.iter().map(|a| a.0));
        valid.extend(DERIVED_ALIASES);
        check_keys(&table, "", &valid, &[("lora", LORA_KEYS)])?;
        resolve_aliases(&mut table)?;
        let cfg: GrpoConfig =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    path: origin.to_string(),
                    msg: e.to_string(),
                })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Completions per optimiser step.
    pub fn train_batch(&self) -> usize {
        self.per_device_train_batch_size * self.gradient_accumulation_steps
    }

    /// Completions per rollout.
    pub fn rollout_completions(&self) -> usize {
        if self.generation_batch_size == 0 {
            self.train_batch()
        } else {
            self.generation_batch_size
        }
    }

    /// Upper clip range.
    pub fn epsilon_high(&self) -> f64 {
        self.epsilon_high.unwrap_or(self.epsilon)
    }

    /// The batch arithmetic for a dataset of `num_prompts` training prompts.
    pub fn plan(&self, num_prompts: usize) -> BatchPlan {
        let train_batch = self.train_batch();
        let rollout_completions = self.rollout_completions();
        let rollout_prompts = rollout_completions / self.num_generations;
        let steps_per_rollout = rollout_completions / train_batch * self.num_iterations;
        let (rollouts, total_steps) = if self.max_steps > 0 {
            (self.max_steps.div_ceil(steps_per_rollout), self.max_steps)
        } else {
            let per_epoch = num_prompts as f64 / rollout_prompts as f64;
            let r = (per_epoch * self.num_train_epochs).ceil().max(1.0) as usize;
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

    /// Range and consistency checks; each error says how to fix it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.dataset.as_os_str().is_empty() {
            return bad("`dataset` is required: a JSONL, Parquet or HF save_to_disk path".into());
        }
        if self.rewards.is_empty() {
            return bad(
                "no reward functions: add at least one [[rewards]] table, e.g.\n  [[rewards]]\n  \
                 type = \"boxed_accuracy\"\n  answer_field = \"answer\""
                    .into(),
            );
        }
        if let Some(w) = &self.reward_weights {
            if w.len() != self.rewards.len() {
                return bad(format!(
                    "reward_weights has {} entries but there are {} reward functions; give one \
                     weight per [[rewards]] table, in order",
                    w.len(),
                    self.rewards.len()
                ));
            }
        }
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return bad(format!(
                "learning_rate must be > 0 (got {})",
                self.learning_rate
            ));
        }
        for (name, v) in [
            ("adam_beta1", self.adam_beta1),
            ("adam_beta2", self.adam_beta2),
        ] {
            if !(0.0..1.0).contains(&v) {
                return bad(format!("{name} must be in [0, 1) (got {v})"));
            }
        }
        if self.per_device_train_batch_size == 0 || self.gradient_accumulation_steps == 0 {
            return bad(
                "per_device_train_batch_size and gradient_accumulation_steps must be >= 1".into(),
            );
        }
        if self.num_generations < 2 {
            return bad(format!(
                "num_generations must be >= 2 (got {}): GRPO compares completions within a group",
                self.num_generations
            ));
        }
        let (train, rollout, g) = (
            self.train_batch(),
            self.rollout_completions(),
            self.num_generations,
        );
        if rollout % g != 0 {
            return bad(format!(
                "the rollout of {rollout} completions ({}) is not a multiple of num_generations \
                 = {g}: {rollout} % {g} = {}; use a rollout of {} or {} completions, or \
                 num_generations that divides {rollout}",
                if self.generation_batch_size == 0 {
                    format!(
                        "per_device_train_batch_size {} x gradient_accumulation_steps {}",
                        self.per_device_train_batch_size, self.gradient_accumulation_steps
                    )
                } else {
                    "generation_batch_size".into()
                },
                rollout % g,
                (rollout / g).max(1) * g,
                (rollout / g + 1) * g
            ));
        }
        if rollout % train != 0 {
            return bad(format!(
                "generation_batch_size {rollout} is not a multiple of the train batch {train} \
                 (per_device_train_batch_size x gradient_accumulation_steps); use {} or {}",
                (rollout / train).max(1) * train,
                (rollout / train + 1) * train
            ));
        }
        if self.max_prompt_length == 0 || self.max_completion_length == 0 {
            return bad("max_prompt_length and max_completion_length must be >= 1".into());
        }
        if !matches!(self.prompt_truncation.as_str(), "drop" | "truncate") {
            return bad(format!(
                "prompt_truncation must be \"drop\" or \"truncate\" (got {:?})",
                self.prompt_truncation
            ));
        }
        if !matches!(self.eval_decoding.as_str(), "greedy" | "sampled") {
            return bad(format!(
                "eval_decoding must be \"greedy\" or \"sampled\" (got {:?})",
                self.eval_decoding
            ));
        }
        if self.temperature.is_nan() || self.temperature <= 0.0 {
            return bad(format!(
                "temperature must be > 0 for rollouts (got {}); GRPO needs varied samples",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1] (got {})", self.top_p));
        }
        if self.beta < 0.0 || self.epsilon < 0.0 || self.epsilon_high() < 0.0 {
            return bad("beta, epsilon and epsilon_high must be >= 0".into());
        }
        if self.epsilon >= 1.0 {
            return bad(format!(
                "epsilon must be < 1 (got {}): the ratio is clipped to [1 - epsilon, ...]",
                self.epsilon
            ));
        }
        if self.num_iterations == 0 {
            return bad("num_iterations must be >= 1".into());
        }
        if self.advantage_epsilon < 0.0 || self.advantage_clip < 0.0 {
            return bad("advantage_epsilon and advantage_clip must be >= 0".into());
        }
        if !(0.0..1.0).contains(&self.warmup_ratio) {
            return bad(format!(
                "warmup_ratio must be in [0, 1) (got {})",
                self.warmup_ratio
            ));
        }
        if self.max_steps == 0 && self.num_train_epochs <= 0.0 {
            return bad("set max_steps > 0 or num_train_epochs > 0".into());
        }
        if self.use_peft && self.lora.r == 0 {
            return bad("lora.r must be >= 1".into());
        }
        if !matches!(
            self.lr_scheduler_type.as_str(),
            "constant" | "constant_with_warmup" | "linear" | "cosine" | "cosine_with_min_lr"
        ) {
            return bad(format!(
                "lr_scheduler_type {:?} is unknown; use \"constant\", \"linear\", \"cosine\" or \"cosine_with_min_lr\" (with min_lr_rate)",
                self.lr_scheduler_type
            ));
        }
        if !(0.0..=1.0).contains(&self.min_lr_rate) {
            return bad(format!(
                "min_lr_rate must be in [0, 1] (got {})",
                self.min_lr_rate
            ));
        }
        if self.logging_steps == 0 {
            return bad("logging_steps must be >= 1".into());
        }
        for r in &self.report_to {
            if !matches!(r.as_str(), "jsonl" | "tensorboard") {
                return bad(format!(
                    "report_to entry {r:?} is unknown; use \"jsonl\" and/or \"tensorboard\""
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "dataset = \"d.jsonl\"\n[[rewards]]\ntype = \"boxed_accuracy\"\n";

    fn parse(extra: &str) -> Result<GrpoConfig, ConfigError> {
        let text = format!("{extra}\n{BASE}");
        GrpoConfig::from_table(text.parse().unwrap(), "test.toml")
    }

    #[test]
    fn every_listed_key_is_a_field() {
        let d = toml::Value::try_from(GrpoConfig {
            eval_dataset: Some("y".into()),
            eval_split: Some("test".into()),
            system_prompt: Some("s".into()),
            epsilon_high: Some(0.28),
            reward_weights: Some(vec![1.0]),
            ..Default::default()
        })
        .unwrap();
        let keys: Vec<&String> = d.as_table().unwrap().keys().collect();
        assert_eq!(keys.len(), GRPO_KEYS.len());
        for k in keys {
            assert!(
                GRPO_KEYS.contains(&k.as_str()),
                "{k} missing from GRPO_KEYS"
            );
        }
    }

    #[test]
    fn plan_follows_trl_arithmetic() {
        let c = parse("per_device_train_batch_size = 4\ngradient_accumulation_steps = 2\nnum_generations = 4\nmax_steps = 10").unwrap();
        let p = c.plan(100);
        assert_eq!(
            (p.train_batch, p.rollout_completions, p.rollout_prompts),
            (8, 8, 2)
        );
        assert_eq!(
            (p.steps_per_rollout, p.total_steps, p.rollouts),
            (1, 10, 10)
        );
        // Epoch-based: 100 prompts / 2 per rollout = 50 rollouts.
        let c = parse("per_device_train_batch_size = 4\ngradient_accumulation_steps = 2\nnum_generations = 4\nnum_train_epochs = 1").unwrap();
        assert_eq!(c.plan(100).total_steps, 50);
    }

    #[test]
    fn lightrft_aliases_resolve() {
        // The seed's defaults: 16 prompts x 4 samples per rollout, train batch 16, micro 1.
        let c = parse(
            "n_samples_per_prompt = 4\nrollout_batch_size = 16\ntrain_batch_size = 16\n\
             micro_train_batch_size = 1\ninit_kl_coef = 0.001\nmax_steps = 8",
        )
        .unwrap();
        assert_eq!(c.num_generations, 4);
        assert_eq!(c.generation_batch_size, 64);
        assert_eq!(c.gradient_accumulation_steps, 16);
        assert_eq!(c.beta, 0.001);
        let p = c.plan(128);
        assert_eq!((p.rollout_prompts, p.steps_per_rollout), (16, 4));
        let e = parse("init_kl_coef = 0.1\nbeta = 0.2")
            .unwrap_err()
            .to_string();
        assert!(e.contains("alias"), "{e}");
    }

    #[test]
    fn errors_give_the_fix() {
        let e = parse("num_generation = 4").unwrap_err().to_string();
        assert!(e.contains("did you mean `num_generations`"), "{e}");
        let e = parse("per_device_train_batch_size = 6\nnum_generations = 4")
            .unwrap_err()
            .to_string();
        assert!(e.contains("6 % 4 = 2") && e.contains("4 or 8"), "{e}");
        let e = GrpoConfig::from_table("dataset = \"d\"".parse().unwrap(), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("[[rewards]]"), "{e}");
        let e = parse("reward_weights = [1.0, 2.0]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 entries"), "{e}");
        let e = parse("loss_type = \"ppo\"").unwrap_err().to_string();
        assert!(e.contains("loss_type") || e.contains("grpo"), "{e}");
    }
}
