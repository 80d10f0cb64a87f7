//! `rlft sft --config sft.toml`: supervised fine-tuning settings, with TRL's `SFTConfig` names.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{apply_overrides, check_keys, read_table, ConfigError};

/// LoRA settings (PEFT's names).
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

/// Keys of [`LoraSettings`].
pub const LORA_KEYS: &[&str] = &[
    "r",
    "lora_alpha",
    "lora_dropout",
    "target_modules",
    "use_rslora",
];

/// Supervised fine-tuning config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    /// Model: an HF directory, a .gguf file, or "default".
    pub model: String,
    /// Where checkpoints, metrics and the final model go.
    pub output_dir: PathBuf,
    /// Training data: JSONL, Parquet, or an HF `save_to_disk` directory.
    pub dataset: PathBuf,
    /// Split to train on when `dataset` is a DatasetDict.
    pub dataset_split: String,
    /// Separate eval data (same formats); when unset, `eval_size` rows are held out.
    pub eval_dataset: Option<PathBuf>,
    /// Split of `eval_dataset` (or of `dataset` when it has this split and no eval_dataset).
    pub eval_split: Option<String>,
    /// Held-out eval rows when no eval split exists: a fraction (< 1) or a count (>= 1); 0 = none.
    pub eval_size: f64,
    /// System message put first in conversations that have none.
    pub system_prompt: Option<String>,
    /// Longest example in tokens.
    pub max_length: usize,
    /// Longer examples: "truncate" or "drop" (both are counted and reported).
    pub truncation: String,
    /// Pack several examples per sequence (not supported yet: must stay false).
    pub packing: bool,
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
    /// Passes over the data (when max_steps is 0).
    pub num_train_epochs: f64,
    /// Optimiser steps to run; 0 = derive from num_train_epochs.
    pub max_steps: usize,
    /// Examples per micro-batch.
    pub per_device_train_batch_size: usize,
    /// Micro-batches per optimiser step.
    pub gradient_accumulation_steps: usize,
    /// Log metrics every this many steps.
    pub logging_steps: usize,
    /// Evaluate every this many steps (0 = only at the end).
    pub eval_steps: usize,
    /// Save a checkpoint every this many steps (0 = only at the end).
    pub save_steps: usize,
    /// Keep at most this many checkpoints (0 = all).
    pub save_total_limit: usize,
    /// Seed of shuffling, dropout and initialisation.
    pub seed: u64,
    /// bf16 weights/activations with f32 master weights (f32 stays the default on CPU).
    pub bf16: bool,
    /// Keep only each decoder layer's input during the training forward and recompute the
    /// layer in the backward (transformers' `gradient_checkpointing`): much less activation
    /// memory for about one more forward pass of compute. `rlft plan` shows the saving.
    pub gradient_checkpointing: bool,
    /// Train LoRA adapters instead of all weights.
    pub use_peft: bool,
    /// LoRA settings (used when use_peft).
    pub lora: LoraSettings,
    /// Metric sinks: "jsonl", "tensorboard".
    pub report_to: Vec<String>,
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            model: "default".into(),
            output_dir: PathBuf::from("artifacts/sft"),
            dataset: PathBuf::new(),
            dataset_split: "train".into(),
            eval_dataset: None,
            eval_split: None,
            eval_size: 0.0,
            system_prompt: None,
            max_length: 1024,
            truncation: "truncate".into(),
            packing: false,
            learning_rate: 2e-5,
            lr_scheduler_type: "linear".into(),
            min_lr_rate: 0.0,
            warmup_ratio: 0.0,
            warmup_steps: 0,
            weight_decay: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_epsilon: 1e-8,
            max_grad_norm: 1.0,
            num_train_epochs: 3.0,
            max_steps: 0,
            per_device_train_batch_size: 8,
            gradient_accumulation_steps: 1,
            logging_steps: 10,
            eval_steps: 0,
            save_steps: 0,
            save_total_limit: 0,
            seed: 42,
            bf16: false,
            gradient_checkpointing: false,
            use_peft: false,
            lora: LoraSettings::default(),
            report_to: vec!["jsonl".into(), "tensorboard".into()],
        }
    }
}

