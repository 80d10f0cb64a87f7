//! Linear layers with backward, one graph node each: the plain layer `x @ W^T + b` and the LoRA
//! layer `x @ W^T + b + scaling * dropout(x) @ A^T @ B^T` over a frozen base.
//!
//! candle's `x.matmul(&w.t())` records a transpose and a matmul; its backward computes the
//! weight gradient as `[in, out]`, transposes it back and adds that strided view into a zeroed
//! buffer. Here `dW` is one gemm written `[out, in]`, and frozen operands get no gradient.

use std::borrow::Cow;
use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::low_rank::expand;
pub use super::quant_linear::FrozenBase;
use super::{contiguous_slice, dispatch, tensor, with_slice};
use crate::gemm::{gemm, gemm_new};
use crate::math::{as_f32, as_f32_mut, Real};

/// `x [.., k] @ w [n, k]^T (+ bias [n]) -> [.., n]` (CPU f32/f64; leading dims are rows, so no
/// reshape node is needed around the product). `bias` is a constant (frozen);
/// gradients go to `x` and `w` when they track a graph.
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> candle_core::Result<Tensor> {
    check(x, w, bias)?;
    x.contiguous()?.apply_op2(
        &w.contiguous()?,
        Linear {
            bias: bias.map(|b| b.detach().contiguous()).transpose()?,
        },
    )
}

/// `x [.., k] @ w^T (+ bias) + scaling * (x * mask) @ a [r, k]^T @ b [n, r]^T -> [.., n]` with
/// a frozen `w [n, k]` and `bias [n]` (constants) and an optional dropout `mask` of `x`'s shape (0 or
/// `1 / (1 - p)`, a constant). Gradients go to `x`, `a` and `b` when they track a graph.
pub fn lora_linear(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    a: &Tensor,
    b: &Tensor,
    scaling: f64,
    mask: Option<&Tensor>,
) -> candle_core::Result<Tensor> {
    check(x, w, bias)?;
    lora_linear_over(
        x,
        FrozenBase::Dense(w.detach().contiguous()?),
        bias,
        a,
        b,
        scaling,
        mask,
    )
}

/// [`lora_linear`] over any frozen base: an f32/f64 tensor or GGUF blocks (f32 activations).
pub fn lora_linear_over(
    x: &Tensor,
    base: FrozenBase,
    bias: Option<&Tensor>,
    a: &Tensor,
    b: &Tensor,
    scaling: f64,
    mask: Option<&Tensor>,
) -> candle_core::Result<Tensor> {
    let (m, k) = rows_in(x.dims());
    let (n, kw) = base.dims2()?;
    let (r, ka) = a.dims2()?;
    if kw != k
        || ka != k
        || bias.is_some_and(|t| t.dims() != [n])
        || b.dims2()? != (n, r)
        || mask.is_some_and(|t| t.dims() != x.dims())
    {
        candle_core::bail!(
            "lora_linear: x [{m}, {k}], base [{n}, {kw}] need A [r, {k}], B [{n}, r], bias [{n}] \
             and a mask [{m}, {k}]; got A {:?}, B {:?}",
            a.dims(),
            b.dims()
        );
    }
    x.contiguous()?.apply_op3(
        &a.contiguous()?,
        &b.contiguous()?,
        LoraLinear {
            w: base,
            bias: bias.map(|t| t.detach().contiguous()).transpose()?,
            mask: mask.map(|t| t.detach().contiguous()).transpose()?,
            scaling,
            h: Mutex::new(None),
        },
    )
}

/// `(rows, in)` of an input `[.., in]` (rank >= 1).
pub(super) fn rows_in(dims: &[usize]) -> (usize, usize) {
    let k = dims.last().copied().unwrap_or(0);
    (dims[..dims.len().saturating_sub(1)].iter().product(), k)
}

/// `[.., in]` -> `[.., out]`.
fn out_shape(dims: &[usize], n: usize) -> Shape {
    let mut o = dims.to_vec();
    if let Some(l) = o.last_mut() {
        *l = n;
    }
    Shape::from(o)
}

