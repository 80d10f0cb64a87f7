//! Advantage estimators of the online family, one switch (LightRFT's / OpenRLHF's
//! `advantage_estimator`): where the learning signal of a completion comes from.
//!
//! | estimator            | baseline                      | KL to the reference        | advantage        |
//! |----------------------|-------------------------------|----------------------------|------------------|
//! | `group_norm` (GRPO)  | group mean, / group std       | k3 term in the loss (TRL)  | one per sequence |
//! | `rloo`               | mean of the other completions | k1 summed, off the reward  | one per sequence |
//! | `reinforce` (REINFORCE++) | none                     | per-token penalty in the return | per token, whitened over the batch |
//! | `reinforce_baseline` | group mean                    | per-token penalty in the return | per token, whitened over the batch |
//! | `gae` (PPO)          | a learned value function      | per-token penalty in the reward | GAE(gamma, lambda), whitened |
//!
//! Anchors (each function names its own):
//! - RLOO: TRL `trl/trainer/rloo_trainer.py` (1.16), `_generate_and_score_completions`,
//!   lines 1646-1699 (KL off the reward, leave-one-out baseline, optional normalisation).
//! - REINFORCE++ / -baseline / GAE: OpenRLHF `openrlhf/trainer/ppo_utils/experience_maker.py`
//!   (`compute_advantages_and_returns` lines 238-330, `get_advantages_and_returns` 333-378,
//!   `get_cumulative_returns` 380-410) and `openrlhf/models/utils.py` (`compute_approx_kl`
//!   64-95, `compute_reward` 98-126), commit 3c3be62.
//! - `whiten_rewards`: TRL <= 1.15 `trl/trainer/utils.py` `masked_whiten` (unbiased variance),
//!   as `PPOTrainer` applied it with `shift_mean=False`.
//!
//! Papers: RLOO, Ahmadian et al. 2024 (arXiv:2402.14740); REINFORCE++, Hu 2025
//! (arXiv:2501.03262); GAE, Schulman et al. 2016 (arXiv:1506.02438); PPO, Schulman et al. 2017.
//!
//! Rows are ragged: row `i` holds the `len_i` active completion tokens of completion `i`
//! (padding never enters these functions), so "masked" sums are plain sums here.

use super::config_names;

use serde::{Deserialize, Serialize};

use super::advantage::{mean, unbiased_std};

/// Which advantage estimator an online run uses (`advantage_estimator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    /// GRPO: `(r - group mean) / (group std + eps)` (`scale_rewards`), KL in the loss.
    #[default]
    GroupNorm,
    /// RLOO: `r_i - mean_{j != i} r_j`, KL subtracted from the reward (TRL `RLOOTrainer`).
    Rloo,
    /// REINFORCE++: the return of each token (reward at the last token, per-token KL penalty),
    /// whitened over the batch.
    Reinforce,
    /// REINFORCE++-baseline: as `reinforce`, the group mean subtracted from the reward first.
    ReinforceBaseline,
    /// PPO's GAE over a learned value function (a critic).
    Gae,
}

config_names!(Estimator, "advantage_estimator", {
    GroupNorm => "group_norm",
    Rloo => "rloo",
    Reinforce => "reinforce",
    ReinforceBaseline => "reinforce_baseline",
    Gae => "gae",
});

impl Estimator {
    /// Whether the baseline comes from the other completions of the prompt, so a prompt needs
    /// `num_generations >= 2`.
    pub fn needs_groups(self) -> bool {
        matches!(
            self,
            Estimator::GroupNorm | Estimator::Rloo | Estimator::ReinforceBaseline
        )
    }

    /// Whether the KL to the reference enters the reward (all but `group_norm`, which adds it
    /// to the loss as TRL's GRPO does).
    pub fn kl_in_reward(self) -> bool {
        self != Estimator::GroupNorm
    }

    /// Whether advantages are per token (`[N, T]`) rather than per completion.
    pub fn per_token(self) -> bool {
        matches!(
            self,
            Estimator::Reinforce | Estimator::ReinforceBaseline | Estimator::Gae
        )
    }
}

