//! `rlft online-dpo --config odpo.toml`: Online DPO with TRL 1.16's experimental
//! `OnlineDPOConfig` names (`trl/experimental/online_dpo/online_dpo_config.py`): per prompt two
//! completions are sampled from the current policy, ranked by the rewards, and the pair trains
//! the DPO loss against the reference (Guo et al. 2024, "Direct Language Model Alignment from
//! Online AI Feedback").
//!
//! `per_device_train_batch_size` counts prompts (each brings its two completions), as in TRL.
//! Rollout, reward scoring, the reference pass and eval are the online trainers' own: this
//! config states them through [`OnlineDpoConfig::online`].
//!
//! `reward_model_path` is TRL's shortcut for a reward model: it adds a `[[rewards]]` table of
//! `type = "model"` (last, after the configured ones).
//!
//! TRL keys rlft does not take: `judge`, `generation_kwargs`, `cache_implementation`, the `vllm_*` keys, `model_init_kwargs`,
//! `trust_remote_code`, `ds3_gather_for_generation`.

use std::path::PathBuf;

use rlft_rewards::{ModelSpec, RewardKind, RewardSpec};
use serde::{Deserialize, Serialize};

use super::args::{LrSchedulerType, TrainingArgs};
use super::online::{EstimatorSettings, OnlineConfig};
use super::rollout::RolloutConfig;
use super::{shared_args, ConfigError, TrainerConfig};
use crate::algo::dpo_loss::{DpoLossConfig, DpoLossType};
use crate::data::LengthPolicy;

/// `beta`: one value, or one per epoch with the last kept for the rest (TRL's list).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BetaSchedule {
    /// The same beta for the whole run.
    One(f64),
    /// `beta[epoch]`, the last one past the list's end.
    PerEpoch(Vec<f64>),
}

impl BetaSchedule {
    /// The beta of (0-based, fractional) epoch `epoch`: TRL's `OnlineDPOTrainer.beta`.
    pub fn at(&self, epoch: f64) -> f64 {
        match self {
            BetaSchedule::One(b) => *b,
            BetaSchedule::PerEpoch(v) => {
                let i = (epoch.max(0.0).floor() as usize).min(v.len().saturating_sub(1));
                v.get(i).copied().unwrap_or(0.0)
            }
        }
    }

    fn values(&self) -> Vec<f64> {
        match self {
            BetaSchedule::One(b) => vec![*b],
            BetaSchedule::PerEpoch(v) => v.clone(),
        }
    }
}

/// Online DPO config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct OnlineDpoConfig {
    /// Model, data, optimiser, batch, cadence, LoRA: the keys every trainer shares
    /// (`per_device_train_batch_size` counts prompts; each brings two completions).
    #[serde(flatten)]
    pub args: TrainingArgs,
    /// Prompts, sampling (`temperature` samples the two completions), rewards (they rank each
    /// pair) and sample logs (`num_completions_to_log` counts pairs): the online trainers' flat
    /// keys ([`RolloutConfig`]).
    #[serde(flatten)]
    pub rollout: RolloutConfig,
    /// New tokens per completion.
    pub max_new_tokens: usize,
    /// Longest prompt + completion; prompts keep their last `max_length - max_new_tokens`
    /// tokens (TRL truncates on the left in the forward pass).
    pub max_length: usize,
    /// Subtracted from the reward of a completion that ran out of tokens before its EOS.
    pub missing_eos_penalty: Option<f64>,
    /// KL strength `beta` (IPO's `tau`): a number, or a list with one per epoch.
    pub beta: BetaSchedule,
    /// The pair loss: "sigmoid" (DPO) or "ipo" (TRL's two), or another of `rlft dpo`'s loss
    /// types that needs only the four log-prob sums.
    pub loss_type: DpoLossType,
    /// Label smoothing of the sigmoid and robust losses (conservative DPO; rlft's, from
    /// `DPOConfig`).
    pub label_smoothing: f64,
    /// Turn LoRA dropout off while training (TRL's default); the decoders have no other.
    pub disable_dropout: bool,
    /// A reward model ranking the pairs (TRL's key): an `rlft reward-model` output (`final/`,
    /// or `adapter/` over its base), added after `rewards` as `{ type = "model", name =
    /// "reward_model" }`.
    pub reward_model_path: Option<String>,
}

