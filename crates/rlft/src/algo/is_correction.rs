//! Importance-sampling correction of rollouts sampled elsewhere (TRL 1.16's
//! `vllm_importance_sampling_correction`, `trl/trainer/grpo_trainer.py:2660-2709`; its metrics
//! :2860-2896). The server that sampled a completion and the trainer give its tokens slightly
//! different log-probs (other kernels, quantisation, an adapter one step behind); the policy
//! loss of each token is weighted by the trainer/sampler probability ratio, truncated or masked.
//!
//! With `old` the trainer's (no-grad) log-probs and `samp` the sampler's, per completion `i`
//! and token `t`, `m` the completion mask:
//!
//! ```text
//! d_it = (old_it - samp_it) * m_it            (NaN -> 0: a token the server did not score)
//! rho  = exp(d_it)                            token_* modes, one per token
//!      = exp(sum_t d_it)                      sequence_* modes, one per completion
//! *_truncate: rho = clamp(rho, C_min, C_max)
//! *_mask:     rho = 0 where rho < C_min or rho > C_max
//! ```
//!
//! and the per-token policy loss (before the KL term is added) is multiplied by `rho`
//! (`grpo_trainer.py:3146-3147`). Shapes: `old` and `samp` hold one `Vec` per completion, of
//! its length (`[N][T_i]`); the weights come back the same shape.

use super::config_names;
use serde::{Deserialize, Serialize};

/// How the ratios are formed and bounded (TRL `vllm_importance_sampling_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsMode {
    /// Per-token ratios clipped to [C_min, C_max].
    TokenTruncate,
    /// Per-token ratios outside [C_min, C_max] set to 0.
    TokenMask,
    /// One ratio per completion (the product of its tokens'), clipped.
    SequenceTruncate,
    /// One ratio per completion, 0 outside the bounds (TRL's default).
    #[default]
    SequenceMask,
}

config_names!(IsMode, "rollout_is_mode", {
    TokenTruncate => "token_truncate",
    TokenMask => "token_mask",
    SequenceTruncate => "sequence_truncate",
    SequenceMask => "sequence_mask",
});

impl IsMode {
    fn sequence(self) -> bool {
        matches!(self, IsMode::SequenceTruncate | IsMode::SequenceMask)
    }

    fn truncate(self) -> bool {
        matches!(self, IsMode::TokenTruncate | IsMode::SequenceTruncate)
    }
}

/// The correction's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IsCorrection {
    /// Token or sequence ratios, truncated or masked.
    pub mode: IsMode,
    /// C_min (None = no lower bound).
    pub clip_min: Option<f64>,
    /// C_max (`f64::INFINITY` = no upper bound, TRL's `None`).
    pub clip_max: f64,
}

impl IsCorrection {
    /// TRL's checks (`grpo_config.py:1152-1171`): C_min < C_max, and a truncating mode needs a
    /// bound.
    pub fn check(&self) -> Result<(), String> {
        if let Some(lo) = self.clip_min {
            if lo.is_nan() || lo >= self.clip_max {
                return Err(format!(
                    "rollout_is_threshold_lower ({lo}) must be less than \
                     rollout_is_threshold ({})",
                    self.clip_max
                ));
            }
        }
        if self.clip_max.is_nan() || self.clip_max <= 0.0 {
            return Err(format!(
                "rollout_is_threshold must be > 0 (got {}); use inf for no bound",
                self.clip_max
            ));
        }
        if self.mode.truncate() && self.clip_min.is_none() && self.clip_max.is_infinite() {
            return Err(format!(
                "rollout_is_mode = \"{}\" needs a bound: set \
                 rollout_is_threshold or rollout_is_threshold_lower",
                self.mode
            ));
        }
        Ok(())
    }
}

/// What a rollout's correction reports (TRL's `sampling/*` metrics).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct IsStats {
    /// Smallest ratio (over counted tokens, or over completions in sequence modes).
    pub ratio_min: f64,
    /// Mean ratio.
    pub ratio_mean: f64,
    /// Largest ratio.
    pub ratio_max: f64,
    /// Mean `|old - samp|` over counted tokens the server scored.
    pub logp_diff_mean: f64,
    /// Largest `|old - samp|`.
    pub logp_diff_max: f64,
}