fn check(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> candle_core::Result<()> {
    let (m, k) = rows_in(x.dims());
    let (n, k2) = w.dims2()?;
    if k != k2 || bias.is_some_and(|b| b.dims() != [n]) {
        candle_core::bail!(
            "linear: x [{m}, {k}] with weight {:?} and bias {:?}",
            w.dims(),
            bias.map(|b| b.dims().to_vec())
        );
    }
    Ok(())
}

/// `y [m, n] = x @ w^T (+ bias)`.
fn base<T: Real>(x: &[T], w: &[T], bias: Option<&[T]>, m: usize, k: usize, n: usize) -> Vec<T> {
    let mut y = gemm_new(m, n, k, x, false, w, true);
    if let Some(b) = bias {
        y.par_chunks_mut(n).for_each(|row| {
            for (o, &bv) in row.iter_mut().zip(b) {
                *o += bv;
            }
        });
    }
    y
}

/// `x * mask` elementwise.
fn masked<T: Real>(x: &[T], mask: &[T]) -> Vec<T> {
    x.par_iter().zip(mask).map(|(&a, &b)| a * b).collect()
}

struct Linear {
    bias: Option<Tensor>,
}

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "fused-linear"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let _t = crate::op_time::span("linear fwd");
        let (m, k) = rows_in(xl.dims());
        let (n, _) = wl.shape().dims2()?;
        dispatch!(xs.dtype(), T => {
            let x = contiguous_slice::<T>(xs, xl)?;
            let w = contiguous_slice::<T>(ws, wl)?;
            let y = match &self.bias {
                Some(b) => with_slice::<T, _>(b, |bv| Ok(base(x, w, Some(bv), m, k, n)))?,
                None => base(x, w, None, m, k, n),
            };
            Ok((T::to_cpu_storage_owned(y), out_shape(xl.dims(), n)))
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let _t = crate::op_time::span("linear bwd");
        let (m, k) = rows_in(x.dims());
        let (n, _) = w.dims2()?;
        let (want_x, want_w) = (x.track_op(), w.track_op());
        dispatch!(x.dtype(), T => {
            let (dx, dw) = with_slice::<T, _>(dy, |g| {
                let dx = if want_x {
                    Some(with_slice::<T, _>(w, |wv| {
                        Ok(gemm_new(m, k, n, g, false, wv, false))
                    })?)
                } else {
                    None
                };
                let dw = if want_w {
                    Some(with_slice::<T, _>(x, |xv| {
                        Ok(gemm_new(n, k, m, g, true, xv, false))
                    })?)
                } else {
                    None
                };
                Ok((dx, dw))
            })?;
            Ok((
                dx.map(|v| tensor(v, x.dims())).transpose()?,
                dw.map(|v| tensor(v, &[n, k])).transpose()?,
            ))
        })
    }
}

struct LoraLinear {
    w: FrozenBase,
    bias: Option<Tensor>,
    mask: Option<Tensor>,
    scaling: f64,
    /// `scaling * dropout(x) @ A^T` `[m, r]` from the forward, kept for `dB` in the backward
    /// (64 KiB per layer at 1024 rows and rank 16) instead of computed again.
    h: Mutex<Option<Tensor>>,
}

/// `out [m, r] = x [m, k] @ a [r, k]^T` for a LoRA factor `a` (`r` = the rank): the row-block
/// kernel ([`crate::stream::matmul_wt_rows`]) for f32, which reads `x` once and packs nothing
/// (faster than gemm on `x @ A^T`, `examples/matmul_bench.rs`); gemm for f64.
fn narrow_wt<T: Real>(m: usize, r: usize, k: usize, out: &mut [T], x: &[T], a: &[T]) {
    if let (Some(xs), Some(as_)) = (as_f32(x), as_f32(a)) {
        if let Some(o) = as_f32_mut(out) {
            crate::stream::matmul_wt_rows(xs, m, k, as_, r, o);
            return;
        }
    }
    gemm(m, r, k, out, x, false, a, true, false);
}

/// `b [n, r]` transposed, `[r, n]`.
fn transposed<T: Real>(b: &[T], n: usize, r: usize) -> Vec<T> {
    let mut t = vec![T::from_f64(0.0); n * r];
    for (i, row) in b.chunks_exact(r).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            t[j * n + i] = v;
        }
    }
    t
}