/// Top-level keys of [`SftConfig`].
pub const SFT_KEYS: &[&str] = &[
    "model",
    "output_dir",
    "dataset",
    "dataset_split",
    "eval_dataset",
    "eval_split",
    "eval_size",
    "system_prompt",
    "max_length",
    "truncation",
    "packing",
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
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "save_total_limit",
    "seed",
    "bf16",
    "gradient_checkpointing",
    "use_peft",
    "lora",
    "report_to",
];

impl SftConfig {
    /// Reads `path`, applies `key=value` overrides, checks keys and values.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let mut table = read_table(path)?;
        apply_overrides(&mut table, overrides)?;
        Self::from_table(table, &path.display().to_string())
    }

    /// Builds from a parsed TOML table (`origin` names it in errors).
    pub fn from_table(table: toml::Table, origin: &str) -> Result<Self, ConfigError> {
        check_keys(&table, "", SFT_KEYS, &[("lora", LORA_KEYS)])?;
        let cfg: SftConfig =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    path: origin.to_string(),
                    msg: e.to_string(),
                })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Range and consistency checks.
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
        if self.max_length < 2 {
            return bad(format!("max_length must be >= 2 (got {})", self.max_length));
        }
        if !matches!(self.truncation.as_str(), "truncate" | "drop") {
            return bad(format!(
                "truncation must be \"truncate\" or \"drop\" (got {:?})",
                self.truncation
            ));
        }
        if self.packing {
            return bad("packing = true is not supported yet; set packing = false".into());
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
        if self.eval_size < 0.0 {
            return bad(format!("eval_size must be >= 0 (got {})", self.eval_size));
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
        if self.use_peft && self.lora.r == 0 {
            return bad("lora.r must be >= 1".into());
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

    fn parse(s: &str) -> Result<SftConfig, ConfigError> {
        SftConfig::from_table(s.parse().unwrap(), "test.toml")
    }

    #[test]
    fn defaults_and_overrides() {
        let c = parse("dataset = \"d.jsonl\"\nlearning_rate = 1e-4\n[lora]\nr = 8").unwrap();
        assert_eq!(c.learning_rate, 1e-4);
        assert_eq!(c.lora.r, 8);
        assert_eq!(c.lora.lora_alpha, 32.0);
        assert_eq!(c.per_device_train_batch_size, 8);
        let mut t: toml::Table = "dataset = \"d.jsonl\"".parse().unwrap();
        apply_overrides(&mut t, &["max_steps=5".into(), "use_peft=true".into()]).unwrap();
        let c = SftConfig::from_table(t, "x").unwrap();
        assert_eq!(c.max_steps, 5);
        assert!(c.use_peft);
    }

    #[test]
    fn every_listed_key_is_a_field() {
        let d = toml::Value::try_from(SftConfig {
            dataset: "x".into(),
            eval_dataset: Some("y".into()),
            eval_split: Some("test".into()),
            system_prompt: Some("s".into()),
            ..Default::default()
        })
        .unwrap();
        let keys: Vec<&String> = d.as_table().unwrap().keys().collect();
        assert_eq!(keys.len(), SFT_KEYS.len());
        for k in keys {
            assert!(SFT_KEYS.contains(&k.as_str()), "{k} missing from SFT_KEYS");
        }
    }

    #[test]
    fn errors_name_the_key_and_fix() {
        let e = parse("dataset = \"d\"\nnum_train_epoch = 2")
            .unwrap_err()
            .to_string();
        assert!(e.contains("did you mean `num_train_epochs`"), "{e}");
        let e = parse("learning_rate = 1e-5").unwrap_err().to_string();
        assert!(e.contains("dataset"), "{e}");
        let e = parse("dataset = \"d\"\ntruncation = \"cut\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncate"), "{e}");
        let e = parse("dataset = \"d\"\nlearning_rate = \"fast\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("learning_rate"), "{e}");
    }
}
