//! The online family's settings beyond the policy loss: which advantage estimator, where the KL
//! goes, PPO's critic, dynamic sampling (flat keys of [`super::OnlineConfig`]), and the aliases
//! TRL's PPO and OpenRLHF use for them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::OnlineConfig;
use crate::algo::{Estimator, EstimatorConfig, KlEstimator, LossType};
use crate::config::ConfigError;

/// The estimator settings (flat keys of an online config).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct EstimatorSettings {
    /// Where advantages come from: `group_norm` (GRPO), `rloo`, `reinforce` (REINFORCE++),
    /// `reinforce_baseline`, `gae` (PPO with a critic). See `docs/online-rl.md`.
    pub advantage_estimator: Estimator,
    /// The per-token KL estimate when the KL enters the reward (every estimator but
    /// `group_norm`; RLOO always uses TRL's first-order `logp - ref`): `k1`, `k2`, `k3`.
    pub kl_estimator: KlEstimator,
    /// Discount of the per-token returns (`reinforce`, `gae`); 1.0 for the group estimators.
    pub gamma: f64,
    /// GAE's lambda (`gae`; LightRFT/OpenRLHF `lambd`).
    pub lam: f64,
    /// RLOO: standardise the advantages over the rollout (TRL `normalize_advantages`).
    pub normalize_advantages: bool,
    /// `[low, high]`: clamp each completion's summed reward first (TRL `reward_clip_range`).
    pub reward_clip_range: Option<[f64; 2]>,
    /// Subtracted from the reward of a completion that hit `max_completion_length` without an
    /// end token (TRL `missing_eos_penalty`).
    pub missing_eos_penalty: Option<f64>,
    /// PPO: whiten the per-token rewards before GAE (TRL `whiten_rewards`).
    pub whiten_rewards: bool,
    /// PPO: weight of the value loss in the total loss (TRL `vf_coef`).
    pub vf_coef: f64,
    /// PPO: the critic's values move at most this far from their rollout values before the
    /// clipped loss takes over (TRL `cliprange_value`).
    pub cliprange_value: f64,
    /// PPO: the critic's initial weights: a causal LM (a path or a built-in name such as
    /// `qwen2.5-coder-0.5b`) or a `*ForSequenceClassification` HF directory (a trained reward
    /// model). `rlft ppo` defaults it to `model`.
    pub value_model: Option<PathBuf>,
    /// DAPO's dynamic sampling: drop prompt groups whose rewards are all equal and sample more
    /// prompts until the rollout is full (verl `filter_groups`, OpenRLHF `dynamic_filtering`).
    pub dynamic_sampling: bool,
    /// Dynamic sampling: at most this many generation batches per rollout (verl
    /// `max_num_gen_batches`); the rollout is then topped up with the dropped groups.
    pub max_num_gen_batches: usize,
}

impl Default for EstimatorSettings {
    fn default() -> Self {
        EstimatorSettings {
            advantage_estimator: Estimator::GroupNorm,
            kl_estimator: KlEstimator::K1,
            gamma: 1.0,
            lam: 0.95,
            normalize_advantages: false,
            reward_clip_range: None,
            missing_eos_penalty: None,
            whiten_rewards: false,
            vf_coef: 0.1,
            cliprange_value: 0.2,
            value_model: None,
            dynamic_sampling: false,
            max_num_gen_batches: 4,
        }
    }
}

impl OnlineConfig {
    /// The estimator settings as [`crate::algo::estimate`] takes them.
    pub fn estimator_config(&self) -> EstimatorConfig {
        let e = &self.estimator;
        EstimatorConfig {
            estimator: e.advantage_estimator,
            kl_coef: self.beta,
            gamma: e.gamma,
            lam: e.lam,
            normalize_advantages: e.normalize_advantages,
            whiten_rewards: e.whiten_rewards,
        }
    }

    /// Whether the KL to the reference enters the reward rather than the loss.
    pub fn kl_in_reward(&self) -> bool {
        self.beta > 0.0 && self.estimator.advantage_estimator.kl_in_reward()
    }