impl Default for OnlineDpoConfig {
    /// TRL's `OnlineDPOConfig` defaults (learning rate 5e-7, logging every 10 steps), except
    /// `gradient_checkpointing` and `bf16`, which stay off as everywhere in rlft on the CPU.
    fn default() -> Self {
        OnlineDpoConfig {
            args: TrainingArgs {
                output_dir: PathBuf::from("artifacts/online-dpo"),
                learning_rate: 5e-7,
                lr_scheduler_type: LrSchedulerType::Linear,
                num_train_epochs: 3.0,
                logging_steps: 10,
                ..TrainingArgs::default()
            },
            rollout: RolloutConfig {
                temperature: 0.9,
                ..RolloutConfig::default()
            },
            max_new_tokens: 64,
            max_length: 512,
            missing_eos_penalty: None,
            beta: BetaSchedule::One(0.1),
            loss_type: DpoLossType::Sigmoid,
            label_smoothing: 0.0,
            disable_dropout: true,
            reward_model_path: None,
        }
    }
}

impl TrainerConfig for OnlineDpoConfig {
    shared_args!();

    fn validate_own(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.rollout.multi_turn() {
            return bad(
                "[[tools]] and [environment] work with the policy-gradient trainers (rlft grpo, \
                 rloo, ppo), not with Online DPO yet; remove them or train with rlft grpo"
                    .into(),
            );
        }
        if self.max_new_tokens == 0 {
            return bad("max_new_tokens must be at least 1".into());
        }
        if self.max_length <= self.max_new_tokens {
            return bad(format!(
                "max_length ({}) must exceed max_new_tokens ({}): the prompt gets the \
                 difference; raise max_length (e.g. to {})",
                self.max_length,
                self.max_new_tokens,
                self.max_new_tokens + 512
            ));
        }
        let betas = self.beta.values();
        if betas.is_empty() || betas.iter().any(|b| !(b.is_finite() && *b > 0.0)) {
            return bad(format!(
                "beta must be a positive number or a non-empty list of them (got {betas:?})"
            ));
        }
        // IPO takes the plain sums here, as TRL's OnlineDPOTrainer does; these two need lengths.
        if matches!(self.loss_type, DpoLossType::Sft | DpoLossType::SigmoidNorm) {
            return bad(format!(
                "loss_type \"{}\" needs completion lengths that Online DPO does not pass; use \
                 \"sigmoid\" or \"ipo\"",
                self.loss_type.as_str()
            ));
        }
        if !(0.0..0.5).contains(&self.label_smoothing) {
            return bad(format!(
                "label_smoothing must be in [0, 0.5) (got {})",
                self.label_smoothing
            ));
        }
        if let Some(p) = self.missing_eos_penalty {
            if !(p.is_finite() && p >= 0.0) {
                return bad(format!(
                    "missing_eos_penalty must be a non-negative number (got {p})"
                ));
            }
        }
        // The rollout, sampling and reward settings are checked where they live.
        self.online().validate_own()
    }
}

impl OnlineDpoConfig {
    /// The DPO loss of epoch `epoch`.
    pub fn loss(&self, epoch: f64) -> DpoLossConfig {
        DpoLossConfig {
            beta: self.beta.at(epoch),
            losses: vec![(self.loss_type, 1.0)],
            label_smoothing: self.label_smoothing,
            ..DpoLossConfig::default()
        }
    }

    /// `rewards`, then the reward model of `reward_model_path`.
    pub fn all_rewards(&self) -> Vec<RewardSpec> {
        let mut all = self.rollout.rewards.clone();
        if let Some(path) = &self.reward_model_path {
            let mut rm = RewardSpec::new(RewardKind::Model(ModelSpec {
                path: path.clone(),
                base: None,
                batch_size: 8,
                max_length: 0,
            }));
            rm.name = Some("reward_model".into());
            all.push(rm);
        }
        all
    }

