//! `rlft sft --config sft.toml`: supervised fine-tuning settings, with TRL's `SFTConfig` names:
//! the shared [`TrainingArgs`] plus the length policy of the examples.

use serde::{Deserialize, Serialize};

use super::args::TrainingArgs;
use super::{shared_args, ConfigError, TrainerConfig};
use crate::data::LengthPolicy;

/// Supervised fine-tuning config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SftConfig {
    /// Model, data, optimiser, batch, cadence, LoRA: the keys every trainer shares.
    #[serde(flatten)]
    pub args: TrainingArgs,
    /// Held-out eval rows when no eval split exists: a fraction (< 1) or a count (>= 1); 0 = none.
    pub eval_size: f64,
    /// Longest example in tokens.
    pub max_length: usize,
    /// Longer examples: "truncate" or "drop" (both are counted and reported).
    pub truncation: LengthPolicy,
    /// Pack several examples per sequence (not supported yet: must stay false).
    pub packing: bool,
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            args: TrainingArgs::offline("artifacts/sft", 2e-5),
            eval_size: 0.0,
            max_length: 1024,
            truncation: LengthPolicy::Truncate,
            packing: false,
        }
    }
}

impl TrainerConfig for SftConfig {
    shared_args!();

    fn validate_own(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.max_length < 2 {
            return bad(format!("max_length must be >= 2 (got {})", self.max_length));
        }
        if self.packing {
            return bad("packing = true is not supported yet; set packing = false".into());
        }
        if self.eval_size < 0.0 {
            return bad(format!("eval_size must be >= 0 (got {})", self.eval_size));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::apply_overrides;
    use crate::config::tests::parse;

    #[test]
    fn defaults_and_overrides() {
        let c = parse::<SftConfig>("dataset = \"d.jsonl\"\nlearning_rate = 1e-4\n[lora]\nr = 8")
            .unwrap();
        assert_eq!(c.args.learning_rate, 1e-4);
        assert_eq!(c.args.lora.r, 8);
        assert_eq!(c.args.lora.lora_alpha, 32.0);
        assert_eq!(c.args.per_device_train_batch_size, 8);
        let mut t: toml::Table = "dataset = \"d.jsonl\"".parse().unwrap();
        apply_overrides(&mut t, &["max_steps=5".into(), "use_peft=true".into()]).unwrap();
        let c = SftConfig::from_table(t, "x").unwrap();
        assert_eq!(c.args.max_steps, 5);
        assert!(c.args.use_peft);
    }

    #[test]
    fn errors_name_the_key_and_fix() {
        let e = parse::<SftConfig>("dataset = \"d\"\nnum_train_epoch = 2")
            .unwrap_err()
            .to_string();
        assert!(e.contains("did you mean `num_train_epochs`"), "{e}");
        let e = parse::<SftConfig>("learning_rate = 1e-5")
            .unwrap_err()
            .to_string();
        assert!(e.contains("dataset"), "{e}");
        let e = parse::<SftConfig>("dataset = \"d\"\ntruncation = \"cut\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncate"), "{e}");
        let e = parse::<SftConfig>("dataset = \"d\"\nlearning_rate = \"fast\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("learning_rate"), "{e}");
    }
}