/// How the per-token KL to the reference is estimated when it enters the reward
/// (`kl_estimator`; J. Schulman, "Approximating KL Divergence", 2020).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `log p - log q`: unbiased, can be negative per token (TRL PPO's and OpenRLHF's default).
    #[default]
    K1,
    /// `(log p - log q)^2 / 2`: non-negative, biased.
    K2,
    /// `exp(log q - log p) - 1 - (log q - log p)`: non-negative, unbiased (GRPO's).
    K3,
}

config_names!(KlEstimator, "kl_estimator", {
    K1 => "k1",
    K2 => "k2",
    K3 => "k3",
});

/// One token's KL estimate between the sampling policy (`logp`) and the reference (`ref_logp`),
/// clamped to `[-10, 10]` (OpenRLHF `compute_approx_kl`, models/utils.py 64-95).
pub fn approx_kl(logp: f64, ref_logp: f64, est: KlEstimator) -> f64 {
    let d = logp - ref_logp;
    let k = match est {
        KlEstimator::K1 => d,
        KlEstimator::K2 => d * d / 2.0,
        KlEstimator::K3 => (-d).exp() - 1.0 + d,
    };
    k.clamp(-10.0, 10.0)
}

/// The per-token KL that enters the reward under `estimator`: RLOO takes the raw first-order
/// `logp - ref_logp` (TRL rloo_trainer.py 1664-1673), the others [`approx_kl`] with `est`.
pub fn token_kl(estimator: Estimator, est: KlEstimator, logp: f64, ref_logp: f64) -> f64 {
    match estimator {
        Estimator::Rloo => logp - ref_logp,
        _ => approx_kl(logp, ref_logp, est),
    }
}

/// Dynamic sampling's filter (DAPO; verl `filter_groups`, recipe/dapo/dapo_ray_trainer.py): a
/// group is kept when its rewards differ (population std > 0) or it has one sample. A group of
/// equal rewards has zero advantage under every group estimator, so it carries no signal.
pub fn groups_with_signal(rewards: &[f64], group_size: usize) -> Vec<bool> {
    assert!(group_size > 0 && rewards.len().is_multiple_of(group_size));
    rewards
        .chunks(group_size)
        .map(|g| g.len() == 1 || g.iter().any(|&r| r != g[0]))
        .collect()
}

/// Leave-one-out advantages (TRL `RLOOTrainer`, rloo_trainer.py 1682-1699).
///
/// - `rewards`: `[num_groups * group_size]`, groups contiguous (the KL already subtracted).
/// - returns `[num_groups * group_size]`: `r_i - (sum_g r - r_i) / (G - 1)`; all 0 when
///   `group_size == 1`. With `normalize`, then `(A - mean A) / (std A + 1e-4)` over the batch
///   (unbiased std, TRL's `nanstd`).
pub fn rloo_advantages(rewards: &[f64], group_size: usize, normalize: bool) -> Vec<f64> {
    assert!(group_size > 0 && rewards.len().is_multiple_of(group_size));
    if group_size == 1 {
        return vec![0.0; rewards.len()];
    }
    let mut adv: Vec<f64> = rewards
        .chunks(group_size)
        .flat_map(|g| {
            let sum: f64 = g.iter().sum();
            // Equal rewards: exactly 0 (the float sum can round), as `mean` gives.
            let equal = g.iter().all(|&r| r == g[0]);
            g.iter().map(move |&r| {
                if equal {
                    0.0
                } else {
                    r - (sum - r) / (group_size - 1) as f64
                }
            })
        })
        .collect();
    if normalize {
        let m = mean(&adv);
        let s = unbiased_std(&adv, m);
        for a in &mut adv {
            *a = (*a - m) / (s + 1e-4);
        }
    }
    adv
}

