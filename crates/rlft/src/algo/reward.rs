//! The Bradley-Terry loss of reward models, as TRL's `RewardTrainer.compute_loss`
//! (`trl/trainer/reward_trainer.py`, TRL 1.16, lines 786-795):
//!
//! ```text
//! loss = mean_i [ -log sigmoid(r_c,i - r_r,i - m_i) ]  +  c * mean_i [ (r_c,i + r_r,i)^2 ]
//! ```
//!
//! `r_c, r_r [n]`: the scores of the chosen and rejected sequence of each pair; `m [n]`: the
//! optional `margin` column (Llama 2's margin loss, Touvron et al. 2023, "Llama 2: Open
//! Foundation and Fine-Tuned Chat Models", eq. 2); `c`: `center_rewards_coefficient`, the
//! auxiliary loss of Eisenstein et al. 2023 ("Helping or Herding? Reward Model Ensembles
//! Mitigate but do not Eliminate Reward Hacking", eq. 2) that pulls rewards towards mean 0.
//! The Bradley-Terry model is Bradley & Terry 1952 ("Rank Analysis of Incomplete Block Designs").
//!
//! [`pair_losses`] returns the per-pair terms, so a trainer divides their sum by the pairs of
//! the whole optimiser step (batch 8 x accumulation 1 equals 4 x 2, as TRL's mean per
//! micro-batch averaged over equal micro-batches). `-log sigmoid(x)` is computed as
//! `logsumexp(0, -x)`, finite for any finite `x` and with the exact gradient at ties.

use candle_core::Tensor;

use crate::error::{Result, TrainerError};

/// Per-pair Bradley-Terry losses `[n]`: `-log sigmoid(chosen - rejected - margin) +
/// c * (chosen + rejected)^2` (the centring term only with `center_rewards_coefficient = Some(c)`).
/// `chosen`, `rejected` and `margin` are `[n]` of one float dtype; differentiable in the scores.
/// Their mean is TRL's loss.
pub fn pair_losses(
    chosen: &Tensor,
    rejected: &Tensor,
    margin: Option<&Tensor>,
    center_rewards_coefficient: Option<f64>,
) -> Result<Tensor> {
    if chosen.dims() != rejected.dims() || chosen.rank() != 1 {
        return Err(TrainerError::Other(format!(
            "pair_losses: chosen {:?} and rejected {:?} must both be [n]",
            chosen.dims(),
            rejected.dims()
        )));
    }
    let mut x = (chosen - rejected)?;
    if let Some(m) = margin {
        let m = m.to_dtype(x.dtype())?;
        x = (x - m)?;
    }
    // -log sigmoid(x) = log(exp(0) + exp(-x)): a log-sum-exp, stable for any x and smooth at
    // x = 0 (a relu/abs form would take a one-sided derivative at ties).
    let z = Tensor::stack(&[x.zeros_like()?, x.neg()?], 1)?;
    let mut loss = z.log_sum_exp(1)?;
    if let Some(c) = center_rewards_coefficient {
        loss = (loss + ((chosen + rejected)?.sqr()? * c)?)?;
    }
    Ok(loss)
}

/// What TRL logs of a batch of pairs (`reward_trainer.py` lines 802-815): the share of pairs
/// whose chosen scores higher (strictly), the mean of `chosen - rejected`, and the min / mean /
/// max of all `2n` scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairStats {
    /// Pairs compared.
    pub pairs: usize,
    /// `mean(chosen > rejected)`.
    pub accuracy: f64,
    /// `mean(chosen - rejected)`.
    pub margin: f64,
    /// Smallest score.
    pub min_reward: f64,
    /// Mean score.
    pub mean_reward: f64,
    /// Largest score.
    pub max_reward: f64,
}

impl PairStats {
    /// The statistics of `chosen[i]` vs `rejected[i]` (equal lengths, at least one pair).
    pub fn of(chosen: &[f32], rejected: &[f32]) -> PairStats {
        let n = chosen.len().min(rejected.len());
        let pairs = chosen.iter().zip(rejected);
        let wins = pairs.clone().filter(|(c, r)| c > r).count();
        let diff: f64 = pairs.map(|(c, r)| (*c as f64) - (*r as f64)).sum();
        let all = chosen[..n].iter().chain(&rejected[..n]).map(|&v| v as f64);
        let (mut lo, mut hi, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
        for v in all {
            lo = lo.min(v);
            hi = hi.max(v);
            sum += v;
        }
        let n_f = n.max(1) as f64;
        PairStats {
            pairs: n,
            accuracy: wins as f64 / n_f,
            margin: diff / n_f,
            min_reward: lo,
            mean_reward: sum / (2.0 * n_f),
            max_reward: hi,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn losses(c: &[f64], r: &[f64], m: Option<&[f64]>, k: Option<f64>) -> Vec<f64> {
        let d = Device::Cpu;
        let c = Tensor::new(c, &d).unwrap();
        let r = Tensor::new(r, &d).unwrap();
        let m = m.map(|m| Tensor::new(m, &d).unwrap());
        pair_losses(&c, &r, m.as_ref(), k)
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn scalar_formula_and_extremes() {
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        let got = losses(&[1.0, -2.0], &[0.5, 3.0], Some(&[0.25, 0.0]), Some(0.1));
        let want = [
            -sig(1.0 - 0.5 - 0.25).ln() + 0.1 * 1.5f64.powi(2),
            -sig(-5.0).ln() + 0.1 * 1.0,
        ];
        for (a, b) in got.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
        // No overflow: -log sigmoid(-800) = 800, -log sigmoid(800) = 0.
        let got = losses(&[-400.0, 400.0], &[400.0, -400.0], None, None);
        assert!(
            (got[0] - 800.0).abs() < 1e-9 && got[1].abs() < 1e-300,
            "{got:?}"
        );
    }

    #[test]
    fn stats_follow_trl() {
        let s = PairStats::of(&[1.0, 0.0, 2.0], &[0.0, 0.0, 3.0]);
        assert_eq!(s.accuracy, 1.0 / 3.0); // ties do not count
        assert_eq!(s.margin, 0.0);
        assert_eq!((s.min_reward, s.max_reward), (0.0, 3.0));
        assert_eq!(s.mean_reward, 1.0);
    }

    #[test]
    fn shapes_are_checked() {
        let d = Device::Cpu;
        let a = Tensor::new(&[1f32, 2.0], &d).unwrap();
        let b = Tensor::new(&[1f32], &d).unwrap();
        assert!(pair_losses(&a, &b, None, None).is_err());
    }
}
