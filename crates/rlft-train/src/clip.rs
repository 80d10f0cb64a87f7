//! Gradient clipping by global L2 norm, PyTorch's `torch.nn.utils.clip_grad_norm_`.
//!
//! `total_norm = sqrt(sum over vars of sum(g^2))` (accumulated in f64), `clip_coef = max_norm /
//! (total_norm + 1e-6)`; if `clip_coef < 1` every gradient is multiplied by it. Unlike PyTorch
//! (which multiplies by NaN and poisons the gradients), a non-finite norm leaves the gradients
//! untouched and is reported, so the trainer can skip the step.
//!
//! On the CPU the norm is one parallel pass over all gradients (f32/bf16/f16, read in place) and
//! the scaling is in place; other devices use candle tensor ops.

#![warn(missing_docs)]

use std::collections::HashSet;

use candle_core::backprop::GradStore;
use candle_core::{DType, Storage, Tensor, Var};
use rayon::prelude::*;

use crate::cpu::{
    float_slice, float_slice_mut, on_cpu_path, scale_in_place, storage_id, sum_sq, with_cpu_mut,
    FloatSlice, FloatSliceMut, CHUNK,
};
use crate::error::{Result, TrainError};

/// What [`clip_grad_norm`] measured and did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClipOutcome {
    /// Global L2 norm of the gradients before clipping (may be NaN or infinite).
    pub total_norm: f64,
    /// Factor the gradients were multiplied by: `max_norm / (total_norm + 1e-6)` if that is
    /// below 1, else 1 (also 1 when the norm is not finite: nothing was scaled).
    pub scale: f64,
}

impl ClipOutcome {
    /// Whether the norm is finite; if not, skip the optimizer step (the gradients hold NaN/inf).
    pub fn is_finite(&self) -> bool {
        self.total_norm.is_finite()
    }

    /// Whether the gradients were scaled down.
    pub fn clipped(&self) -> bool {
        self.scale < 1.0
    }
}

/// Global L2 norm of the gradients of `vars` in `grads` (vars without a gradient count as zero;
/// a var listed twice counts once). f64 result; NaN/inf if any gradient holds one.
pub fn global_grad_norm(grads: &GradStore, vars: &[Var]) -> Result<f64> {
    let tensors = grad_tensors(grads, vars);
    let (cpu, other): (Vec<&Tensor>, Vec<&Tensor>) = tensors
        .into_iter()
        .partition(|t| on_cpu_path(t) && t.is_contiguous());
    let mut total = cpu_sum_sq(&cpu)?;
    for t in other {
        let s = t
            .to_dtype(DType::F64)?
            .sqr()?
            .sum_all()?
            .to_scalar::<f64>()?;
        total += s;
    }
    Ok(total.sqrt())
}

/// Clips the gradients of `vars` to a global L2 norm of at most `max_norm` (PyTorch
/// `clip_grad_norm_(params, max_norm, norm_type=2)`), returning the pre-clip norm and the
/// factor applied.
///
/// The gradients are scaled **in place** on the CPU: a clone of a gradient tensor taken before
/// this call sees the scaled values (gradients from `backward` and from
/// [`crate::GradAccumulator`] are not shared with anything else). Gradients sharing storage with
/// one another are replaced by scaled copies instead.
pub fn clip_grad_norm(grads: &mut GradStore, vars: &[Var], max_norm: f64) -> Result<ClipOutcome> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(TrainError::Hyperparameter {
            what: "max_grad_norm",
            value: max_norm,
            fix: "the clipping threshold must be finite and > 0 (to disable clipping, do not call \
                  clip_grad_norm; use global_grad_norm to only measure)",
        });
    }
    let total_norm = global_grad_norm(grads, vars)?;
    let coef = max_norm / (total_norm + 1e-6);
    if !total_norm.is_finite() || coef >= 1.0 {
        return Ok(ClipOutcome {
            total_norm,
            scale: 1.0,
        });
    }
    let tensors: Vec<(Var, Tensor)> = unique_vars(vars)
        .filter_map(|v| grads.get(v.as_tensor()).map(|g| (v.clone(), g.clone())))
        .collect();
    let mut ids: Vec<usize> = tensors.iter().map(|(_, g)| storage_id(g)).collect();
    ids.sort_unstable();
    let shared = |id: usize| {
        ids.binary_search(&id)
            .is_ok_and(|k| (k > 0 && ids[k - 1] == id) || (k + 1 < ids.len() && ids[k + 1] == id))
    };
    let in_place: Vec<bool> = tensors
        .iter()
        .map(|(_, g)| on_cpu_path(g) && g.is_contiguous() && !shared(storage_id(g)))
        .collect();
    // One parallel region over all tensors (and their chunks).
    let scaled: Vec<bool> = tensors
        .par_iter()
        .zip(&in_place)
        .map(|((_, g), &ok)| {
            if ok {
                scale_cpu(g, coef as f32)
            } else {
                Ok(false)
            }
        })
        .collect::<Result<_>>()?;
    for ((var, g), done) in tensors.iter().zip(scaled) {
        if !done {
            grads.insert(var.as_tensor(), g.affine(coef, 0.0)?);
        }
    }
    Ok(ClipOutcome {
        total_norm,
        scale: coef,
    })
}

