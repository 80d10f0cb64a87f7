//! The fused CPU AdamW update: one pass over parameter, `m`, `v` (and master weights) per tensor,
//! in place, split into [`CHUNK`]-element tasks on rayon's pool.
//!
//! Traffic per f32 element: read p, g, m, v and write p, m, v (28 bytes), the minimum for AdamW;
//! candle's tensor ops need ~12 passes and fresh allocations for the same update.

use candle_core::{DType, Storage, Tensor};
use half::bf16;
use rayon::prelude::*;

use super::{Master, ParamState, StepScalars};
use crate::cpu::{
    adamw_chunk, adamw_lowp_chunk, adamw_master_chunk, adamw_split_chunk, f32_slice_mut,
    float_slice, float_slice_mut, is_fusable, on_cpu_path, with_cpu_mut, AdamWCoefs, Elem,
    FloatSlice, FloatSliceMut, CHUNK,
};
use crate::error::{Result, TrainError};

/// Runs `$body` with `$x` bound to the gradient's elements, whatever their float type.
macro_rules! with_grad {
    ($g:expr, |$x:ident| $body:expr) => {
        match $g {
            FloatSlice::F32($x) => $body,
            FloatSlice::BF16($x) => $body,
            FloatSlice::F16($x) => $body,
        }
    };
}

/// Whether [`update`] handles this parameter: CPU, contiguous f32/bf16/f16 parameter, f32
/// moments or moments of the parameter's dtype, f32/bf16/f16 gradient on the CPU (any layout).
pub(super) fn can_update(st: &ParamState, grad: &Tensor) -> bool {
    let cpu_grad =
        on_cpu_path(grad) && matches!(grad.dtype(), DType::F32 | DType::BF16 | DType::F16);
    let moments = st.exp_avg.dtype();
    is_fusable(st.var.as_tensor())
        && cpu_grad
        && (moments == DType::F32 || moments == st.var.dtype())
}

/// Applies the update of `st` with `grad` in place; the caller checked [`can_update`] and made
/// the master weights of bf16/f16 parameters. Takes `&ParamState`: all writes go through candle's
/// storage locks, so distinct parameters can be updated in parallel.
pub(super) fn update(st: &ParamState, grad: &Tensor, sc: &StepScalars) -> Result<()> {
    let var = st.var.as_tensor();
    let k = AdamWCoefs {
        decay: sc.decay as f32,
        one_minus_beta1: sc.one_minus_beta1 as f32,
        beta2: sc.beta2 as f32,
        one_minus_beta2: (1.0 - sc.beta2) as f32,
        step_size: sc.step_size as f32,
        inv_bc2_sqrt: (1.0 / sc.bc2_sqrt) as f32,
        eps: sc.eps as f32,
    };
    let grad = grad.contiguous()?;
    let (gs, gl) = grad.storage_and_layout();
    let g = match &*gs {
        Storage::Cpu(gs) => float_slice(gs, gl),
        _ => None,
    };
    let Some(g) = g else {
        return Err(TrainError::State(
            "fused AdamW: gradient not on the CPU".into(),
        ));
    };
    let n = var.elem_count();
    if g.len() != n {
        return Err(TrainError::State(format!(
            "a gradient has {} elements but its parameter {n}; pass this model's gradients",
            g.len()
        )));
    }
    if st.exp_avg.dtype() != DType::F32 {
        return lowp_params(st, &g, &k);
    }
    with_cpu_mut(&st.exp_avg, |ms, ml| {
        with_cpu_mut(&st.exp_avg_sq, |vs, vl| {
            let m = f32_slice_mut(ms, ml)?;
            let v = f32_slice_mut(vs, vl)?;
            match &st.master {
                None => with_cpu_mut(var, |ps, pl| match float_slice_mut(ps, pl) {
                    Some(FloatSliceMut::F32(p)) => {
                        f32_params(p, m, v, &g, &k);
                        Ok(())
                    }
                    _ => candle_core::bail!("rlft-train: f32 parameter expected"),
                }),
                Some(Master::F32(master)) => with_cpu_mut(master, |ws, wl| {
                    let w = f32_slice_mut(ws, wl)?;
                    with_cpu_mut(var, |ps, pl| match float_slice_mut(ps, pl) {
                        Some(FloatSliceMut::BF16(p)) => master_params(w, p, m, v, &g, &k),
                        Some(FloatSliceMut::F16(p)) => master_params(w, p, m, v, &g, &k),
                        _ => candle_core::bail!("rlft-train: bf16/f16 parameter expected"),
                    })
                }),
                Some(Master::Low(low)) => with_cpu_mut(low, |ls, ll| {
                    let Some(FloatSliceMut::BF16(lo)) = float_slice_mut(ls, ll) else {
                        candle_core::bail!("rlft-train: contiguous low halves expected")
                    };
                    with_cpu_mut(var, |ps, pl| match float_slice_mut(ps, pl) {
                        Some(FloatSliceMut::BF16(p)) => {
                            with_grad!(&g, |g| split_params(p, lo, m, v, g, &k));
                            Ok(())
                        }
                        _ => candle_core::bail!("rlft-train: bf16 parameter expected"),
                    })
                }),
            }
        })
    })?;
    Ok(())
}

