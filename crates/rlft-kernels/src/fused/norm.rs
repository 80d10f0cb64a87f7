//! RMSNorm with backward: `y = x / sqrt(mean(x^2) + eps) * w` over the last dim.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::{contiguous_slice, dispatch, tensor, with_slice};
use crate::math::{dot, Real};
use crate::simd;

/// Rows per rayon task.
const ROWS_PER_TASK: usize = 16;

/// RMSNorm of `x [.., h]` with weight `w [h]` (same dtype, CPU f32/f64). One graph node; the
/// backward gives `dx`, and `dw` only when `w` tracks a graph (a trainable norm).
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let x = x.contiguous()?;
    let w = w.contiguous()?;
    x.apply_op2(&w, RmsNorm { eps })
}

struct RmsNorm {
    eps: f64,
}

/// `1 / sqrt(mean(row^2) + eps)`.
#[inline(always)]
fn inv_rms<T: Real>(row: &[T], eps: f64) -> T {
    let ms = dot(row, row).to_f64() / row.len() as f64;
    T::from_f64(1.0) / T::from_f64(ms + eps).sqrt()
}

/// One block of rows of the forward.
#[inline(always)]
fn forward_rows<T: Real>(yc: &mut [T], xc: &[T], w: &[T], eps: f64) {
    let h = w.len();
    for (yr, xr) in yc.chunks_mut(h).zip(xc.chunks(h)) {
        let r = inv_rms(xr, eps);
        for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
            *o = v * r * g;
        }
    }
}

fn forward<T: Real>(x: &[T], w: &[T], eps: f64) -> Vec<T> {
    let h = w.len();
    let mut y = vec![T::from_f64(0.0); x.len()];
    y.par_chunks_mut(h * ROWS_PER_TASK)
        .zip(x.par_chunks(h * ROWS_PER_TASK))
        .for_each(|(yc, xc)| simd!(forward_rows(yc, xc, w, eps)));
    y
}

/// One block of rows of the backward: writes `dx`, adds to `dw` (when not empty).
#[inline(always)]
fn backward_rows<T: Real>(dxc: &mut [T], xc: &[T], dyc: &[T], w: &[T], eps: f64, dw: &mut [T]) {
    let h = w.len();
    for ((dxr, xr), dyr) in dxc.chunks_mut(h).zip(xc.chunks(h)).zip(dyc.chunks(h)) {
        let r = inv_rms(xr, eps);
        // dx doubles as scratch for dy * w.
        for ((o, &d), &g) in dxr.iter_mut().zip(dyr).zip(w) {
            *o = d * g;
        }
        let c = dot(dxr, xr) * r * r / T::from_f64(h as f64);
        for (o, &xv) in dxr.iter_mut().zip(xr) {
            *o = r * (*o - xv * c);
        }
        for ((acc, &xv), &d) in dw.iter_mut().zip(xr).zip(dyr) {
            *acc += d * xv * r;
        }
    }
}

