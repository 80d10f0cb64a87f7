//! The pure maths of GRPO: advantages from rewards, and the clipped policy loss.
//!
//! No model, no sampling, no I/O: functions of numbers (advantages, on `f64` slices) and of
//! tensors (the loss, on candle tensors, differentiable with respect to the policy log-probs).
//! The formulas follow TRL's `GRPOTrainer` (`_generate_and_score_completions` for the
//! advantages, `_compute_loss` for the loss) and verl / LightRFT, and are pinned to a PyTorch
//! transcription of TRL by `tests/grpo_golden.rs` (`scripts/reference/grpo_loss_golden.py`).
//!
//! - [`advantage`]: group-relative advantages, `A_i = (r_i - mean(group)) / (std + eps)` with the
//!   scaling chosen by [`ScaleRewards`] (GRPO, DeepSeekMath; Dr. GRPO drops the std).
//! - [`loss`]: the PPO-style clipped surrogate with an optional k3 KL penalty to a reference
//!   policy, aggregated over tokens as [`LossType`] says (GRPO, BNPO, Dr. GRPO, DAPO).
//! - [`reward`]: the Bradley-Terry loss of reward models with TRL's margin and centring terms,
//!   and the statistics TRL logs of preference pairs.
//! - [`loop_ref`]: the same two computations as plain scalar loops in `f64`, with the analytic
//!   gradient of the loss; the tests check the vectorised code against it.
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
//! - The k3 KL estimator: J. Schulman, "Approximating KL Divergence" (2020), as used by GRPO.

pub mod advantage;
pub mod loop_ref;
pub mod loss;
pub mod reward;

pub use advantage::{compute_advantages, AdvantageConfig, Advantages, ScaleRewards};
pub use loss::{
    grpo_loss, masked_mean_per_row, LossConfig, LossInputs, LossNormalizer, LossOutput, LossStats,
    LossType,
};

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
