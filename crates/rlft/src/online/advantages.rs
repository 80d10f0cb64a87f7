//! A rollout's advantages under the configured estimator: the reward shaping every estimator
//! shares (`reward_clip_range`, `missing_eos_penalty`), the KL to the reference where it
//! enters the reward, and the pure estimators of [`crate::algo`].

use candle_core::{Device, Tensor};

use crate::algo::estimators::token_kl;
use rlft_rewards::Scores;

use crate::algo::{
    compute_advantages, estimate, multi_reward_advantages, Estimate, Estimator, EstimatorInputs,
    GroupedRewards,
};
use crate::config::online::OnlineConfig;
use crate::error::Result;
use crate::rollout::{pad_rows, Sample};
use crate::run::Metrics;

/// Advantages of a rollout: one per completion or one per completion token.
#[derive(Debug, Clone)]
pub enum Advantage {
    /// `[N]`.
    PerSequence(Vec<f64>),
    /// `[N][len_i]`.
    PerToken(Vec<Vec<f64>>),
}

impl Advantage {
    /// The advantages of `rows` as the loss takes them: `[rows]`, or `[rows, tc]` zero-padded.
    pub fn tensor(&self, rows: &[usize], tc: usize, device: &Device) -> Result<Tensor> {
        Ok(match self {
            Advantage::PerSequence(a) => {
                let v: Vec<f32> = rows.iter().map(|&i| a[i] as f32).collect();
                Tensor::from_vec(v, rows.len(), device)?
            }
            Advantage::PerToken(a) => {
                let f: Vec<Vec<f32>> = rows
                    .iter()
                    .map(|&i| a[i].iter().map(|&x| x as f32).collect())
                    .collect();
                let refs: Vec<&[f32]> = f.iter().map(|r| &r[..]).collect();
                pad_rows(&refs, tc, device)?
            }
        })
    }

    /// `[N]`: whether each completion's advantages are all exactly 0 as the loss sees them (in
    /// f32), so that its policy term and gradient are exactly 0 (see [`super::skip`]).
    pub fn zero_rows(&self) -> Vec<bool> {
        let zero = |a: f64| a as f32 == 0.0;
        match self {
            Advantage::PerSequence(a) => a.iter().map(|&x| zero(x)).collect(),
            Advantage::PerToken(a) => a.iter().map(|r| r.iter().all(|&x| zero(x))).collect(),
        }
    }

    /// One number per completion for the sample log: the advantage, or the mean of its tokens'.
    pub fn per_completion(&self) -> Vec<f64> {
        match self {
            Advantage::PerSequence(a) => a.clone(),
            Advantage::PerToken(a) => a
                .iter()
                .map(|r| r.iter().sum::<f64>() / r.len().max(1) as f64)
                .collect(),
        }
    }
}

/// What [`estimate_rollout`] returns.
#[derive(Debug, Clone)]
pub struct Estimated {
    /// The advantages.
    pub advantages: Advantage,
    /// `[N][len_i]` returns (`gae`: the critic's targets).
    pub returns: Option<Vec<Vec<f64>>>,
    /// Reward std of each group (empty with one completion per prompt).
    pub group_std: Vec<f64>,
    /// Fraction of groups whose rewards are all equal (None with one completion per prompt).
    pub frac_zero_std: Option<f64>,
    /// Rollout metrics of the estimator (`kl` when the KL enters the reward).
    pub metrics: Metrics,
}

/// The rewards the estimators see: each completion's weighted reward, clamped to
/// `reward_clip_range` (TRL RLOO / OpenRLHF), minus `missing_eos_penalty` when the completion
/// ran out of tokens (TRL PPO).
pub fn shaped_rewards(cfg: &OnlineConfig, samples: &[Sample], total: &[f64]) -> Vec<f64> {
    let e = &cfg.estimator;
    total
        .iter()
        .zip(samples)
        .map(|(&r, s)| {
            let r = match e.reward_clip_range {
                Some([lo, hi]) => r.clamp(lo, hi),
                None => r,
            };
            match e.missing_eos_penalty {
                Some(p) if s.truncated => r - p,
                _ => r,
            }
        })
        .collect()
}