/// Rewards minus their group's mean (REINFORCE++-baseline's shaping, experience_maker.py
/// 263-264).
pub fn group_centred(rewards: &[f64], group_size: usize) -> Vec<f64> {
    assert!(group_size > 0 && rewards.len().is_multiple_of(group_size));
    rewards
        .chunks(group_size)
        .flat_map(|g| {
            let m = mean(g);
            g.iter().map(move |&r| r - m)
        })
        .collect()
}

/// The per-token reward of one completion (OpenRLHF `compute_reward`, models/utils.py 98-126):
/// `-kl_coef * kl_t` on every token, plus the sequence reward `score` on the last one.
/// `kl`: the row's `[len]` per-token KL (zeros without a reference). An empty row stays empty.
pub fn token_rewards(score: f64, kl: &[f64], kl_coef: f64) -> Vec<f64> {
    let c = kl_coef.max(0.0);
    let mut r: Vec<f64> = kl.iter().map(|k| -c * k).collect();
    if let Some(last) = r.last_mut() {
        *last += score;
    }
    r
}

/// Discounted returns `G_t = r_t + gamma * G_{t+1}` of one row (OpenRLHF
/// `get_cumulative_returns`, experience_maker.py 380-410).
pub fn discounted_returns(rewards: &[f64], gamma: f64) -> Vec<f64> {
    let mut out = vec![0.0; rewards.len()];
    let mut acc = 0.0;
    for t in (0..rewards.len()).rev() {
        acc = rewards[t] + gamma * acc;
        out[t] = acc;
    }
    out
}

/// GAE of one row (OpenRLHF `get_advantages_and_returns`, experience_maker.py 333-378):
/// `delta_t = r_t + gamma V_{t+1} - V_t` (`V_len = 0`), `A_t = delta_t + gamma lambda A_{t+1}`,
/// returns `R_t = A_t + V_t`. `values`, `rewards`: `[len]`. Returns `(advantages, returns)`.
pub fn gae(values: &[f64], rewards: &[f64], gamma: f64, lam: f64) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(values.len(), rewards.len(), "values and rewards of a row");
    let n = rewards.len();
    let mut adv = vec![0.0; n];
    let mut last = 0.0;
    for t in (0..n).rev() {
        let next = if t + 1 < n { values[t + 1] } else { 0.0 };
        let delta = rewards[t] + gamma * next - values[t];
        last = delta + gamma * lam * last;
        adv[t] = last;
    }
    let ret = adv.iter().zip(values).map(|(a, v)| a + v).collect();
    (adv, ret)
}

/// Whitens every token of every row together (OpenRLHF, experience_maker.py 313-330): mean over
/// all tokens, biased variance clamped at 1e-8, `(x - mean) / sqrt(var)`; with `!std_norm`
/// only the mean is subtracted. No tokens: unchanged.
pub fn whiten_batch(rows: &mut [Vec<f64>], std_norm: bool) {
    let (n, m, var) = mean_var(rows);
    if n == 0 {
        return;
    }
    let rstd = if std_norm {
        1.0 / var.max(1e-8).sqrt()
    } else {
        1.0
    };
    for x in rows.iter_mut().flatten() {
        *x = (*x - m) * rstd;
    }
}

/// `(n, mean, biased variance)` of every value of `rows` (NaN mean and variance when empty).
fn mean_var(rows: &[Vec<f64>]) -> (usize, f64, f64) {
    let n: usize = rows.iter().map(Vec::len).sum();
    let m = rows.iter().flatten().sum::<f64>() / n as f64;
    let var = rows
        .iter()
        .flatten()
        .map(|x| (x - m) * (x - m))
        .sum::<f64>()
        / n as f64;
    (n, m, var)
}

