//! Group-relative advantages: GRPO (DeepSeekMath, arXiv:2402.03300) replaces PPO's value network
//! by the other completions of the same prompt. Each prompt is sampled `G` times (a *group*); a
//! completion's advantage is its reward minus the group's mean reward, optionally divided by a
//! standard deviation:
//!
//! ```text
//! A_i = (r_i - mean_g(r)) / (std + epsilon)      std: of the group, of the batch, or none
//! ```
//!
//! This is TRL's `GRPOTrainer._generate_and_score_completions` (`multi_objective_aggregation =
//! "sum_then_normalize"`, `scale_rewards`), with LightRFT/verl's optional clamp of `|A|`. The one
//! advantage is shared by every token of its completion. Rewards here are already the weighted
//! sum over reward functions, and finite: what to do with unscorable completions (TRL's NaN
//! rewards) is decided before this function.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::UnknownVariant;
use crate::config::ConfigError;

/// A standard deviation at or below this counts as zero for [`Advantages::frac_zero_std`]
/// (`torch.isclose(std, 0)` with its default `atol = 1e-8`).
pub const ZERO_STD_ATOL: f64 = 1e-8;

/// How the centred rewards are scaled (TRL's `scale_rewards`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleRewards {
    /// Divide by the group's unbiased std (GRPO, DeepSeekMath): every group gets unit variance,
    /// which up-weights prompts whose rewards barely differ (too easy or too hard ones).
    #[default]
    Group,
    /// Divide by the unbiased std of the whole batch of rewards (around the batch mean), as the
    /// Lite PPO paper ("Tricks or Traps? A Deep Dive into RL for LLM Reasoning", 2025) recommends:
    /// keeps the scale bounded without the per-question difficulty bias.
    Batch,
    /// No scaling, only the group mean is subtracted (Dr. GRPO, "Understanding R1-Zero-Like
    /// Training", arXiv:2503.20783: dividing by the std adds a question-difficulty bias).
    None,
}

impl ScaleRewards {
    /// The config names, in declaration order.
    pub const NAMES: &'static [&'static str] = &["group", "batch", "none"];

    /// The config name (`"group"`, `"batch"`, `"none"`).
    pub fn as_str(self) -> &'static str {
        match self {
            ScaleRewards::Group => "group",
            ScaleRewards::Batch => "batch",
            ScaleRewards::None => "none",
        }
    }
}

impl fmt::Display for ScaleRewards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ScaleRewards {
    type Err = UnknownVariant;

    /// Parses `"group"`, `"batch"` or `"none"` (case-insensitive, surrounding spaces ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "group" => Ok(ScaleRewards::Group),
            "batch" => Ok(ScaleRewards::Batch),
            "none" => Ok(ScaleRewards::None),
            _ => Err(UnknownVariant::new("scale_rewards", s, Self::NAMES)),
        }
    }
}

/// Advantage settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdvantageConfig {
    /// Which std divides the centred rewards (TRL `scale_rewards`, default `"group"`).
    pub scale: ScaleRewards,
    /// Added to the std before dividing, so identical rewards give 0 rather than 0/0. TRL uses
    /// `1e-4` (the default here), LightRFT's seed config `1e-9`. Ignored by [`ScaleRewards::None`].
    pub epsilon: f64,
    /// Clamp every advantage to `[-clamp, clamp]` after scaling (LightRFT / verl style); `None`
    /// (TRL) leaves them as they are. A group-standardised value is at most `(G - 1) / sqrt(G)`
    /// in size, so with group scaling this only bites for large groups or tiny `epsilon` corner
    /// cases; with `none` or `batch` scaling it bounds outlier rewards.
    pub clamp: Option<f64>,
}

impl Default for AdvantageConfig {
    fn default() -> Self {
        AdvantageConfig {
            scale: ScaleRewards::Group,
            epsilon: 1e-4,
            clamp: None,
        }
    }
}

impl AdvantageConfig {
    /// Checks `epsilon >= 0` and `clamp > 0`, both finite (`clamp` may be `+inf`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.epsilon.is_finite() && self.epsilon >= 0.0) {
            return Err(ConfigError::Invalid(format!(
                "advantage epsilon = {} must be finite and >= 0 (TRL uses 1e-4)",
                self.epsilon
            )));
        }
        if let Some(c) = self.clamp {
            if c.is_nan() || c <= 0.0 {
                return Err(ConfigError::Invalid(format!(
                    "advantage clamp = {c} must be > 0 (e.g. 10), or unset for no clamp"
                )));
            }
        }
        Ok(())
    }
}

