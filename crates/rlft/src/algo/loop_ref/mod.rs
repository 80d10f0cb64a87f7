//! The loop version: advantages and the GRPO loss as plain scalar loops in `f64`, with the
//! gradient of the loss derived by hand. Not used in training; it is the second, independent
//! implementation the tests hold the vectorised code ([`super::compute_advantages`],
//! [`super::multi_reward_advantages`], [`super::grpo_loss`]) against.
//!
//! Gradient of the loss with respect to `logp[i][t]`. With `W_it = d loss / d l_it` the
//! reduction weight (below), `e_it` the entropy mask (1 without one), `p` the policy term and
//! `kl` the KL term of token `(i, t)` (formulas in [`super::loss`]):
//!
//! ```text
//! l_it      = e_it p_it + beta kl_it
//! dl/dr     = e dp/dr + beta (use_bias_correction_kl ? k3 : 0)
//! dl/dlogp  = e dp/dlogp + beta (1 - exp(ref - logp)) (use_bias_correction_kl ? r : 1)
//!             (the direct part, with the ratio held fixed)
//! token     : d loss / d logp_it = W_it (dl/dlogp + dl/dr r_it)          d r_it / d logp_it = r_it
//! sequence  : d loss / d logp_it = W_it dl/dlogp + (sum_u W_iu dl_iu/dr) r_i m_it / len_i
//! ```
//!
//! with `r = exp(logp - old)` (`old` held constant; on-policy `r = 1`) or the row's `r_i`, and
//! the policy terms' derivatives:
//!
//! ```text
//! clipped (grpo, bnpo, dr_grpo, dapo): dp/dr = -A when the chosen branch of
//!     min(rd A, clip(r) A) is r itself (rd = r <= delta, or lo <= r <= hi), else 0 (a constant);
//!     A > 0 chooses the smaller coefficient, A <= 0 the larger
//! cispo: p = -min(r, eps_high) A logp with the weight detached: dp/dr = 0, dp/dlogp = -min(r, eps_high) A
//! sapo:  p = -s 4 / tau A, s = sigmoid(tau (r - 1)): dp/dr = -4 s (1 - s) A
//! ```
//!
//! and the reduction weights (`k` accumulation steps, `len_i = sum_t m_it`):
//!
//! ```text
//! grpo, sapo   : m_it / max(len_i, 1) / N / k
//! bnpo         : m_it / max(sum m, 1) / k
//! dr_grpo      : m_it / (N * max_completion_length) / k
//! dapo, cispo  : m_it / max(num_items_in_batch, 1)
//! ```
//!
//! where `N` and `sum m` are the whole micro-batch's when only some of its rows are given
//! (`LossNormalizer::micro_batch`).

mod loss;

pub use loss::{grpo_loss_loop, LoopLossInputs, LoopLossOutput};

use super::advantage::{clamp_advantage, Advantages, GroupedRewards, ZERO_STD_ATOL};
use super::{AdvantageConfig, MultiObjectiveAggregation, ScaleRewards};

/// [`super::compute_advantages`] again, one reward at a time: each reward's group mean and std
/// are recomputed from scratch with explicit loops (quadratic in the group size, on purpose).
pub fn advantages_loop(rewards: &[f64], group_size: usize, cfg: &AdvantageConfig) -> Advantages {
    assert!(group_size > 0 && rewards.len().is_multiple_of(group_size));
    let num_groups = rewards.len() / group_size;
    let stats = |lo: usize, hi: usize| -> (f64, f64) {
        let mut sum = 0.0;
        for r in &rewards[lo..hi] {
            sum += r;
        }
        let count = (hi - lo) as f64;
        let mean = if count > 0.0 { sum / count } else { 0.0 };
        let mut ss = 0.0;
        for r in &rewards[lo..hi] {
            ss += (r - mean) * (r - mean);
        }
        let std = if hi - lo > 1 {
            (ss / (count - 1.0)).sqrt()
        } else {
            0.0
        };
        (mean, std)
    };
    let mut values = Vec::with_capacity(rewards.len());
    for (i, &r) in rewards.iter().enumerate() {
        let g = i / group_size;
        let (gm, gs) = stats(g * group_size, (g + 1) * group_size);
        let a = match cfg.scale {
            ScaleRewards::Group => (r - gm) / (gs + cfg.epsilon),
            ScaleRewards::Batch => (r - gm) / (stats(0, rewards.len()).1 + cfg.epsilon),
            ScaleRewards::None => r - gm,
        };
        values.push(clamp_advantage(a, cfg.clamp));
    }
    with_group_stats(values, num_groups, |g| {
        stats(g * group_size, (g + 1) * group_size)
    })
}

