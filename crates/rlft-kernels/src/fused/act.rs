//! SwiGLU with backward: `y = silu(gate) * up`, `silu(g) = g * sigmoid(g)`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::{contiguous_slice, dispatch, tensor, with_slice};
use crate::math::Real;
use crate::simd;

/// Elements per rayon task.
const PER_TASK: usize = 1 << 14;

/// `silu(gate) * up` for `gate`, `up` of one shape (CPU f32/f64). One graph node; the backward
/// gives the gradient of each input that tracks a graph.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> candle_core::Result<Tensor> {
    if gate.dims() != up.dims() {
        candle_core::bail!(
            "swiglu: gate {:?} and up {:?} differ in shape",
            gate.dims(),
            up.dims()
        );
    }
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
}

struct SwiGlu;

#[inline(always)]
fn sigmoid<T: Real>(g: T) -> T {
    let one = T::from_f64(1.0);
    one / (one + (-g).exp())
}

/// `y = silu(g) * u` over one chunk.
#[inline(always)]
fn fwd_chunk<T: Real>(y: &mut [T], g: &[T], u: &[T]) {
    for ((o, &gv), &uv) in y.iter_mut().zip(g).zip(u) {
        *o = gv * sigmoid(gv) * uv;
    }
}

/// `g = silu(g) * u` in place, in AVX2 where the CPU has it: the decode path's SwiGLU, the same
/// arithmetic as `fwd_chunk`.
pub fn silu_mul_in_place(g: &mut [f32], u: &[f32]) {
    simd!(g
        .iter_mut()
        .zip(u)
        .for_each(|(gv, &uv)| *gv = *gv * sigmoid(*gv) * uv))
}

/// `d silu(g) / dg = s * (1 + g * (1 - s))` with `s = sigmoid(g)`.
#[inline(always)]
fn dsilu<T: Real>(g: T, s: T) -> T {
    let one = T::from_f64(1.0);
    s * (one + g * (one - s))
}

/// `dg`, `du` over one chunk (branch-free loops per case, so each vectorises).
#[inline(always)]
fn bwd_chunk<T: Real>(dg: Option<&mut [T]>, du: Option<&mut [T]>, g: &[T], u: &[T], d: &[T]) {
    match (dg, du) {
        (Some(a), Some(b)) => {
            for ((((a, b), &gv), &uv), &dv) in a.iter_mut().zip(b.iter_mut()).zip(g).zip(u).zip(d) {
                let s = sigmoid(gv);
                *a = dv * uv * dsilu(gv, s);
                *b = dv * gv * s;
            }
        }
        (Some(a), None) => {
            for (((a, &gv), &uv), &dv) in a.iter_mut().zip(g).zip(u).zip(d) {
                *a = dv * uv * dsilu(gv, sigmoid(gv));
            }
        }
        (None, Some(b)) => {
            for ((b, &gv), &dv) in b.iter_mut().zip(g).zip(d) {
                *b = dv * gv * sigmoid(gv);
            }
        }
        (None, None) => {}
    }
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "fused-swiglu"
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let _t = crate::op_time::span("swiglu fwd");
        dispatch!(gs.dtype(), T => {
            let g = contiguous_slice::<T>(gs, gl)?;
            let u = contiguous_slice::<T>(us, ul)?;
            let mut y = vec![T::from_f64(0.0); g.len()];
            y.par_chunks_mut(PER_TASK)
                .zip(g.par_chunks(PER_TASK).zip(u.par_chunks(PER_TASK)))
                .for_each(|(yc, (gc, uc))| simd!(fwd_chunk(yc, gc, uc)));
            Ok((T::to_cpu_storage_owned(y), gl.shape().clone()))
        })
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let _t = crate::op_time::span("swiglu bwd");
        let (want_g, want_u) = (gate.track_op(), up.track_op());
        dispatch!(gate.dtype(), T => {
            let zero = T::from_f64(0.0);
            let n = gate.elem_count();
            let mut dg = vec![zero; if want_g { n } else { 0 }];
            let mut du = vec![zero; if want_u { n } else { 0 }];
            with_slice::<T, _>(gate, |g| {
                with_slice::<T, _>(up, |u| {
                    with_slice::<T, _>(dy, |d| {
                        let ch = |c: usize, len: usize| {
                            let r = c * PER_TASK..c * PER_TASK + len;
                            (&g[r.clone()], &u[r.clone()], &d[r])
                        };
                        match (want_g, want_u) {
                            (true, true) => dg
                                .par_chunks_mut(PER_TASK)
                                .zip(du.par_chunks_mut(PER_TASK))
                                .enumerate()
                                .for_each(|(c, (a, b))| {
                                    let (gs, us, ds) = ch(c, a.len());
                                    simd!(bwd_chunk(Some(a), Some(b), gs, us, ds))
                                }),
                            (true, false) => dg
                                .par_chunks_mut(PER_TASK)
                                .enumerate()
                                .for_each(|(c, a)| {
                                    let (gs, us, ds) = ch(c, a.len());
                                    simd!(bwd_chunk(Some(a), None, gs, us, ds))
                                }),
                            (false, true) => du
                                .par_chunks_mut(PER_TASK)
                                .enumerate()
                                .for_each(|(c, b)| {
                                    let (gs, us, ds) = ch(c, b.len());
                                    simd!(bwd_chunk(None, Some(b), gs, us, ds))
                                }),
                            (false, false) => {}
                        }
                        Ok(())
                    })
                })
            })?;
            let dg = if want_g { Some(tensor(dg, gate.dims())?) } else { None };
            let du = if want_u { Some(tensor(du, up.dims())?) } else { None };
            Ok((dg, du))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{grads_of, rand, rel_diff};
    use super::*;
    use candle_core::{DType, Var};

    #[test]
    fn matches_composite_values_and_gradients() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let shape = [5, 7, 1000];
            let g = Var::from_tensor(&(rand(&shape, 1, dtype) * 6.0).unwrap()).unwrap();
            let u = Var::from_tensor(&rand(&shape, 2, dtype)).unwrap();
            let coef = rand(&shape, 3, dtype);
            let got = swiglu(g.as_tensor(), u.as_tensor()).unwrap();
            let want = (g.as_tensor().silu().unwrap() * u.as_tensor()).unwrap();
            assert!(rel_diff(&got, &want) < tol);
            let g1 = grads_of(&got, &coef);
            let g2 = grads_of(&want, &coef);
            for v in [&g, &u] {
                let d = rel_diff(
                    g1.get(v.as_tensor()).unwrap(),
                    g2.get(v.as_tensor()).unwrap(),
                );
                assert!(d < tol, "{dtype:?}: {d}");
            }
        }
    }

    #[test]
    fn only_tracked_inputs_get_gradients() {
        let g = Var::from_tensor(&rand(&[4, 9], 1, DType::F32)).unwrap();
        let u = rand(&[4, 9], 2, DType::F32);
        let y = swiglu(g.as_tensor(), &u).unwrap();
        let grads = y.sum_all().unwrap().backward().unwrap();
        assert!(grads.get(g.as_tensor()).is_some());
        assert!(grads.get(&u).is_none());
        assert!(swiglu(g.as_tensor(), &rand(&[4, 8], 2, DType::F32)).is_err());
    }
}
