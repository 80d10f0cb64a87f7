//! PPO's critic loss: the clipped value loss (OpenRLHF `ValueLoss`, openrlhf/models/loss.py
//! 233-269; TRL <= 1.15 `PPOTrainer.train`, `vf_loss`):
//!
//! ```text
//! v_clip = old_v + clip(v - old_v, -c, c)
//! l_t    = max((v_t - R_t)^2, (v_clip_t - R_t)^2)      (v - R)^2 without clipping
//! loss   = 0.5 * sum_t m l / max(sum m, 1) / k
//! ```
//!
//! `k` is the gradient-accumulation steps (TRL's accelerate divides the loss by it).
//! `vf_clipfrac` is the fraction of active tokens where the clipped term is the larger one.

use candle_core::{bail, DType, Result, Tensor};

/// The inputs of [`value_loss`]; `N` completions, `T` positions.
#[derive(Debug, Clone, Copy)]
pub struct ValueLossInputs<'a> {
    /// `[N, T]` the critic's values now (differentiable).
    pub values: &'a Tensor,
    /// `[N, T]` the values at rollout time.
    pub old_values: &'a Tensor,
    /// `[N, T]` the returns to regress on.
    pub returns: &'a Tensor,
    /// `[N, T]` completion mask.
    pub mask: &'a Tensor,
    /// `cliprange_value`; `None`: no clipping.
    pub clip: Option<f64>,
    /// Gradient-accumulation steps.
    pub accumulation_steps: usize,
}

/// The loss and its diagnostics.
#[derive(Debug, Clone)]
pub struct ValueLossOutput {
    /// `[]` scalar.
    pub loss: Tensor,
    /// Fraction of active tokens whose clipped loss was the larger (`vf_clipfrac`).
    pub clipfrac: f64,
}

/// The clipped value loss (module docs).
pub fn value_loss(inp: &ValueLossInputs) -> Result<ValueLossOutput> {
    let v = inp.values;
    let dtype = v.dtype();
    let (n, t) = v.dims2()?;
    for (name, x) in [
        ("old_values", inp.old_values),
        ("returns", inp.returns),
        ("mask", inp.mask),
    ] {
        if x.dims() != [n, t] {
            bail!("value_loss: {name} is {:?}, values is [{n}, {t}]", x.dims());
        }
    }
    if inp.accumulation_steps == 0 {
        bail!("value_loss: accumulation_steps must be >= 1");
    }
    let mask = inp.mask.to_dtype(dtype)?;
    let ret = inp.returns.to_dtype(dtype)?.detach();
    let old = inp.old_values.to_dtype(dtype)?.detach();
    let l1 = v.sub(&ret)?.sqr()?;
    let (per_token, clipfrac) = match inp.clip {
        Some(c) => {
            let clipped = (&old + v.sub(&old)?.clamp(-c, c)?)?;
            let l2 = clipped.sub(&ret)?.sqr()?;
            let larger = l2.gt(&l1)?;
            let frac = larger.to_dtype(dtype)?.mul(&mask)?;
            (larger.where_cond(&l2, &l1)?, Some(frac))
        }
        None => (l1, None),
    };
    let tokens = mask
        .sum_all()?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?
        .max(1.0);
    let k = inp.accumulation_steps as f64;
    let loss = per_token
        .mul(&mask)?
        .sum_all()?
        .affine(0.5 / (tokens * k), 0.0)?;
    let clipfrac = match clipfrac {
        Some(f) => f.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()? / tokens,
        None => 0.0,
    };
    Ok(ValueLossOutput { loss, clipfrac })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn matches_the_loop_version() {
        let (n, t) = (2, 3);
        let v: [f64; 6] = [0.5, 1.4, -0.2, 0.0, 0.9, 3.0];
        let old: [f64; 6] = [0.4, 1.0, 0.1, 0.3, 0.9, 0.0];
        let r: [f64; 6] = [1.0, 0.2, -0.5, 0.6, 0.0, 9.0];
        let m = [1., 1., 1., 1., 1., 0.];
        let (c, k) = (0.2f64, 2usize);
        let mut want = 0.0;
        let mut grad = [0.0; 6];
        let mut frac = 0.0;
        let tokens: f64 = m.iter().sum();
        for i in 0..n * t {
            let vc = old[i] + (v[i] - old[i]).clamp(-c, c);
            let (l1, l2): (f64, f64) = ((v[i] - r[i]).powi(2), (vc - r[i]).powi(2));
            want += 0.5 * m[i] * l1.max(l2) / tokens / k as f64;
            let inside = (v[i] - old[i]).abs() < c;
            grad[i] = if l2 > l1 {
                if inside {
                    (vc - r[i]) * m[i] / tokens / k as f64
                } else {
                    0.0
                }
            } else {
                (v[i] - r[i]) * m[i] / tokens / k as f64
            };
            frac += m[i] * f64::from(u8::from(l2 > l1)) / tokens;
        }
        let dev = Device::Cpu;
        let var = Var::from_tensor(&Tensor::from_slice(&v, (n, t), &dev).unwrap()).unwrap();
        let t2 = |x: &[f64]| Tensor::from_slice(x, (n, t), &dev).unwrap();
        let out = value_loss(&ValueLossInputs {
            values: var.as_tensor(),
            old_values: &t2(&old),
            returns: &t2(&r),
            mask: &t2(&m),
            clip: Some(c),
            accumulation_steps: k,
        })
        .unwrap();
        assert!((out.loss.to_scalar::<f64>().unwrap() - want).abs() < 1e-12);
        assert!((out.clipfrac - frac).abs() < 1e-12 && frac > 0.0);
        let g = out.loss.backward().unwrap();
        let g: Vec<f64> = g
            .get(&var)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for (x, y) in g.iter().zip(&grad) {
            assert!((x - y).abs() < 1e-12, "{g:?} vs {grad:?}");
        }
    }
}