/// Mean and unbiased std of the scored values among `xs`, with explicit loops: `(NaN, NaN)`
/// without any, std NaN with one (TRL's `nanmean` / `nanstd`).
fn nan_stats_loop(xs: &[Option<f64>]) -> (f64, f64) {
    let (mut sum, mut count) = (0.0, 0usize);
    for x in xs.iter().flatten() {
        sum += x;
        count += 1;
    }
    if count == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = sum / count as f64;
    let mut ss = 0.0;
    for x in xs.iter().flatten() {
        ss += (x - mean) * (x - mean);
    }
    let std = if count > 1 {
        (ss / (count - 1) as f64).sqrt()
    } else {
        f64::NAN
    };
    (mean, std)
}

/// [`super::multi_reward_advantages`] again, one completion at a time: every statistic a
/// completion needs is recomputed from the rewards with explicit loops.
#[allow(clippy::needless_range_loop)] // indices as in the formulas, on purpose
pub fn multi_reward_advantages_loop(
    rewards: GroupedRewards<'_>,
    aggregation: MultiObjectiveAggregation,
    cfg: &AdvantageConfig,
) -> Advantages {
    let (per_function, weights) = (rewards.per_function, rewards.weights);
    let group_size = rewards.group_size;
    let n = per_function[0].len();
    assert!(group_size > 0 && n.is_multiple_of(group_size));
    let num_groups = n / group_size;
    // Total of completion i: None when no function scored it.
    let total = |i: usize| -> Option<f64> {
        let mut acc = None;
        for k in 0..per_function.len() {
            if let Some(r) = per_function[k][i] {
                acc = Some(acc.unwrap_or(0.0) + weights[k] * r);
            }
        }
        acc
    };
    let group_totals = |g: usize| -> Vec<Option<f64>> {
        (g * group_size..(g + 1) * group_size).map(total).collect()
    };
    let group_stats = |g: usize| -> (f64, f64) {
        let (m, s) = nan_stats_loop(&group_totals(g));
        (m, if group_size == 1 { 0.0 } else { s })
    };
    // GDPO's per-function standardised sum of completion i (None when unscorable).
    let gdpo_sum = |i: usize| -> Option<f64> {
        total(i)?;
        let g = i / group_size;
        let mut acc = 0.0;
        for k in 0..per_function.len() {
            let rows = &per_function[k][g * group_size..(g + 1) * group_size];
            let (m, s) = nan_stats_loop(rows);
            let s = if group_size == 1 { 0.0 } else { s };
            if let Some(r) = per_function[k][i] {
                let z = (r - m) / (s + cfg.epsilon);
                if !z.is_nan() {
                    acc += weights[k] * z;
                }
            }
        }
        Some(acc)
    };
    let mut values = Vec::with_capacity(n);
    for i in 0..n {
        let g = i / group_size;
        let a = match aggregation {
            MultiObjectiveAggregation::SumThenNormalize => match total(i) {
                None => f64::NAN,
                Some(r) => {
                    let (gm, gs) = group_stats(g);
                    match cfg.scale {
                        ScaleRewards::Group => (r - gm) / (gs + cfg.epsilon),
                        ScaleRewards::Batch => {
                            let all: Vec<Option<f64>> = (0..n).map(total).collect();
                            let bs = if n > 1 { nan_stats_loop(&all).1 } else { 0.0 };
                            (r - gm) / (bs + cfg.epsilon)
                        }
                        ScaleRewards::None => r - gm,
                    }
                }
            },
            MultiObjectiveAggregation::NormalizeThenSum => match gdpo_sum(i) {
                None => f64::NAN,
                Some(s) => {
                    let all: Vec<Option<f64>> = (0..n).map(gdpo_sum).collect();
                    let (bm, bs) = nan_stats_loop(&all);
                    let bs = if n > 1 { bs } else { 0.0 };
                    (s - bm) / (bs + cfg.epsilon)
                }
            },
        };
        values.push(clamp_advantage(if a.is_nan() { 0.0 } else { a }, cfg.clamp));
    }
    with_group_stats(values, num_groups, group_stats)
}

/// [`Advantages`] of `values` with each group's `(mean, std)` from `stats`, counting the groups
/// whose std is at most [`ZERO_STD_ATOL`], one group at a time.
fn with_group_stats(
    values: Vec<f64>,
    num_groups: usize,
    stats: impl Fn(usize) -> (f64, f64),
) -> Advantages {
    let mut group_mean = Vec::with_capacity(num_groups);
    let mut group_std = Vec::with_capacity(num_groups);
    let mut zero = 0usize;
    for g in 0..num_groups {
        let (m, s) = stats(g);
        group_mean.push(m);
        group_std.push(s);
        if s <= ZERO_STD_ATOL {
            zero += 1;
        }
    }
    let frac_zero_std = if num_groups == 0 {
        0.0
    } else {
        zero as f64 / num_groups as f64
    };
    Advantages {
        values,
        group_mean,
        group_std,
        frac_zero_std,
    }
}

#[cfg(test)]
mod tests;