impl IsStats {
    /// The metrics with TRL's names.
    pub fn metrics(&self) -> Vec<(String, f64)> {
        [
            (
                "sampling/sampling_logp_difference/mean",
                self.logp_diff_mean,
            ),
            ("sampling/sampling_logp_difference/max", self.logp_diff_max),
            ("sampling/importance_sampling_ratio/min", self.ratio_min),
            ("sampling/importance_sampling_ratio/mean", self.ratio_mean),
            ("sampling/importance_sampling_ratio/max", self.ratio_max),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// The per-token weights `[N][T_i]` (sequence modes: the completion's ratio on each token) and
/// the stats. `keep[i] == false` masks completion `i` (e.g. truncated under
/// `mask_truncated_completions`): its ratio is 1 and it is not counted, as TRL's zeroed mask
/// does. Panics when the three inputs disagree in length (a bug upstream, not data).
pub fn is_weights(
    old: &[Vec<f32>],
    samp: &[Vec<f32>],
    keep: &[bool],
    c: &IsCorrection,
) -> (Vec<Vec<f32>>, IsStats) {
    assert!(old.len() == samp.len() && old.len() == keep.len());
    let lo = c.clip_min.unwrap_or(f64::NEG_INFINITY);
    let hi = c.clip_max;
    let bound = |r: f64| {
        if c.mode.truncate() {
            r.clamp(lo.min(hi), hi)
        } else if r < lo || r > hi {
            0.0
        } else {
            r
        }
    };
    let (mut ratios, mut diffs) = (Vec::new(), Vec::new());
    let mut weights = Vec::with_capacity(old.len());
    for ((o, s), &k) in old.iter().zip(samp).zip(keep) {
        assert_eq!(
            o.len(),
            s.len(),
            "old and sampler log-probs differ in length"
        );
        let d: Vec<f64> = o
            .iter()
            .zip(s)
            .map(|(&a, &b)| {
                let x = if k { a as f64 - b as f64 } else { 0.0 };
                if x.is_nan() {
                    0.0
                } else {
                    x
                }
            })
            .collect();
        if k {
            let abs = o.iter().zip(s).map(|(&a, &b)| (a as f64 - b as f64).abs());
            diffs.extend(abs.filter(|x| !x.is_nan()));
        }
        if c.mode.sequence() {
            let r = bound(d.iter().sum::<f64>().exp());
            ratios.push(r);
            weights.push(vec![r as f32; o.len()]);
        } else {
            let w: Vec<f64> = d.iter().map(|x| bound(x.exp())).collect();
            if k {
                ratios.extend(&w);
            }
            weights.push(w.into_iter().map(|x| x as f32).collect());
        }
    }
    let (min, mean, max) = summary(&ratios);
    let (_, dmean, dmax) = summary(&diffs);
    let stats = IsStats {
        ratio_min: min,
        ratio_mean: mean,
        ratio_max: max,
        logp_diff_mean: dmean,
        logp_diff_max: dmax,
    };
    (weights, stats)
}

/// `(min, mean, max)`, zeros when empty (TRL logs 0 then).
fn summary(v: &[f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, v.iter().sum::<f64>() / v.len() as f64, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_by_hand() {
        let old = vec![vec![-1.0f32, -2.0], vec![-0.5]];
        let samp = vec![vec![-1.5f32, -1.0], vec![-0.5]];
        let keep = [true, true];
        let c = |mode, clip_min, clip_max| IsCorrection {
            mode,
            clip_min,
            clip_max,
        };
        // Token truncate: exp(0.5), exp(-1) clipped below at 0.5.
        let (w, s) = is_weights(
            &old,
            &samp,
            &keep,
            &c(IsMode::TokenTruncate, Some(0.5), 3.0),
        );
        assert!((w[0][0] as f64 - 0.5f64.exp()).abs() < 1e-6);
        assert_eq!(w[0][1], 0.5);
        assert_eq!(w[1][0], 1.0);
        assert!((s.logp_diff_max - 1.0).abs() < 1e-9 && (s.logp_diff_mean - 0.5).abs() < 1e-9);
        // Token mask with C_max = 1.5: exp(0.5) = 1.65 masked.
        let (w, _) = is_weights(&old, &samp, &keep, &c(IsMode::TokenMask, None, 1.5));
        assert_eq!(w[0][0], 0.0);
        // Sequence: exp(0.5 - 1) = 0.61 on both tokens.
        let (w, s) = is_weights(&old, &samp, &keep, &c(IsMode::SequenceMask, None, 3.0));
        assert!((w[0][1] as f64 - (-0.5f64).exp()).abs() < 1e-6);
        assert_eq!((s.ratio_max, s.ratio_min), (1.0, (-0.5f64).exp()));
        // A dropped row counts as ratio 1 in sequence modes, not at all in token modes.
        let (w, s) = is_weights(
            &old,
            &samp,
            &[false, true],
            &c(IsMode::TokenMask, None, 3.0),
        );
        assert_eq!((w[0][0], s.ratio_mean), (1.0, 1.0));
    }
}