impl LoraLinear {
    fn stash(&self) -> candle_core::Result<std::sync::MutexGuard<'_, Option<Tensor>>> {
        self.h
            .lock()
            .map_err(|_| candle_core::Error::Msg("lora_linear: a thread panicked".into()))
    }

    /// `x * mask`, or `x` itself without dropout.
    fn dropped<'x, T: Real>(&self, x: &'x [T]) -> candle_core::Result<Cow<'x, [T]>> {
        Ok(match &self.mask {
            Some(mk) => Cow::Owned(with_slice::<T, _>(mk, |mv| Ok(masked(x, mv)))?),
            None => Cow::Borrowed(x),
        })
    }

    /// `h = scaling * xd @ a^T` `[m, r]` for the dropped input `xd [m, k]` and `a [r, k]`.
    fn scaled_h<T: Real>(&self, xd: &[T], a: &[T], m: usize, k: usize, r: usize) -> Vec<T> {
        let mut h = vec![T::from_f64(0.0); m * r];
        narrow_wt(m, r, k, &mut h, xd, a);
        let s = T::from_f64(self.scaling);
        h.iter_mut().for_each(|v| *v *= s);
        h
    }
}

impl CustomOp3 for LoraLinear {
    fn name(&self) -> &'static str {
        "fused-lora-linear"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        as_: &CpuStorage,
        al: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let _t = crate::op_time::span("lora-linear fwd");
        let (m, k) = rows_in(xl.dims());
        let (r, _) = al.shape().dims2()?;
        let (n, _) = bl.shape().dims2()?;
        dispatch!(xs.dtype(), T => {
            let x = contiguous_slice::<T>(xs, xl)?;
            let a = contiguous_slice::<T>(as_, al)?;
            let b = contiguous_slice::<T>(bs, bl)?;
            let h = self.scaled_h(&self.dropped(x)?, a, m, k, r);
            // y = h @ B^T (+ bias), then y += x @ W^T: each writes the output once.
            let bt = transposed(b, n, r);
            let mut y = match &self.bias {
                Some(bias) => with_slice::<T, _>(bias, |bv| Ok(expand(&h, &bt, Some(bv), m, r, n)))?,
                None => expand(&h, &bt, None, m, r, n),
            };
            self.w.add_xwt(m, x, &mut y)?;
            *self.stash()? = Some(tensor(h, &[m, r])?);
            Ok((T::to_cpu_storage_owned(y), out_shape(xl.dims(), n)))
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _t = crate::op_time::span("lora-linear bwd");
        let (m, k) = rows_in(x.dims());
        let (r, _) = a.dims2()?;
        let (n, _) = b.dims2()?;
        let (want_x, want_a, want_b) = (x.track_op(), a.track_op(), b.track_op());
        dispatch!(x.dtype(), T => {
            let zero = T::from_f64(0.0);
            let s = T::from_f64(self.scaling);
            let out = with_slice::<T, _>(dy, |g| {
                with_slice::<T, _>(x, |xv| {
                    with_slice::<T, _>(a, |av| {
                        with_slice::<T, _>(b, |bv| {
                            let xd = self.dropped(xv)?;
                            // dh = scaling * dy @ B   [m, r]
                            let mut dh = vec![zero; m * r];
                            narrow_wt(m, r, n, &mut dh, g, &transposed(bv, n, r));
                            dh.iter_mut().for_each(|v| *v *= s);
                            let dx = if want_x {
                                // dx = dh @ A (times the dropout mask), then dx += dy @ W.
                                let mut dx = expand(&dh, av, None, m, r, k);
                                if let Some(mk) = &self.mask {
                                    with_slice::<T, _>(mk, |mv| {
                                        dx.par_iter_mut()
                                            .zip(mv.par_iter())
                                            .for_each(|(o, &mvv)| *o *= mvv);
                                        Ok(())
                                    })?;
                                }
                                self.w.add_gw(m, g, &mut dx)?;
                                Some(dx)
                            } else {
                                None
                            };
                            // dA = dh^T @ xd   [r, k]
                            let da = want_a.then(|| {
                                let mut da = vec![zero; r * k];
                                gemm(r, k, m, &mut da, &dh, true, &xd, false, false);
                                da
                            });
                            // dB = scaling * dy^T @ (xd @ A^T)   [n, r]
                            let db = if want_b {
                                // The forward's h; computed again only if it is missing.
                                let kept = self.stash()?.clone();
                                let h = match kept {
                                    Some(h) => h,
                                    None => tensor(self.scaled_h(&xd, av, m, k, r), &[m, r])?,
                                };
                                let mut db = vec![zero; n * r];
                                with_slice::<T, _>(&h, |hv| {
                                    gemm(n, r, m, &mut db, g, true, hv, false, false);
                                    Ok(())
                                })?;
                                Some(db)
                            } else {
                                None
                            };
                            Ok((dx, da, db))
                        })
                    })
                })
            })?;
            let (dx, da, db) = out;
            Ok((
                dx.map(|v| tensor(v, x.dims())).transpose()?,
                da.map(|v| tensor(v, &[r, k])).transpose()?,
                db.map(|v| tensor(v, &[n, r])).transpose()?,
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{grads_of, rand, rel_diff};
    use super::*;
    use candle_core::{DType, Var};

    #[test]
    fn linear_matches_matmul_values_and_gradients() {
        let (m, k, n) = (37, 24, 19);
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            for train_w in [true, false] {
                let x = Var::from_tensor(&rand(&[m, k], 1, dtype)).unwrap();
                let w0 = rand(&[n, k], 2, dtype);
                let w = Var::from_tensor(&w0).unwrap();
                let wt = if train_w { w.as_tensor().clone() } else { w0 };
                let bias = rand(&[n], 3, dtype);
                let coef = rand(&[m, n], 4, dtype);
                let got = linear(x.as_tensor(), &wt, Some(&bias)).unwrap();
                let want = x
                    .as_tensor()
                    .matmul(&wt.t().unwrap())
                    .unwrap()
                    .broadcast_add(&bias)
                    .unwrap();
                assert!(rel_diff(&got, &want) < tol);
                let g1 = grads_of(&got, &coef);
                let g2 = grads_of(&want, &coef);
                let d = |t: &Tensor| rel_diff(g1.get(t).unwrap(), g2.get(t).unwrap());
                assert!(d(x.as_tensor()) < tol);
                if train_w {
                    assert!(d(w.as_tensor()) < tol);
                } else {
                    assert!(g1.get(&wt).is_none());
                }
            }
        }
    }

    #[test]
    fn lora_linear_matches_composite_with_and_without_dropout() {
        let (m, k, n, r) = (29, 24, 19, 4);
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            for with_mask in [false, true] {
                // A 3-D input: leading dims are rows.
                let x = Var::from_tensor(&rand(&[1, m, k], 1, dtype)).unwrap();
                let w = rand(&[n, k], 2, dtype);
                let bias = rand(&[n], 3, dtype);
                let a = Var::from_tensor(&rand(&[r, k], 4, dtype)).unwrap();
                let b = Var::from_tensor(&rand(&[n, r], 5, dtype)).unwrap();
                let mask = with_mask.then(|| {
                    (rand(&[1, m, k], 6, dtype)
                        .ge(0.0)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap()
                        * 2.0)
                        .unwrap()
                });
                let coef = rand(&[1, m, n], 7, dtype);
                let (at, bt) = (a.as_tensor(), b.as_tensor());
                let got = lora_linear(x.as_tensor(), &w, Some(&bias), at, bt, 0.5, mask.as_ref())
                    .unwrap();
                let xd = match &mask {
                    Some(mk) => (x.as_tensor() * mk).unwrap(),
                    None => x.as_tensor().clone(),
                };
                let delta = (xd
                    .broadcast_matmul(&at.t().unwrap())
                    .unwrap()
                    .broadcast_matmul(&bt.t().unwrap())
                    .unwrap()
                    * 0.5)
                    .unwrap();
                let want = (x
                    .as_tensor()
                    .broadcast_matmul(&w.t().unwrap())
                    .unwrap()
                    .broadcast_add(&bias)
                    .unwrap()
                    + delta)
                    .unwrap();
                assert!(rel_diff(&got, &want) < tol);
                let g1 = grads_of(&got, &coef);
                let g2 = grads_of(&want, &coef);
                for v in [&x, &a, &b] {
                    let d = rel_diff(
                        g1.get(v.as_tensor()).unwrap(),
                        g2.get(v.as_tensor()).unwrap(),
                    );
                    assert!(d < tol, "{dtype:?} mask {with_mask}: {d}");
                }
                assert!(g1.get(&w).is_none());
            }
        }
    }
}