    /// The checks of the estimator settings and their combinations with the rest.
    pub(super) fn check_estimator(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let e = &self.estimator;
        let est = e.advantage_estimator;
        if (est.needs_groups() || e.dynamic_sampling) && self.num_generations < 2 {
            return bad(format!(
                "{} compares the completions of a prompt, so num_generations must be >= 2 \
                 (got {}); set num_generations = 4, or use advantage_estimator = \"reinforce\" \
                 or \"gae\", which work with one completion per prompt",
                if e.dynamic_sampling {
                    "dynamic_sampling".to_string()
                } else {
                    format!("advantage_estimator = \"{est}\"")
                },
                self.num_generations
            ));
        }
        match (est, &e.value_model) {
            (Estimator::Gae, None) => {
                return bad(
                    "advantage_estimator = \"gae\" learns a value function and has no value \
                     model: set value_model = \"<path>\" (the policy's model, or a trained \
                     reward model), or run `rlft ppo`, which starts the critic from `model`"
                        .into(),
                )
            }
            (est, Some(_)) if est != Estimator::Gae => {
                return bad(format!(
                    "value_model is set but advantage_estimator = \"{est}\" has no critic; \
                     remove value_model, or set advantage_estimator = \"gae\""
                ))
            }
            _ => {}
        }
        if self.loss_type == LossType::Rloo && est == Estimator::Gae {
            return bad(
                "loss_type = \"rloo\" takes one advantage per completion, and \
                 advantage_estimator = \"gae\" gives one per token; use loss_type = \"bnpo\" \
                 (rlft ppo's) or another estimator"
                    .into(),
            );
        }
        if self.loss_type == LossType::Rloo && self.beta > 0.0 && !self.kl_in_reward() {
            return bad(format!(
                "loss_type = \"rloo\" has no KL term, and advantage_estimator = \"{est}\" puts \
                 the KL (beta = {}) into the loss; use advantage_estimator = \"rloo\" (the KL \
                 in the reward), or beta = 0, or another loss_type",
                self.beta
            ));
        }
        for (k, v) in [("gamma", e.gamma), ("lam", e.lam)] {
            if !(0.0..=1.0).contains(&v) {
                return bad(format!("{k} must be in [0, 1] (got {v})"));
            }
        }
        if let Some([lo, hi]) = e.reward_clip_range {
            if lo.partial_cmp(&hi) != Some(std::cmp::Ordering::Less) {
                return bad(format!(
                    "reward_clip_range = [{lo}, {hi}] must be [low, high] with low < high"
                ));
            }
        }
        if !(e.vf_coef >= 0.0 && e.cliprange_value > 0.0) {
            return bad(format!(
                "vf_coef must be >= 0 and cliprange_value > 0 (got {} and {})",
                e.vf_coef, e.cliprange_value
            ));
        }
        if e.dynamic_sampling && e.max_num_gen_batches == 0 {
            return bad("max_num_gen_batches must be >= 1 (e.g. 4)".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::online::tests::parse_as as parse;
    use crate::config::online::PpoConfig;

    #[test]
    fn conflicts_name_the_fix() {
        let e = parse::<OnlineConfig>("advantage_estimator = \"gae\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("value_model") && e.contains("rlft ppo"), "{e}");
        let e = parse::<OnlineConfig>("num_generations = 1\nper_device_train_batch_size = 2")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("num_generations must be >= 2") && e.contains("reinforce"),
            "{e}"
        );
        let e = parse::<OnlineConfig>("loss_type = \"rloo\"\nbeta = 0.1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no KL term"), "{e}");
        let e = parse::<PpoConfig>("loss_type = \"rloo\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("one per token"), "{e}");
        let e = parse::<OnlineConfig>("value_model = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no critic"), "{e}");
        let e = parse::<OnlineConfig>("advantage_estimator = \"rlo\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`rlo`") && e.contains("`rloo`"), "{e}");
        let e = parse::<PpoConfig>("num_generations = 1\ndynamic_sampling = true")
            .unwrap_err()
            .to_string();
        assert!(e.contains("dynamic_sampling"), "{e}");
        assert!(parse::<OnlineConfig>("reward_clip_range = [1.0, 0.0]").is_err());
    }
}