/// Advantages and the group statistics they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Advantages {
    /// One advantage per completion, `[num_groups * group_size]`, in the order of the rewards.
    pub values: Vec<f64>,
    /// Mean reward of each group, `[num_groups]`.
    pub group_mean: Vec<f64>,
    /// Unbiased (Bessel-corrected) reward std of each group, `[num_groups]`, whatever the
    /// scaling; 0 for groups of one completion (see [`unbiased_std`]).
    pub group_std: Vec<f64>,
    /// Fraction of groups whose std is ~0 (at most [`ZERO_STD_ATOL`]): groups that carry no
    /// learning signal because all their completions scored the same. 0 for an empty batch.
    /// TRL logs this as `frac_reward_zero_std`; under `scale_rewards = "batch"` TRL tests the
    /// batch std instead (all or nothing), here it is always the per-group fraction.
    pub frac_zero_std: f64,
}

/// Mean of `xs`; 0 for an empty slice.
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Unbiased standard deviation `sqrt(sum (x - mean)^2 / (n - 1))` of `xs` around `mean`.
///
/// For `n < 2` the Bessel correction is 0/0 and PyTorch's `std` (TRL's `nanstd`) returns NaN;
/// here it is defined as 0, which is also what TRL's trainer uses when `num_generations == 1`
/// (it bypasses `nanstd` and takes zeros): one sample has no spread, its centred reward is 0.
pub fn unbiased_std(xs: &[f64], mean: f64) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let ss: f64 = xs.iter().map(|x| (x - mean) * (x - mean)).sum();
    (ss / (xs.len() - 1) as f64).sqrt()
}

/// Group-relative advantages of `rewards`.
///
/// - `rewards`: `[num_groups * group_size]`, the completions of one prompt contiguous (group
///   `g` is `rewards[g * group_size..(g + 1) * group_size]`), finite.
/// - returns [`Advantages`] with `values: [num_groups * group_size]`.
///
/// `values[i] = (r_i - group_mean) / (s + epsilon)` with `s` the group's unbiased std
/// ([`ScaleRewards::Group`]) or the unbiased std of all rewards around their overall mean
/// ([`ScaleRewards::Batch`]); `values[i] = r_i - group_mean` for [`ScaleRewards::None`]; then
/// clamped to `[-clamp, clamp]` when `cfg.clamp` is set. Never NaN for finite rewards.
///
/// # Panics
/// If `group_size == 0`, if `rewards.len()` is not a multiple of `group_size`, or if `cfg` does
/// not pass [`AdvantageConfig::validate`] (configs are validated when they are loaded).
pub fn compute_advantages(rewards: &[f64], group_size: usize, cfg: &AdvantageConfig) -> Advantages {
    assert!(group_size > 0, "group_size (num_generations) must be >= 1");
    assert!(
        rewards.len().is_multiple_of(group_size),
        "{} rewards do not split into groups of {group_size}",
        rewards.len()
    );
    if let Err(e) = cfg.validate() {
        panic!("{e}");
    }
    let group_mean: Vec<f64> = rewards.chunks(group_size).map(mean).collect();
    let group_std: Vec<f64> = rewards
        .chunks(group_size)
        .zip(&group_mean)
        .map(|(g, &m)| unbiased_std(g, m))
        .collect();
    let batch_std = match cfg.scale {
        ScaleRewards::Batch => unbiased_std(rewards, mean(rewards)),
        ScaleRewards::Group | ScaleRewards::None => 0.0,
    };
    let values = rewards
        .iter()
        .enumerate()
        .map(|(i, &r)| {
            let g = i / group_size;
            let centred = r - group_mean[g];
            let a = match cfg.scale {
                ScaleRewards::Group => centred / (group_std[g] + cfg.epsilon),
                ScaleRewards::Batch => centred / (batch_std + cfg.epsilon),
                ScaleRewards::None => centred,
            };
            clamp_advantage(a, cfg.clamp)
        })
        .collect();
    let zero = group_std.iter().filter(|&&s| s <= ZERO_STD_ATOL).count();
    let frac_zero_std = if group_std.is_empty() {
        0.0
    } else {
        zero as f64 / group_std.len() as f64
    };
    Advantages {
        values,
        group_mean,
        group_std,
        frac_zero_std,
    }
}