/// Parameters whose moments are of their own dtype (`ParamDtype`), bf16 or f16.
fn lowp_params(st: &ParamState, g: &FloatSlice, k: &AdamWCoefs) -> Result<()> {
    with_cpu_mut(&st.exp_avg, |ms, ml| {
        with_cpu_mut(&st.exp_avg_sq, |vs, vl| {
            with_cpu_mut(st.var.as_tensor(), |ps, pl| {
                let (m, v, p) = (
                    float_slice_mut(ms, ml),
                    float_slice_mut(vs, vl),
                    float_slice_mut(ps, pl),
                );
                match (p, m, v) {
                    (
                        Some(FloatSliceMut::BF16(p)),
                        Some(FloatSliceMut::BF16(m)),
                        Some(FloatSliceMut::BF16(v)),
                    ) => with_grad!(g, |g| lowp_typed(p, m, v, g, k)),
                    (
                        Some(FloatSliceMut::F16(p)),
                        Some(FloatSliceMut::F16(m)),
                        Some(FloatSliceMut::F16(v)),
                    ) => with_grad!(g, |g| lowp_typed(p, m, v, g, k)),
                    _ => {
                        candle_core::bail!("rlft-train: moments of the parameter's dtype expected")
                    }
                }
                Ok(())
            })
        })
    })?;
    Ok(())
}

/// Parameters and moments of one low-precision type, chunks in parallel.
fn lowp_typed<P: Elem, G: Elem>(p: &mut [P], m: &mut [P], v: &mut [P], g: &[G], k: &AdamWCoefs) {
    p.par_chunks_mut(CHUNK)
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .zip(g.par_chunks(CHUNK))
        .for_each(|(((p, m), v), g)| adamw_lowp_chunk(p, m, v, g, k));
}

/// bf16 parameters with the split master (their low halves `lo`), chunks in parallel.
fn split_params<G: Elem>(
    p: &mut [bf16],
    lo: &mut [bf16],
    m: &mut [f32],
    v: &mut [f32],
    g: &[G],
    k: &AdamWCoefs,
) {
    p.par_chunks_mut(CHUNK)
        .zip(lo.par_chunks_mut(CHUNK))
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .zip(g.par_chunks(CHUNK))
        .for_each(|((((p, lo), m), v), g)| adamw_split_chunk(p, lo, m, v, g, k));
}

/// f32 parameters: dispatches on the gradient's type, then runs the chunks in parallel.
fn f32_params(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &FloatSlice, k: &AdamWCoefs) {
    match g {
        FloatSlice::F32(g) => f32_params_typed(p, m, v, g, k),
        FloatSlice::BF16(g) => f32_params_typed(p, m, v, g, k),
        FloatSlice::F16(g) => f32_params_typed(p, m, v, g, k),
    }
}

fn f32_params_typed<G: Elem>(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[G], k: &AdamWCoefs) {
    if p.len() <= CHUNK {
        return adamw_chunk(p, m, v, g, k);
    }
    p.par_chunks_mut(CHUNK)
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .zip(g.par_chunks(CHUNK))
        .for_each(|(((p, m), v), g)| adamw_chunk(p, m, v, g, k));
}

/// bf16/f16 parameters with f32 master weights `w`.
fn master_params<P: Elem>(
    w: &mut [f32],
    p: &mut [P],
    m: &mut [f32],
    v: &mut [f32],
    g: &FloatSlice,
    k: &AdamWCoefs,
) -> candle_core::Result<()> {
    match g {
        FloatSlice::F32(g) => master_params_typed(w, p, m, v, g, k),
        FloatSlice::BF16(g) => master_params_typed(w, p, m, v, g, k),
        FloatSlice::F16(g) => master_params_typed(w, p, m, v, g, k),
    }
    Ok(())
}

fn master_params_typed<P: Elem, G: Elem>(
    w: &mut [f32],
    p: &mut [P],
    m: &mut [f32],
    v: &mut [f32],
    g: &[G],
    k: &AdamWCoefs,
) {
    if w.len() <= CHUNK {
        return adamw_master_chunk(w, p, m, v, g, k);
    }
    w.par_chunks_mut(CHUNK)
        .zip(p.par_chunks_mut(CHUNK))
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .zip(g.par_chunks(CHUNK))
        .for_each(|((((w, p), m), v), g)| adamw_master_chunk(w, p, m, v, g, k));
}