/// TRL's `masked_whiten` over all tokens (trl/trainer/utils.py, TRL <= 1.15): unbiased
/// variance (`var * n / (n - 1)`), `(x - mean) / sqrt(var + 1e-8)`, the mean added back when
/// `!shift_mean`. `PPOTrainer` whitened its rewards with `shift_mean = False`.
pub fn masked_whiten(rows: &mut [Vec<f64>], shift_mean: bool) {
    let (n, m, var) = mean_var(rows);
    if n < 2 {
        return;
    }
    let var = var * n as f64 / (n - 1) as f64;
    let r = 1.0 / (var + 1e-8).sqrt();
    for x in rows.iter_mut().flatten() {
        *x = (*x - m) * r + if shift_mean { 0.0 } else { m };
    }
}

/// The settings of [`estimate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EstimatorConfig {
    /// Which estimator.
    pub estimator: Estimator,
    /// KL coefficient when the KL enters the reward (`beta` / `kl_coef` / `init_kl_coef`).
    pub kl_coef: f64,
    /// Discount (`gamma`); `reinforce_baseline` and `rloo` use 1 as OpenRLHF forces.
    pub gamma: f64,
    /// GAE's lambda (`lam`).
    pub lam: f64,
    /// RLOO: normalise the advantages over the batch (`normalize_advantages`).
    pub normalize_advantages: bool,
    /// PPO: whiten the per-token rewards before GAE (`whiten_rewards`).
    pub whiten_rewards: bool,
}

/// What [`estimate`] works from: `N` completions in groups of `group_size`.
#[derive(Debug, Clone, Copy)]
pub struct EstimatorInputs<'a> {
    /// `[N]` sequence rewards (weighted sum of the reward functions, clipped, penalised).
    pub rewards: &'a [f64],
    /// Completions per prompt.
    pub group_size: usize,
    /// `[N][len_i]` per-token KL estimates to the reference (None: no KL in the reward).
    pub kl: Option<&'a [Vec<f64>]>,
    /// `[N][len_i]` the critic's values (`gae` only).
    pub values: Option<&'a [Vec<f64>]>,
    /// `[N]` active tokens of each completion.
    pub lens: &'a [usize],
}

/// Advantages (and, per token, returns) of a rollout.
#[derive(Debug, Clone, PartialEq)]
pub enum Estimate {
    /// One advantage per completion, `[N]`.
    PerSequence(Vec<f64>),
    /// One per active token, `[N][len_i]`, with the returns the critic regresses on (PPO) or
    /// that the advantages were made from (REINFORCE++).
    PerToken {
        /// Advantages.
        advantages: Vec<Vec<f64>>,
        /// Returns.
        returns: Vec<Vec<f64>>,
    },
}