    /// The online trainers' view of this config: its rollout settings as they are (with the
    /// reward model of `reward_model_path` added), two completions per prompt, one optimiser
    /// step per rollout, the reference pass on (`beta > 0`), the missing-EOS penalty on the
    /// reward. Prompt loading, sampling, scoring, the reference and eval read it.
    pub fn online(&self) -> OnlineConfig {
        let mut args = self.args.clone();
        args.per_device_train_batch_size *= 2;
        let d = OnlineConfig::default();
        OnlineConfig {
            args,
            rollout: RolloutConfig {
                rewards: self.all_rewards(),
                ..self.rollout.clone()
            },
            max_prompt_length: self.max_length.saturating_sub(self.max_new_tokens),
            prompt_truncation: LengthPolicy::Truncate,
            max_completion_length: self.max_new_tokens,
            num_generations: 2,
            generation_batch_size: 0,
            beta: self.beta.values().into_iter().fold(0.0, f64::max),
            estimator: EstimatorSettings {
                missing_eos_penalty: self.missing_eos_penalty,
                ..EstimatorSettings::default()
            },
            ..d
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<OnlineDpoConfig, ConfigError> {
        crate::config::tests::parse_online(extra)
    }

    #[test]
    fn trl_defaults_and_the_online_view() {
        let c = parse("per_device_train_batch_size = 3").unwrap();
        assert_eq!(c.args.learning_rate, 5e-7);
        // The flattened rollout section keeps this command's defaults, not RolloutConfig's.
        assert_eq!(c.rollout.temperature, 0.9);
        assert_eq!((c.max_new_tokens, c.max_length), (64, 512));
        assert_eq!(c.loss_type, DpoLossType::Sigmoid);
        let o = c.online();
        assert_eq!(
            (o.num_generations, o.args.per_device_train_batch_size),
            (2, 6)
        );
        assert_eq!((o.max_prompt_length, o.max_completion_length), (448, 64));
        assert_eq!(o.plan(12).steps_per_rollout, 1);
        assert!(o.beta > 0.0);
    }

    #[test]
    fn beta_is_a_number_or_a_list_per_epoch() {
        let c = parse("beta = [0.5, 0.2]").unwrap();
        assert_eq!(
            (c.beta.at(0.0), c.beta.at(1.5), c.beta.at(7.0)),
            (0.5, 0.2, 0.2)
        );
        assert_eq!(c.loss(1.0).beta, 0.2);
        assert_eq!(parse("beta = 0.3").unwrap().beta.at(4.0), 0.3);
    }

    #[test]
    fn bad_values_say_what_to_change() {
        let e = |s: &str| parse(s).unwrap_err().to_string();
        assert!(e("beta = 0.0").contains("beta must be a positive"));
        assert!(e("beta = []").contains("non-empty list"));
        assert!(e("max_length = 64").contains("raise max_length"));
        assert!(e("loss_type = \"nope\"").contains("loss_type"));
        assert!(e("loss_type = \"sft\"").contains("needs completion lengths"));
        assert!(e("num_generations = 4").contains("unknown key `num_generations`"));
        assert!(e("missing_eos_penalty = -1.0").contains("non-negative"));
    }

    #[test]
    fn reward_model_path_adds_a_model_reward_last() {
        let c = parse("reward_model_path = \"rm/final\"").unwrap();
        let r = c.online().rollout.rewards;
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].display_name(), "reward_model");
        match &r[1].kind {
            RewardKind::Model(m) => {
                assert_eq!((m.path.as_str(), m.base.as_ref()), ("rm/final", None))
            }
            k => panic!("not a model reward: {k:?}"),
        }
        // Alone, it is the ranking reward.
        let t: toml::Table = "dataset = \"d.jsonl\"\nreward_model_path = \"rm\""
            .parse()
            .unwrap();
        let c = OnlineDpoConfig::from_table(t, "test.toml").unwrap();
        assert_eq!(c.online().rollout.rewards.len(), 1);
    }
}
