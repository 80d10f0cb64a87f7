//! The pure maths of the online family: advantages from rewards (GRPO's group-relative ones and
//! the other estimators in [`estimators`]), the clipped policy losses and PPO's value loss.
//!
//! No model, no sampling, no I/O: functions of numbers (advantages, on `f64` slices) and of
//! tensors (the loss, on candle tensors, differentiable with respect to the policy log-probs).
//! The formulas follow TRL's `GRPOTrainer` (`_generate_and_score_completions` for the
//! advantages, `_compute_loss` for the loss) and verl / LightRFT, and are pinned to a PyTorch
//! transcription of TRL by `tests/grpo_golden.rs` (`scripts/reference/grpo_loss_golden.py`).
//!
//! - [`advantage`]: group-relative advantages, `A_i = (r_i - mean(group)) / (std + eps)` with the
//!   scaling chosen by [`ScaleRewards`] (GRPO, DeepSeekMath; Dr. GRPO drops the std).
//!   Several reward functions are combined as [`MultiObjectiveAggregation`] says (TRL 1.16's
//!   `sum_then_normalize`, or GDPO's `normalize_then_sum`); a completion no function could
//!   score (every function answered `None`) gets advantage 0 and stays out of the statistics.
//! - [`loss`]: TRL 1.16's policy loss: a ratio per token or per completion
//!   ([`ImportanceSamplingLevel`], GSPO), PPO's clipped surrogate (with `delta`'s two-sided
//!   clip), CISPO or SAPO ([`LossType`]), the high-entropy token mask ([`entropy_mask`]), an
//!   optional k3 KL penalty (with the ratio's bias correction), aggregated over tokens as
//!   [`LossType`] says (GRPO, BNPO, Dr. GRPO, DAPO); its settings in [`loss_config`].
//! - [`loop_ref`]: the same computations as plain scalar loops in `f64`, with the analytic
//!   gradient of the loss; the tests check the vectorised code against it.
//! - [`reward`]: the Bradley-Terry loss of reward models with TRL's margin and centring terms,
//!   and the statistics TRL logs of preference pairs.
//! - [`dpo_loss`]: DPO and TRL's other offline preference losses (IPO, hinge, robust, APO...)
//!   over summed completion log-probs of the policy and the reference.
//!
//! Papers:
//! - GRPO: Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
//!   Language Models" (2024), arXiv:2402.03300.
//! - Dr. GRPO: Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective" (2025),
//!   arXiv:2503.20783.
//! - DAPO: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (2025),
//!   arXiv:2503.14476 (token-level loss, asymmetric "clip-higher").
//! - BNPO: Xiao et al., "BNPO: Beta Normalization Policy Optimization" (2025), arXiv:2506.02864
//!   (TRL's `bnpo` is its batch-token normalisation, without the Beta-distribution weighting).
//! - GSPO: Zheng et al., "Group Sequence Policy Optimization" (2025), arXiv:2507.18071.
//! - CISPO: MiniMax, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
//!   Attention" (2025), arXiv:2506.13585; its `eps_max` from ScaleRL, arXiv:2510.13786.
//! - SAPO: Gao et al., "Soft Adaptive Policy Optimization" (2025), arXiv:2511.20347.
//! - Two-sided clipping (`delta`): Prime Intellect, "INTELLECT-2" (2025), arXiv:2505.07291.
//! - High-entropy tokens: Wang et al., "Beyond the 80/20 Rule" (2025), arXiv:2506.01939.
//! - GDPO (`normalize_then_sum`): arXiv:2601.05242.
//! - KL bias correction: DeepSeek-AI, "DeepSeek-V3.2" (2025), arXiv:2512.02556.
//! - The k3 KL estimator: J. Schulman, "Approximating KL Divergence" (2020), as used by GRPO.

pub mod advantage;
pub mod dpo_loss;
pub mod entropy_mask;
pub mod estimators;
pub mod is_correction;
pub mod loop_ref;
pub mod loss;
pub mod loss_config;
pub mod reward;
pub mod rloo_loss;
pub mod value_loss;

pub use advantage::{
    compute_advantages, multi_reward_advantages, AdvantageConfig, Advantages, GroupedRewards,
    MultiObjectiveAggregation, ScaleRewards,
};
pub use estimators::{
    estimate, Estimate, Estimator, EstimatorConfig, EstimatorInputs, KlEstimator,
};
pub use loss::{
    grpo_loss, masked_mean_per_row, ClipStats, LossInputs, LossNormalizer, LossOutput, LossStats,
    MicroBatchSize,
};
pub use loss_config::{ImportanceSamplingLevel, LossConfig, LossType};

/// The config names of an enum's variants, in declaration order, and what follows from them:
/// `NAMES`, `ALL`, `as_str`, `Display`, and a `FromStr` that ignores case and surrounding
/// spaces and whose error ([`UnknownVariant`]) names config key `$key`, the valid values and
/// the closest one. The serde names (`rename_all = "snake_case"`) are the same strings.
macro_rules! config_names {
    ($ty:ident, $key:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// The config names, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($name),+];
            /// Every variant, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The config name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::algo::UnknownVariant;

            fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
                let lower = s.trim().to_ascii_lowercase();
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == lower)
                    .ok_or_else(|| $crate::algo::UnknownVariant::new($key, s, Self::NAMES))
            }
        }
    };
}
pub(crate) use config_names;

/// A variant name (`scale_rewards`, `loss_type`) that is not one of the valid ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {key} `{value}`{hint}; valid values: {valid}")]
pub struct UnknownVariant {
    /// The config key, e.g. `loss_type`.
    pub key: &'static str,
    /// The value as written.
    pub value: String,
    /// ", did you mean `x`?" when a valid value is close.
    pub hint: String,
    /// The valid values, comma separated.
    pub valid: String,
}

impl UnknownVariant {
    /// The error for `value` given the valid `names` of config key `key`.
    pub fn new(key: &'static str, value: &str, names: &[&str]) -> Self {
        let lower = value.trim().to_ascii_lowercase();
        let hint = rlft_suggest::closest(&lower, names)
            .map(|c| format!(", did you mean `{c}`?"))
            .unwrap_or_default();
        UnknownVariant {
            key,
            value: value.to_string(),
            hint,
            valid: names.join(", "),
        }
    }
}