/// `(dx, dw)`: with `xhat = x * r`, `dx = r * (dy*w - xhat * mean(dy*w*xhat))`,
/// `dw = sum over rows of dy * xhat` (when `want_dw`).
fn backward<T: Real>(
    x: &[T],
    w: &[T],
    dy: &[T],
    eps: f64,
    want_dw: bool,
) -> (Vec<T>, Option<Vec<T>>) {
    let h = w.len();
    let zero = T::from_f64(0.0);
    let mut dx = vec![zero; x.len()];
    let chunk = h * ROWS_PER_TASK;
    // Per-task sums of `dw`, added in task order afterwards: rayon's `reduce` pairs them as
    // its work stealing splits the range, so its float sum differs from run to run.
    let partial: Vec<Vec<T>> = dx
        .par_chunks_mut(chunk)
        .zip(x.par_chunks(chunk).zip(dy.par_chunks(chunk)))
        .map(|(dxc, (xc, dyc))| {
            let mut dw = if want_dw { vec![zero; h] } else { Vec::new() };
            simd!(backward_rows(dxc, xc, dyc, w, eps, &mut dw));
            dw
        })
        .collect();
    let dw = want_dw.then(|| {
        let mut sum = vec![zero; h];
        for p in &partial {
            for (s, &v) in sum.iter_mut().zip(p) {
                *s += v;
            }
        }
        sum
    });
    (dx, dw)
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "fused-rms-norm"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let _t = crate::op_time::span("rms-norm fwd");
        let h = wl.shape().elem_count();
        if xl.dims().last() != Some(&h) {
            candle_core::bail!(
                "rms_norm: input {:?} does not end in the weight's size {h}",
                xl.dims()
            );
        }
        dispatch!(xs.dtype(), T => {
            let y = forward(contiguous_slice::<T>(xs, xl)?, contiguous_slice::<T>(ws, wl)?, self.eps);
            Ok((T::to_cpu_storage_owned(y), xl.shape().clone()))
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let _t = crate::op_time::span("rms-norm bwd");
        let want_dx = x.track_op();
        let want_dw = w.track_op();
        if !want_dx && !want_dw {
            return Ok((None, None));
        }
        dispatch!(x.dtype(), T => {
            let (dx, dw) = with_slice::<T, _>(x, |xv| {
                with_slice::<T, _>(w, |wv| {
                    with_slice::<T, _>(dy, |dyv| Ok(backward(xv, wv, dyv, self.eps, want_dw)))
                })
            })?;
            let dx = if want_dx { Some(tensor(dx, x.dims())?) } else { None };
            let dw = match dw {
                Some(v) => Some(tensor(v, w.dims())?),
                None => None,
            };
            Ok((dx, dw))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{grads_of, rand, rel_diff};
    use super::*;
    use candle_core::{DType, Var, D};

    fn composite(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
        let var = x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
        x.broadcast_div(&(var + eps).unwrap().sqrt().unwrap())
            .unwrap()
            .broadcast_mul(w)
            .unwrap()
    }

    #[test]
    fn matches_composite_values_and_gradients() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            for train_w in [true, false] {
                let x = Var::from_tensor(&rand(&[3, 37, 24], 1, dtype)).unwrap();
                let w0 = (rand(&[24], 2, dtype) + 1.0).unwrap();
                let w = Var::from_tensor(&w0).unwrap();
                let wt = if train_w {
                    w.as_tensor().clone()
                } else {
                    w0.clone()
                };
                let coef = rand(&[3, 37, 24], 3, dtype);
                let got = rms_norm(x.as_tensor(), &wt, 1e-5).unwrap();
                let want = composite(x.as_tensor(), &wt, 1e-5);
                assert!(rel_diff(&got, &want) < tol, "{dtype:?} values");
                let g1 = grads_of(&got, &coef);
                let g2 = grads_of(&want, &coef);
                let dx1 = g1.get(x.as_tensor()).unwrap();
                let dx2 = g2.get(x.as_tensor()).unwrap();
                assert!(
                    rel_diff(dx1, dx2) < tol,
                    "{dtype:?} dx {}",
                    rel_diff(dx1, dx2)
                );
                if train_w {
                    let dw1 = g1.get(w.as_tensor()).unwrap();
                    let dw2 = g2.get(w.as_tensor()).unwrap();
                    assert!(
                        rel_diff(dw1, dw2) < tol,
                        "{dtype:?} dw {}",
                        rel_diff(dw1, dw2)
                    );
                } else {
                    assert!(g1.get(w.as_tensor()).is_none());
                }
            }
        }
    }

    /// The weight gradient sums many tasks' partials; the sum is the same, bit for bit, however
    /// the pool splits the work (rayon's `reduce` made it vary: an Online DPO test saw it).
    #[test]
    fn weight_gradient_is_the_same_every_time() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let (rows, h) = (16 * 64, 48);
        let x = rand(&[rows, h], 4, DType::F32);
        let dy = rand(&[rows, h], 5, DType::F32);
        let w = (rand(&[h], 6, DType::F32) + 1.0).unwrap();
        let v = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let (x, dy, w) = (v(&x), v(&dy), v(&w));
        let dw = || pool.install(|| backward(&x, &w, &dy, 1e-5, true).1.unwrap());
        let first = dw();
        let mut sequential = vec![0f32; h];
        for r in 0..rows / ROWS_PER_TASK {
            let rs = r * ROWS_PER_TASK * h..(r + 1) * ROWS_PER_TASK * h;
            let part = backward(&x[rs.clone()], &w, &dy[rs], 1e-5, true).1.unwrap();
            for (s, p) in sequential.iter_mut().zip(part) {
                *s += p;
            }
        }
        assert_eq!(first, sequential, "task partials are added in task order");
        for _ in 0..50 {
            assert_eq!(dw(), first);
        }
    }

    #[test]
    fn rejects_a_weight_of_the_wrong_size() {
        let x = rand(&[2, 8], 1, DType::F32);
        let w = rand(&[7], 2, DType::F32);
        assert!(rms_norm(&x, &w, 1e-5).is_err());
    }
}
