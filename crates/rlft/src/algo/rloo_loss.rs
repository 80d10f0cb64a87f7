//! RLOO's policy loss: PPO's clipped surrogate on the *sequence* importance ratio, one term per
//! completion (TRL 1.16 `RLOOTrainer._compute_loss`, trl/trainer/rloo_trainer.py 1812-1835):
//!
//! ```text
//! logps_i = sum_t m_it logp_it          old_i = sum_t m_it old_it
//! r_i     = exp(logps_i - old_i)
//! loss    = mean_i -min(r_i A_i, clip(r_i, 1 - eps_low, 1 + eps_high) A_i) / k
//! ```
//!
//! `k` is the gradient-accumulation steps (the HF Trainer divides TRL's loss by it); the mean is
//! over the whole micro-batch's `N` completions, also when rows with advantage 0 are left out
//! of the call (`micro_batch_rows`). The KL to the reference is not here: RLOO subtracts it from
//! the reward (see [`super::estimators`]).

use candle_core::{bail, DType, Result, Tensor};

/// The inputs of [`rloo_loss`]; `N` completions, `T` positions.
#[derive(Debug, Clone, Copy)]
pub struct RlooLossInputs<'a> {
    /// `[N, T]` policy log-probs (differentiable).
    pub logp: &'a Tensor,
    /// `[N, T]` sampling-policy log-probs; `None`: on-policy (`logp.detach()`).
    pub old_logp: Option<&'a Tensor>,
    /// `[N]` advantages.
    pub advantages: &'a Tensor,
    /// `[N, T]` completion mask.
    pub mask: &'a Tensor,
    /// Lower clip range.
    pub epsilon_low: f64,
    /// Upper clip range.
    pub epsilon_high: f64,
    /// Gradient-accumulation steps of the optimiser step.
    pub accumulation_steps: usize,
    /// The whole micro-batch's row count (the mean's `N`) when only some of its rows are
    /// given, the others left out for their zero advantage (their terms and gradients are
    /// exactly 0); `None`: the rows given are the whole micro-batch.
    pub micro_batch_rows: Option<usize>,
}

/// The loss and the fractions of sequences clipped low / high (TRL's `clip_ratio/*`).
#[derive(Debug, Clone)]
pub struct RlooLossOutput {
    /// `[]` scalar in `logp`'s dtype.
    pub loss: Tensor,
    /// Fraction of sequences with `r < 1 - eps_low` and `A < 0`.
    pub clip_low: f64,
    /// Fraction of sequences with `r > 1 + eps_high` and `A > 0`.
    pub clip_high: f64,
}

/// RLOO's sequence-level clipped loss (module docs). The clipped branch is chosen by TRL's
/// `is_region_clipped` test and held constant, so the gradient is `-r_i A_i / (N k)` on every
/// active token of an unclipped sequence and 0 on a clipped one, also at the bounds.
pub fn rloo_loss(inp: &RlooLossInputs) -> Result<RlooLossOutput> {
    let logp = inp.logp;
    let dtype = logp.dtype();
    let (n, t) = logp.dims2()?;
    let rows = inp.micro_batch_rows.unwrap_or(n);
    if n == 0 || inp.accumulation_steps == 0 || rows < n {
        bail!(
            "rloo_loss: empty batch, accumulation_steps == 0 or a whole micro-batch of {rows} \
             rows smaller than the {n} given"
        );
    }
    if inp.mask.dims() != [n, t] || inp.advantages.dims() != [n] {
        bail!(
            "rloo_loss: mask {:?} / advantages {:?} do not fit logp [{n}, {t}]",
            inp.mask.dims(),
            inp.advantages.dims()
        );
    }
    let mask = inp.mask.to_dtype(dtype)?;
    let adv = inp.advantages.to_dtype(dtype)?;
    let seq = logp.mul(&mask)?.sum(1)?;
    let old = match inp.old_logp {
        Some(o) => o.to_dtype(dtype)?.detach().mul(&mask)?.sum(1)?,
        None => seq.detach(),
    };
    let ratio = seq.sub(&old)?.exp()?;
    let (lo, hi) = (1.0 - inp.epsilon_low, 1.0 + inp.epsilon_high);
    let low = ratio.lt(lo)?.mul(&adv.lt(0.0)?)?;
    let high = ratio.gt(hi)?.mul(&adv.gt(0.0)?)?;
    let region = low.add(&high)?;
    let coef = region.where_cond(&ratio.detach().clamp(lo, hi)?, &ratio)?;
    let k = inp.accumulation_steps as f64;
    // `sum * (1 / N)` is candle's `mean`, bit for bit, when all rows are given.
    let loss = (coef.mul(&adv)?.neg()?.sum(0)? * (1.0 / rows as f64))?.affine(1.0 / k, 0.0)?;
    let frac = |x: &Tensor| -> Result<f64> {
        Ok(x.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()? / n as f64)
    };
    Ok(RlooLossOutput {
        loss,
        clip_low: frac(&low)?,
        clip_high: frac(&high)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// The loop version with the hand-derived gradient, on random inputs with clipping.
    #[test]
    fn matches_the_loop_version() {
        let (n, t) = (4, 3);
        let lp: Vec<f64> = (0..n * t).map(|i| -0.3 - 0.17 * (i % 5) as f64).collect();
        let old: Vec<f64> = (0..n * t).map(|i| lp[i] - 0.25 * (i % 3) as f64).collect();
        let m: Vec<f64> = vec![1., 1., 1., 1., 1., 0., 1., 0., 0., 0., 0., 0.];
        let a = [0.8, -1.2, 0.3, -0.4];
        let (el, eh, k) = (0.2, 0.28, 2usize);
        // Loop.
        let mut want = 0.0;
        let mut grad = vec![0.0; n * t];
        for i in 0..n {
            let (mut s, mut so) = (0.0, 0.0);
            for j in 0..t {
                s += m[i * t + j] * lp[i * t + j];
                so += m[i * t + j] * old[i * t + j];
            }
            let r: f64 = (s - so).exp();
            let clipped = (r < 1.0 - el && a[i] < 0.0) || (r > 1.0 + eh && a[i] > 0.0);
            let c = if clipped {
                r.clamp(1.0 - el, 1.0 + eh)
            } else {
                r
            };
            want += -c * a[i] / n as f64 / k as f64;
            for j in 0..t {
                if !clipped {
                    grad[i * t + j] = -r * a[i] * m[i * t + j] / n as f64 / k as f64;
                }
            }
        }
        let dev = Device::Cpu;
        let v = Var::from_tensor(&Tensor::from_slice(&lp, (n, t), &dev).unwrap()).unwrap();
        let old_t = Tensor::from_slice(&old, (n, t), &dev).unwrap();
        let mask = Tensor::from_slice(&m, (n, t), &dev).unwrap();
        let adv = Tensor::from_slice(&a, n, &dev).unwrap();
        let out = rloo_loss(&RlooLossInputs {
            logp: v.as_tensor(),
            old_logp: Some(&old_t),
            advantages: &adv,
            mask: &mask,
            epsilon_low: el,
            epsilon_high: eh,
            accumulation_steps: k,
            micro_batch_rows: None,
        })
        .unwrap();
        let got = out.loss.to_scalar::<f64>().unwrap();
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        let g = out.loss.backward().unwrap();
        let g: Vec<f64> = g.get(&v).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        for (x, y) in g.iter().zip(&grad) {
            assert!((x - y).abs() < 1e-12, "{g:?} vs {grad:?}");
        }
        assert!(
            out.clip_low + out.clip_high > 0.0,
            "the case clips something"
        );
    }
}