/// `a` clamped to `[-c, c]` when `clamp = Some(c)`.
pub fn clamp_advantage(a: f64, clamp: Option<f64>) -> f64 {
    match clamp {
        Some(c) => a.clamp(-c, c),
        None => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(scale: ScaleRewards) -> AdvantageConfig {
        AdvantageConfig {
            scale,
            ..Default::default()
        }
    }

    #[test]
    fn group_scaling_standardises_each_group() {
        let r = [1.0, 0.0, 0.0, 1.0, 3.0, 3.0, 3.0, 3.0];
        let a = compute_advantages(&r, 4, &cfg(ScaleRewards::Group));
        let s = (1.0f64 / 3.0).sqrt(); // unbiased std of [1, 0, 0, 1]
        let want = 0.5 / (s + 1e-4);
        for (v, w) in a.values[..4].iter().zip([want, -want, -want, want]) {
            assert!((v - w).abs() < 1e-12, "{v} vs {w}");
        }
        assert_eq!(&a.values[4..], &[0.0; 4]);
        assert_eq!(a.group_mean, vec![0.5, 3.0]);
        assert_eq!(a.frac_zero_std, 0.5);
    }

    #[test]
    fn batch_scaling_divides_by_the_std_of_all_rewards() {
        let r = [1.0, 0.0, 5.0, 7.0];
        let a = compute_advantages(&r, 2, &cfg(ScaleRewards::Batch));
        let s = unbiased_std(&r, mean(&r));
        assert!((a.values[0] - 0.5 / (s + 1e-4)).abs() < 1e-12);
        assert!((a.values[3] - 1.0 / (s + 1e-4)).abs() < 1e-12);
        // frac_zero_std still counts groups.
        assert_eq!(a.frac_zero_std, 0.0);
    }

    #[test]
    fn none_only_centres_and_clamp_bounds() {
        let r = [0.0, 30.0, 10.0, 10.0];
        let a = compute_advantages(&r, 2, &cfg(ScaleRewards::None));
        assert_eq!(a.values, vec![-15.0, 15.0, 0.0, 0.0]);
        let c = AdvantageConfig {
            scale: ScaleRewards::None,
            epsilon: 1e-9,
            clamp: Some(10.0),
        };
        assert_eq!(
            compute_advantages(&r, 2, &c).values,
            vec![-10.0, 10.0, 0.0, 0.0]
        );
    }

    #[test]
    fn groups_of_one_give_zero_not_nan() {
        for scale in [ScaleRewards::Group, ScaleRewards::Batch, ScaleRewards::None] {
            let a = compute_advantages(&[1.0, 2.0, 5.0], 1, &cfg(scale));
            assert_eq!(a.values, vec![0.0; 3], "{scale}");
            assert_eq!(a.group_std, vec![0.0; 3]);
            assert_eq!(a.frac_zero_std, 1.0);
        }
        // A batch of one reward: batch std 0, advantage 0.
        let a = compute_advantages(&[4.0], 1, &cfg(ScaleRewards::Batch));
        assert_eq!(a.values, vec![0.0]);
        let a = compute_advantages(&[], 4, &cfg(ScaleRewards::Group));
        assert!(a.values.is_empty() && a.frac_zero_std == 0.0);
    }

    #[test]
    #[should_panic(expected = "do not split into groups of 4")]
    fn ragged_batch_panics() {
        compute_advantages(&[1.0; 6], 4, &AdvantageConfig::default());
    }

    #[test]
    fn names_parse_and_serialise() {
        for s in [ScaleRewards::Group, ScaleRewards::Batch, ScaleRewards::None] {
            assert_eq!(s.as_str().parse::<ScaleRewards>().unwrap(), s);
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{s}\""));
            assert_eq!(serde_json::from_str::<ScaleRewards>(&json).unwrap(), s);
        }
        assert_eq!(" Batch ".parse::<ScaleRewards>(), Ok(ScaleRewards::Batch));
        let e = "grup".parse::<ScaleRewards>().unwrap_err().to_string();
        assert!(
            e.contains("unknown scale_rewards `grup`")
                && e.contains("did you mean `group`?")
                && e.contains("group, batch, none"),
            "{e}"
        );
    }

    #[test]
    fn validate_rejects_bad_values() {
        assert!(AdvantageConfig::default().validate().is_ok());
        let bad = |epsilon, clamp| {
            AdvantageConfig {
                scale: ScaleRewards::Group,
                epsilon,
                clamp,
            }
            .validate()
            .is_err()
        };
        assert!(bad(-1e-4, None));
        assert!(bad(f64::NAN, None));
        assert!(bad(1e-4, Some(0.0)));
        assert!(bad(1e-4, Some(f64::NAN)));
        assert!(!bad(1e-9, Some(f64::INFINITY)));
    }
}
