//! `rlft reward-model --config rm.toml`: reward-model settings with TRL 1.16's `RewardConfig`
//! names (`trl/trainer/reward_config.py`): the shared [`TrainingArgs`] plus the length filter,
//! the centring coefficient and dropout, and how the `score` head starts.
//!
//! TRL keys rlft does not take: `model_init_kwargs`, `trust_remote_code`, `chat_template_path`,
//! `dataset_num_proc`, `eos_token`, `pad_to_multiple_of`, `activation_offloading`, `pad_token`
//! (the tokenizer's pad token, else its EOS, is used, as TRL does by default).

use serde::{Deserialize, Serialize};

use super::args::TrainingArgs;
use super::{shared_args, ConfigError, TrainerConfig};

/// How a new `score` head starts (rlft's key; a reward-model checkpoint keeps its head).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreInit {
    /// `normal(0, initializer_range)`, seeded by `seed` (transformers' `_init_weights`).
    #[default]
    Normal,
    /// All zeros: every sequence scores 0 at the start.
    Zeros,
}

/// Reward-model config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RewardConfig {
    /// Model, data, optimiser, batch, cadence, LoRA: the keys every trainer shares. A step
    /// takes `per_device_train_batch_size` pairs per micro-batch (their chosen and rejected
    /// sequences in one forward pass, `2 x` rows).
    #[serde(flatten)]
    pub args: TrainingArgs,
    /// Held-out eval pairs when no eval split exists: a fraction (< 1) or a count (>= 1); 0 =
    /// none (rlft's, as in `rlft sft`).
    pub eval_size: f64,
    /// Longest tokenized chosen or rejected sequence; pairs with a longer side are dropped (TRL
    /// filters them out). 0 = no limit (TRL's `None`).
    pub max_length: usize,
    /// Weight of the auxiliary loss `mean((r_chosen + r_rejected)^2)` that keeps rewards
    /// centred on 0 (Eisenstein et al. 2023, eq. 2; TRL recommends 0.01). Unset = off.
    pub center_rewards_coefficient: Option<f64>,
    /// Turn dropout off while training (TRL's default). The decoders have none; with LoRA this
    /// sets the adapters' `lora_dropout` to 0 in training (the adapter config keeps its value),
    /// as TRL's `disable_dropout_in_model` does to PEFT's dropout modules.
    pub disable_dropout: bool,
    /// A new head's start: "normal" (transformers' init) or "zeros".
    pub score_init: ScoreInit,
    /// Standard deviation of a "normal" head (transformers' config `initializer_range`).
    pub initializer_range: f64,
}

impl Default for RewardConfig {
    /// TRL's `RewardConfig` defaults (learning rate 1e-4, logging every 10 steps), except
    /// `gradient_checkpointing` and `bf16`, which stay off as everywhere in rlft on the CPU.
    fn default() -> Self {
        RewardConfig {
            args: TrainingArgs::offline("artifacts/reward-model", 1e-4),
            eval_size: 0.0,
            max_length: 1024,
            center_rewards_coefficient: None,
            disable_dropout: true,
            score_init: ScoreInit::Normal,
            initializer_range: rlft_model::score::DEFAULT_INITIALIZER_RANGE,
        }
    }
}

impl TrainerConfig for RewardConfig {
    shared_args!();

    fn validate_own(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.max_length == 1 {
            return bad("max_length must be >= 2 tokens (or 0 for no limit)".into());
        }
        if self.eval_size < 0.0 {
            return bad(format!("eval_size must be >= 0 (got {})", self.eval_size));
        }
        if let Some(c) = self.center_rewards_coefficient {
            if !(c >= 0.0 && c.is_finite()) {
                return bad(format!(
                    "center_rewards_coefficient must be >= 0 (got {c}); TRL recommends 0.01, \
                     or leave it out"
                ));
            }
        }
        if !(self.initializer_range > 0.0 && self.initializer_range.is_finite()) {
            return bad(format!(
                "initializer_range must be > 0 (got {}); transformers uses 0.02",
                self.initializer_range
            ));
        }
        Ok(())
    }
}

impl RewardConfig {
    /// `max_length` as a limit (`None` = no limit).
    pub fn length_limit(&self) -> Option<usize> {
        (self.max_length > 0).then_some(self.max_length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::parse;

    #[test]
    fn defaults_are_trls() {
        let c = parse::<RewardConfig>("dataset = \"d\"").unwrap();
        assert_eq!(c.args.learning_rate, 1e-4);
        assert_eq!(c.max_length, 1024);
        assert_eq!(c.center_rewards_coefficient, None);
        assert!(c.disable_dropout);
        let c = parse::<RewardConfig>(
            "dataset = \"d\"\ncenter_rewards_coefficient = 0.01\nscore_init = \"zeros\"",
        )
        .unwrap();
        assert_eq!(c.center_rewards_coefficient, Some(0.01));
        assert_eq!(c.score_init, ScoreInit::Zeros);
    }

    #[test]
    fn errors_name_the_key_and_fix() {
        let e = parse::<RewardConfig>("dataset = \"d\"\ncenter_reward_coefficient = 0.1")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("did you mean `center_rewards_coefficient`"),
            "{e}"
        );
        let e = parse::<RewardConfig>("dataset = \"d\"\ncenter_rewards_coefficient = -1.0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("0.01"), "{e}");
        let e = parse::<RewardConfig>("dataset = \"d\"\nscore_init = \"ones\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("zeros"), "{e}");
    }
}