/// Each reward function's scores as the group statistics take them: with
/// `mask_truncated_rewards`, a truncated completion counts as unscored (out of its group's mean
/// and std, advantage 0).
fn baseline_scores(
    cfg: &OnlineConfig,
    samples: &[Sample],
    scores: &Scores,
) -> Vec<Vec<Option<f64>>> {
    scores
        .per_function
        .iter()
        .map(|f| {
            let scored = f.scores.iter().zip(samples);
            let kept = |(&x, sample): (&Option<f64>, &Sample)| {
                x.filter(|_| cfg.in_baseline(sample.truncated))
            };
            scored.map(kept).collect()
        })
        .collect()
}

/// The advantages of a rollout.
///
/// - `scored`: the reward functions' scores and weights; `group_norm` without reward shaping
///   reads them per function (`multi_objective_aggregation`, `None` scores as TRL's NaN);
///   every estimator gives completions that no function could score advantage 0;
/// - `rewards`: `[N]` shaped rewards ([`shaped_rewards`]), groups of `num_generations`;
/// - `old`, `reference`: `[N][len_i]` sampling-policy and reference log-probs, given when the
///   KL enters the reward (`beta > 0`, every estimator but `group_norm`);
/// - `values`: `[N][len_i]` the critic's values (`gae`).
pub fn estimate_rollout(
    cfg: &OnlineConfig,
    samples: &[Sample],
    scored: (&Scores, &[f64]),
    rewards: &[f64],
    old: Option<&[Vec<f32>]>,
    reference: Option<&[Vec<f32>]>,
    values: Option<&[Vec<f32>]>,
) -> Estimated {
    let g = cfg.num_generations;
    let est = cfg.estimator.advantage_estimator;
    let (scores, weights) = scored;
    let e = &cfg.estimator;
    let groups = if e.reward_clip_range.is_none() && e.missing_eos_penalty.is_none() {
        let per_function = baseline_scores(cfg, samples, scores);
        let per_function: Vec<&[Option<f64>]> = per_function.iter().map(|f| &f[..]).collect();
        let rewards = GroupedRewards {
            per_function: &per_function,
            weights,
            group_size: g,
        };
        multi_reward_advantages(
            rewards,
            cfg.multi_objective_aggregation,
            &cfg.advantage_config(),
        )
    } else {
        compute_advantages(rewards, g, &cfg.advantage_config())
    };
    let unscored: Vec<usize> = (0..samples.len())
        .filter(|&i| !scores.is_scored(i))
        .collect();
    let (group_std, frac_zero_std) = if g > 1 {
        (groups.group_std, Some(groups.frac_zero_std))
    } else {
        (Vec::new(), None)
    };
    let mut metrics = Metrics::new();
    if est == Estimator::GroupNorm {
        return Estimated {
            advantages: Advantage::PerSequence(groups.values),
            returns: None,
            group_std,
            frac_zero_std,
            metrics,
        };
    }
    let kl: Option<Vec<Vec<f64>>> = match (cfg.kl_in_reward(), old, reference) {
        (true, Some(o), Some(r)) => Some(
            o.iter()
                .zip(r)
                .map(|(o, r)| {
                    o.iter()
                        .zip(r)
                        .map(|(&a, &b)| {
                            token_kl(est, cfg.estimator.kl_estimator, a as f64, b as f64)
                        })
                        .collect()
                })
                .collect(),
        ),
        _ => None,
    };
    if let Some(k) = &kl {
        let n: usize = k.iter().map(Vec::len).sum();
        let s: f64 = k.iter().flatten().sum();
        metrics.push(("kl".into(), s / n.max(1) as f64));
    }
    let values: Option<Vec<Vec<f64>>> = values.map(|v| {
        v.iter()
            .map(|r| r.iter().map(|&x| x as f64).collect())
            .collect()
    });
    let lens: Vec<usize> = samples.iter().map(|s| s.completion_ids.len()).collect();
    let inp = EstimatorInputs {
        rewards,
        group_size: g,
        kl: kl.as_deref(),
        values: values.as_deref(),
        lens: &lens,
    };
    let (mut advantages, returns) = match estimate(&inp, &cfg.estimator_config()) {
        Estimate::PerSequence(a) => (Advantage::PerSequence(a), None),
        Estimate::PerToken {
            advantages,
            returns,
        } => {
            metrics.extend(token_stats("returns", &returns));
            if let Some(v) = &values {
                metrics.extend(token_stats("values", v));
                metrics.push(("explained_variance".into(), explained_variance(&returns, v)));
            }
            (Advantage::PerToken(advantages), Some(returns))
        }
    };
    // No signal from a completion nothing could score (TRL zeroes its advantage too).
    for &i in &unscored {
        match &mut advantages {
            Advantage::PerSequence(a) => a[i] = 0.0,
            Advantage::PerToken(a) => a[i].iter_mut().for_each(|x| *x = 0.0),
        }
    }
    Estimated {
        advantages,
        returns,
        group_std,
        frac_zero_std,
        metrics,
    }
}