/// The advantages of `inp` under every estimator but `group_norm` (whose group statistics
/// [`super::compute_advantages`] returns).
///
/// # Panics
/// On `group_norm`, on `gae` without values, or on rows whose lengths disagree with `lens`.
pub fn estimate(inp: &EstimatorInputs, cfg: &EstimatorConfig) -> Estimate {
    let n = inp.rewards.len();
    assert_eq!(inp.lens.len(), n, "one length per reward");
    let kl_row = |i: usize| -> Vec<f64> {
        match inp.kl {
            Some(k) => {
                assert_eq!(k[i].len(), inp.lens[i], "kl row {i}");
                k[i].clone()
            }
            None => vec![0.0; inp.lens[i]],
        }
    };
    match cfg.estimator {
        Estimator::GroupNorm => panic!("group_norm advantages come from compute_advantages"),
        Estimator::Rloo => {
            let r: Vec<f64> = (0..n)
                .map(|i| inp.rewards[i] - cfg.kl_coef * kl_row(i).iter().sum::<f64>())
                .collect();
            Estimate::PerSequence(rloo_advantages(
                &r,
                inp.group_size,
                cfg.normalize_advantages,
            ))
        }
        Estimator::Reinforce | Estimator::ReinforceBaseline => {
            let (scores, gamma) = if cfg.estimator == Estimator::ReinforceBaseline {
                (group_centred(inp.rewards, inp.group_size), 1.0)
            } else {
                (inp.rewards.to_vec(), cfg.gamma)
            };
            let returns: Vec<Vec<f64>> = (0..n)
                .map(|i| {
                    discounted_returns(&token_rewards(scores[i], &kl_row(i), cfg.kl_coef), gamma)
                })
                .collect();
            let mut advantages = returns.clone();
            whiten_batch(&mut advantages, true);
            Estimate::PerToken {
                advantages,
                returns,
            }
        }
        Estimator::Gae => {
            let values = inp.values.expect("gae needs the critic's values");
            let mut rewards: Vec<Vec<f64>> = (0..n)
                .map(|i| token_rewards(inp.rewards[i], &kl_row(i), cfg.kl_coef))
                .collect();
            if cfg.whiten_rewards {
                masked_whiten(&mut rewards, false);
            }
            let (mut advantages, mut returns) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for (i, r) in rewards.iter().enumerate() {
                assert_eq!(values[i].len(), r.len(), "values row {i}");
                let (a, ret) = gae(&values[i], r, cfg.gamma, cfg.lam);
                advantages.push(a);
                returns.push(ret);
            }
            whiten_batch(&mut advantages, true);
            Estimate::PerToken {
                advantages,
                returns,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rloo_is_reward_minus_mean_of_the_others() {
        let a = rloo_advantages(&[1.0, 0.0, 0.0, 0.5, 0.5, 0.5], 3, false);
        let want = [1.0, -0.5, -0.5, 0.0, 0.0, 0.0];
        for (x, y) in a.iter().zip(want) {
            assert!((x - y).abs() < 1e-12, "{a:?}");
        }
        assert_eq!(rloo_advantages(&[1.0, 2.0], 1, true), vec![0.0, 0.0]);
        // Equal rewards whose float sum rounds (0.1 * 3 != 0.3) still give exactly 0.
        assert_eq!(rloo_advantages(&[0.1; 3], 3, false), vec![0.0; 3]);
    }

    #[test]
    fn returns_and_gae_match_hand_values() {
        assert_eq!(
            discounted_returns(&[1.0, 0.0, 2.0], 0.5),
            vec![1.5, 1.0, 2.0]
        );
        // lambda = 1, gamma = 1: advantages are returns minus values.
        let (a, r) = gae(&[0.5, 0.25], &[0.0, 1.0], 1.0, 1.0);
        assert_eq!(r, vec![1.0, 1.0]);
        assert_eq!(a, vec![0.5, 0.75]);
        // lambda = 0: one-step TD errors.
        let (a, _) = gae(&[0.5, 0.25], &[0.0, 1.0], 1.0, 0.0);
        assert_eq!(a, vec![0.0 + 0.25 - 0.5, 1.0 - 0.25]);
    }

    #[test]
    fn token_rewards_put_the_score_last() {
        assert_eq!(
            token_rewards(1.0, &[0.5, -0.5], 0.1),
            vec![-0.05, 1.0 + 0.05]
        );
        assert!(token_rewards(1.0, &[], 0.1).is_empty());
    }

    #[test]
    fn whitening_gives_zero_mean_unit_variance() {
        let mut rows = vec![vec![1.0, 2.0], vec![], vec![3.0, 4.0, 5.0]];
        whiten_batch(&mut rows, true);
        let all: Vec<f64> = rows.iter().flatten().copied().collect();
        let m = mean(&all);
        let var = all.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / all.len() as f64;
        assert!(m.abs() < 1e-12 && (var - 1.0).abs() < 1e-9, "{all:?}");
        let mut same = vec![vec![2.0, 2.0]];
        whiten_batch(&mut same, true);
        assert_eq!(same, vec![vec![0.0, 0.0]]);
    }

    #[test]
    fn names_round_trip() {
        for &e in Estimator::ALL {
            assert_eq!(e.as_str().parse::<Estimator>().unwrap(), e);
        }
        let err = "reinforce_base"
            .parse::<Estimator>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("did you mean `reinforce_baseline`"), "{err}");
        assert_eq!("K3".parse::<KlEstimator>().unwrap(), KlEstimator::K3);
    }
}
