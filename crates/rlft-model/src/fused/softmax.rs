//! The attention softmax with backward: `p = softmax(scores * scale + bias)` over the last dim.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::{contiguous_slice, dispatch, tensor, with_slice, Real};

/// Rows per rayon task.
const ROWS_PER_TASK: usize = 32;

/// `softmax(scores * scale + bias)` for `scores [b, x, r, T]` and a constant additive mask
/// `bias [b, 1, t, T]` (0 or -inf, the dtype of `scores`) where `r` is a multiple of `t`:
/// row `i` of `r` takes mask row `i % t` (grouped-query rows are `(group, position)` pairs).
/// Every row must have a finite entry (the causal mask keeps each query's own key).
/// One graph node with input `scores` only.
pub fn masked_softmax(scores: &Tensor, bias: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    let (b, _x, r, big_t) = scores.dims4()?;
    let (bb, one, t, bt) = bias.dims4()?;
    if bb != b || one != 1 || bt != big_t || t == 0 || r % t != 0 {
        candle_core::bail!(
            "masked_softmax: scores {:?} and mask {:?} do not fit ([b, x, k*t, T] and [b, 1, t, T])",
            scores.dims(),
            bias.dims()
        );
    }
    scores.contiguous()?.apply_op1(MaskedSoftmax {
        bias: bias.detach().contiguous()?,
        scale,
    })
}

struct MaskedSoftmax {
    bias: Tensor,
    scale: f64,
}

fn forward<T: Real>(s: &[T], bias: &[T], dims: [usize; 4], t: usize, scale: T) -> Vec<T> {
    let [_b, x, r, big_t] = dims;
    let mut p = vec![T::from_f64(0.0); s.len()];
    p.par_chunks_mut(big_t * ROWS_PER_TASK)
        .zip(s.par_chunks(big_t * ROWS_PER_TASK))
        .enumerate()
        .for_each(|(c, (pc, sc))| {
            for (k, (pr, sr)) in pc.chunks_mut(big_t).zip(sc.chunks(big_t)).enumerate() {
                let row = c * ROWS_PER_TASK + k;
                let bi = row / (x * r);
                let m_row = (bi * t + row % r % t) * big_t;
                let mr = &bias[m_row..m_row + big_t];
                let mut mx = T::NEG_INF;
                for ((o, &v), &m) in pr.iter_mut().zip(sr).zip(mr) {
                    *o = v * scale + m;
                    mx = mx.maxv(*o);
                }
                let mut sum = T::from_f64(0.0);
                for o in pr.iter_mut() {
                    *o = (*o - mx).exp();
                    sum += *o;
                }
                let inv = T::from_f64(1.0) / sum;
                for o in pr.iter_mut() {
                    *o *= inv;
                }
            }
        });
    p
}

/// `ds = scale * p * (dp - sum(dp * p))` row by row.
fn backward<T: Real>(p: &[T], dp: &[T], big_t: usize, scale: T) -> Vec<T> {
    let mut ds = vec![T::from_f64(0.0); p.len()];
    ds.par_chunks_mut(big_t * ROWS_PER_TASK)
        .zip(
            p.par_chunks(big_t * ROWS_PER_TASK)
                .zip(dp.par_chunks(big_t * ROWS_PER_TASK)),
        )
        .for_each(|(dc, (pc, gc))| {
            for ((dr, pr), gr) in dc
                .chunks_mut(big_t)
                .zip(pc.chunks(big_t))
                .zip(gc.chunks(big_t))
            {
                let dot: T = pr.iter().zip(gr).map(|(&a, &b)| a * b).sum();
                for ((o, &pv), &gv) in dr.iter_mut().zip(pr).zip(gr) {
                    *o = scale * pv * (gv - dot);
                }
            }
        });
    ds
}

impl CustomOp1 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "fused-masked-softmax"
    }

    fn cpu_fwd(&self, ss: &CpuStorage, sl: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (b, x, r, big_t) = sl.shape().dims4()?;
        let t = self.bias.dim(2)?;
        dispatch!(ss.dtype(), T => {
            let s = contiguous_slice::<T>(ss, sl)?;
            let p = with_slice::<T, _>(&self.bias, |m| {
                Ok(forward(s, m, [b, x, r, big_t], t, T::from_f64(self.scale)))
            })?;
            Ok((T::to_cpu_storage_owned(p), sl.shape().clone()))
        })
    }

    fn bwd(&self, s: &Tensor, p: &Tensor, dp: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let big_t = s.dim(3)?;
        dispatch!(s.dtype(), T => {
            let ds = with_slice::<T, _>(p, |pv| {
                with_slice::<T, _>(dp, |g| Ok(backward(pv, g, big_t, T::from_f64(self.scale))))
            })?;
            Ok(Some(tensor(ds, s.dims())?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{rand, rel_diff};
    use super::*;
    use candle_core::{DType, Device, Var, D};

    #[test]
    fn matches_composite_with_grouped_rows() {
        let (b, kvh, groups, t, past) = (2, 3, 2, 5, 4);
        let big_t = past + t;
        let bias = crate::ops::causal_bias(&[0, 2], past, t, &Device::Cpu).unwrap();
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
            let bias = bias.to_dtype(dtype).unwrap();
            let s =
                Var::from_tensor(&(rand(&[b, kvh, groups * t, big_t], 1, dtype) * 4.0).unwrap())
                    .unwrap();
            let coef = rand(&[b, kvh, groups * t, big_t], 2, dtype);
            let got = masked_softmax(s.as_tensor(), &bias, 0.125).unwrap();
            let scaled = (s.as_tensor() * 0.125)
                .unwrap()
                .reshape((b, kvh, groups, t, big_t))
                .unwrap()
                .broadcast_add(&bias.unsqueeze(1).unwrap())
                .unwrap()
                .reshape((b, kvh, groups * t, big_t))
                .unwrap();
            let want = candle_nn::ops::softmax(&scaled, D::Minus1).unwrap();
            assert!(rel_diff(&got, &want) < tol);
            let g1 = (got * &coef)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let g2 = (want * &coef)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let d = rel_diff(
                g1.get(s.as_tensor()).unwrap(),
                g2.get(s.as_tensor()).unwrap(),
            );
            assert!(d < tol, "{dtype:?}: {d}");
        }
    }

    #[test]
    fn rejects_a_mask_that_does_not_fit() {
        let s = rand(&[2, 3, 10, 7], 1, DType::F32);
        let bias = crate::ops::causal_bias(&[0, 0], 0, 3, &Device::Cpu).unwrap();
        assert!(masked_softmax(&s, &bias, 1.0).is_err());
    }
}