/// `vars` without repeats (by tensor id), in order.
fn unique_vars(vars: &[Var]) -> impl Iterator<Item = &Var> {
    let mut seen = HashSet::new();
    vars.iter().filter(move |v| seen.insert(v.id()))
}

/// The gradients of `vars` present in `grads`, each var once.
fn grad_tensors<'a>(grads: &'a GradStore, vars: &[Var]) -> Vec<&'a Tensor> {
    unique_vars(vars)
        .filter_map(|v| grads.get(v.as_tensor()))
        .collect()
}

/// Sum of squares of contiguous CPU tensors: all of them read in place, split into chunks run in
/// parallel, partial sums added in a fixed order (deterministic). f64 tensors and other dtypes go
/// through tensor ops.
fn cpu_sum_sq(tensors: &[&Tensor]) -> Result<f64> {
    let guards: Vec<_> = tensors.iter().map(|t| t.storage_and_layout()).collect();
    let mut slices = Vec::new();
    let mut total = 0f64;
    for (i, (s, l)) in guards.iter().enumerate() {
        match &**s {
            Storage::Cpu(cs) => match float_slice(cs, l) {
                Some(sl) => slices.push(sl),
                None => {
                    let t = tensors[i].to_dtype(DType::F64)?;
                    total += t.sqr()?.sum_all()?.to_scalar::<f64>()?;
                }
            },
            _ => unreachable!("only CPU tensors are passed"),
        }
    }
    let tasks: Vec<(usize, usize)> = slices
        .iter()
        .enumerate()
        .flat_map(|(i, s)| (0..s.len()).step_by(CHUNK).map(move |a| (i, a)))
        .collect();
    let partial: Vec<f64> = tasks
        .par_iter()
        .map(|&(i, a)| {
            let end = (a + CHUNK).min(slices[i].len());
            match &slices[i] {
                FloatSlice::F32(x) => sum_sq(&x[a..end]),
                FloatSlice::BF16(x) => sum_sq(&x[a..end]),
                FloatSlice::F16(x) => sum_sq(&x[a..end]),
            }
        })
        .collect();
    Ok(total + partial.iter().sum::<f64>())
}

/// Multiplies a contiguous CPU gradient by `a` in place; `false` if its dtype is not
/// f32/bf16/f16 (the caller scales a copy instead).
fn scale_cpu(g: &Tensor, a: f32) -> Result<bool> {
    if !matches!(g.dtype(), DType::F32 | DType::BF16 | DType::F16) {
        return Ok(false);
    }
    with_cpu_mut(g, |s, l| {
        match float_slice_mut(s, l) {
            Some(FloatSliceMut::F32(x)) => {
                x.par_chunks_mut(CHUNK).for_each(|c| scale_in_place(c, a))
            }
            Some(FloatSliceMut::BF16(x)) => {
                x.par_chunks_mut(CHUNK).for_each(|c| scale_in_place(c, a))
            }
            Some(FloatSliceMut::F16(x)) => {
                x.par_chunks_mut(CHUNK).for_each(|c| scale_in_place(c, a))
            }
            None => candle_core::bail!("rlft-train: contiguous float gradient expected"),
        }
        Ok(())
    })?;
    Ok(true)
}