/// `<name>/mean`, `<name>/std` (population) over every token of `rows`.
fn token_stats(name: &str, rows: &[Vec<f64>]) -> Metrics {
    let all: Vec<f64> = rows.iter().flatten().copied().collect();
    let m = crate::algo::advantage::mean(&all);
    let var = all.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / all.len().max(1) as f64;
    vec![
        (format!("{name}/mean"), m),
        (format!("{name}/std"), var.sqrt()),
    ]
}

/// `1 - Var(returns - values) / Var(returns)` over every token (verl's
/// `critic/vf_explained_var`): 1 for a perfect critic, 0 for one that predicts the mean, below
/// 0 for a worse one. 0 when the returns do not vary.
pub fn explained_variance(returns: &[Vec<f64>], values: &[Vec<f64>]) -> f64 {
    let r: Vec<f64> = returns.iter().flatten().copied().collect();
    let d: Vec<f64> = returns
        .iter()
        .zip(values)
        .flat_map(|(r, v)| r.iter().zip(v).map(|(a, b)| a - b))
        .collect();
    let var = |x: &[f64]| {
        let m = crate::algo::advantage::mean(x);
        x.iter().map(|y| (y - m) * (y - m)).sum::<f64>() / x.len().max(1) as f64
    };
    let vr = var(&r);
    if vr <= 0.0 {
        0.0
    } else {
        1.0 - var(&d) / vr
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlft_rewards::RewardOutput;

    /// Groups of 4; `cut` marks the truncated completions.
    fn case(rewards: &[f64], cut: &[bool], on: bool) -> Vec<f64> {
        let cfg = OnlineConfig {
            num_generations: 4,
            mask_truncated_completions: true,
            mask_truncated_rewards: on,
            ..OnlineConfig::default()
        };
        let samples: Vec<Sample> = cut
            .iter()
            .enumerate()
            .map(|(i, &t)| Sample::new(i / 4, vec![1, 2], String::new(), t))
            .collect();
        let scores = Scores {
            per_function: vec![RewardOutput::from_scores(rewards.to_vec())],
            total: rewards.to_vec(),
            failures: vec![0],
            errors: vec![None],
        };
        let est = estimate_rollout(&cfg, &samples, (&scores, &[1.0]), rewards, None, None, None);
        est.advantages.per_completion()
    }

    /// The finished completions of a group are standardised among themselves; a truncated one
    /// gets 0, and a group with one finished completion gives no signal (std undefined).
    #[test]
    fn truncated_rewards_stay_out_of_the_baseline() {
        let r = [
            0.9, 0.1, -0.3, -0.3, 0.9, 0.1, 0.5, -0.3, 0.1, -0.3, -0.3, -0.3,
        ];
        let cut = [
            false, false, true, true, false, false, false, false, false, true, true, true,
        ];
        let a = case(&r, &cut, true);
        // Group 1: mean 0.5, unbiased std sqrt(0.32).
        let x = 0.4 / (0.32f64.sqrt() + 1e-4);
        let want = [x, -x, 0.0, 0.0];
        // Group 2 has no truncated completion: the same as without the option.
        let off = case(&r, &cut, false);
        for (i, w) in want.iter().enumerate() {
            assert!((a[i] - w).abs() < 1e-12, "{i}: {a:?}");
        }
        assert_eq!(a[4..8], off[4..8]);
        assert_eq!(a[8..], [0.0; 4]);
        // Without it the wrong finished answer (0.1) rises above its group's mean.
        assert!(off[1] > 0.0 && off[8] > 0.0, "{off:?}");
    }
}
