//! Gradient accumulation over micro-batches: `sum_i weight_i * grads_i`, kept in f32, or in each
//! parameter's dtype ([`GradAccumulator::in_param_dtype`]: bf16 sums of bf16 weights, as PyTorch
//! accumulates `.grad`; each addition computed in f32 and rounded once).
//!
//! The weight says how micro-batch losses combine into the batch loss:
//! - each micro-batch loss is a mean and the batch loss is their mean (transformers' default):
//!   weight `1 / accumulation_steps` ([`GradAccumulator::add_mean`]);
//! - each micro-batch loss is a mean over its tokens and the batch loss is the mean over all
//!   tokens of the batch: weight `tokens_i / total_tokens`
//!   ([`GradAccumulator::add_token_weighted`]); with this, batch B x accum 1 == batch 1 x accum
//!   B exactly, whatever the sequence lengths;
//! - plain sum: weight 1.
//!
//! On the CPU the first micro-batch is copied (scaled) in one parallel pass, or taken as it is
//! when the caller hands over the store ([`GradAccumulator::add_owned`]), and later ones are
//! added in place (`sum += w * g`), so no gradient but the sums stays alive between
//! micro-batches.

#![warn(missing_docs)]

use std::collections::HashSet;

use candle_core::backprop::GradStore;
use candle_core::{DType, Storage, Tensor, Var};
use rayon::prelude::*;

use crate::cpu::{
    axpy, f32_slice_mut, float_slice, is_fusable, on_cpu_path, scaled_copy, with_cpu_mut,
    FloatSlice, CHUNK,
};
use crate::error::{Result, TrainError};

/// Accumulates the gradients of a fixed list of vars over micro-batches.
#[derive(Debug)]
pub struct GradAccumulator {
    vars: Vec<Var>,
    /// Weighted sums, one per var (`None` until it gets a gradient); f32 (f64 for f64 grads),
    /// or the var's dtype with `param_dtype`.
    sums: Vec<Option<Tensor>>,
    micro_batches: usize,
    param_dtype: bool,
}

impl GradAccumulator {
    /// An empty accumulator for `vars` (a var listed twice is kept once).
    pub fn new(vars: Vec<Var>) -> Self {
        let mut seen = HashSet::new();
        let vars: Vec<Var> = vars.into_iter().filter(|v| seen.insert(v.id())).collect();
        let sums = vec![None; vars.len()];
        Self {
            vars,
            sums,
            micro_batches: 0,
            param_dtype: false,
        }
    }

    /// Keeps each sum in its var's dtype (2 bytes per element of bf16 weights instead of 4).
    pub fn in_param_dtype(mut self) -> Self {
        self.param_dtype = true;
        self
    }

    /// Micro-batches added since the last [`GradAccumulator::finish`].
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Adds `weight * grad` for every var with a gradient in `grads` (others: as if zero).
    pub fn add(&mut self, grads: &GradStore, weight: f64) -> Result<()> {
        if !weight.is_finite() {
            return Err(TrainError::Hyperparameter {
                what: "accumulation weight",
                value: weight,
                fix: "use 1/accumulation_steps, tokens_i/total_tokens or 1",
            });
        }
        for var in &self.vars {
            match grads.get(var.as_tensor()) {
                Some(g) if g.dims() != var.dims() => {
                    return Err(TrainError::State(format!(
                        "a gradient has shape {:?} but its var has {:?}; pass the GradStore of \
                         this model's loss",
                        g.dims(),
                        var.dims()
                    )))
                }
                _ => {}
            }
        }
        // One parallel region over all vars (and their chunks).
        self.vars
            .par_iter()
            .zip(self.sums.par_iter_mut())
            .try_for_each(|(var, sum)| -> Result<()> {
                let Some(g) = grads.get(var.as_tensor()) else {
                    return Ok(());
                };
                match sum {
                    None => {
                        let first = scaled_copy_tensor(g, weight)?;
                        *sum = Some(if self.param_dtype {
                            first.to_dtype(var.dtype())?
                        } else {
                            first
                        });
                    }
                    Some(s) => {
                        if !add_in_place(s, g, weight as f32)? {
                            // In f32 (f64) whatever the sum is kept in, rounded once.
                            let wide = sum_dtype(s.dtype());
                            let total = (s.to_dtype(wide)? + (g.to_dtype(wide)? * weight)?)?;
                            *s = total.to_dtype(s.dtype())?.detach();
                        }
                    }
                }
                Ok(())
            })?;
        self.micro_batches += 1;
        Ok(())
    }

    /// [`Self::add`] taking the store: on the first micro-batch, f32 CPU gradients at weight 1
    /// become the sums as they are, with no copy (the sums of a 135M-parameter model are
    /// 540 MB: the copy cost a pass over them and their pages on every step). Later
    /// micro-batches, other weights and other dtypes are added as [`Self::add`] does.
    ///
    /// The store's tensors must not share their storage with tensors used elsewhere: true of
    /// a store just returned by `backward` (each gradient there is a fresh tensor), not of one
    /// built from clones of live tensors.
    pub fn add_owned(&mut self, mut grads: GradStore, weight: f64) -> Result<()> {
        if weight == 1.0 && self.sums.iter().all(Option::is_none) {
            for (var, sum) in self.vars.iter().zip(self.sums.iter_mut()) {
                let owned = grads
                    .get(var.as_tensor())
                    .is_some_and(|g| g.dims() == var.dims() && owns_f32_storage(g));
                if owned {
                    *sum = grads.remove(var.as_tensor());
                }
            }
        }
        self.add(&grads, weight)
    }

    /// Adds one of `accumulation_steps` micro-batches whose losses are averaged (weight
    /// `1 / accumulation_steps`).
    pub fn add_mean(&mut self, grads: &GradStore, accumulation_steps: usize) -> Result<()> {
        if accumulation_steps == 0 {
            return Err(TrainError::Hyperparameter {
                what: "gradient_accumulation_steps",
                value: 0.0,
                fix: "must be >= 1",
            });
        }
        self.add(grads, 1.0 / accumulation_steps as f64)
    }

    /// Adds a micro-batch whose loss is the mean over its `tokens` tokens, for a batch loss that
    /// is the mean over all `total_tokens` tokens (weight `tokens / total_tokens`).
    pub fn add_token_weighted(
        &mut self,
        grads: &GradStore,
        tokens: usize,
        total_tokens: usize,
    ) -> Result<()> {
        if total_tokens == 0 || tokens > total_tokens {
            return Err(TrainError::Hyperparameter {
                what: "total_tokens",
                value: total_tokens as f64,
                fix: "count the loss tokens of all micro-batches of the step before adding them \
                      (total_tokens >= tokens of each micro-batch, > 0)",
            });
        }
        self.add(grads, tokens as f64 / total_tokens as f64)
    }

    /// The accumulated gradients (keyed by the vars, ready for clipping and the optimizer) and
    /// a reset: the next micro-batch starts a new sum.
    pub fn finish(&mut self) -> GradStore {
        let mut out = GradStore::default();
        for (var, sum) in self.vars.iter().zip(self.sums.iter_mut()) {
            if let Some(s) = sum.take() {
                out.insert(var.as_tensor(), s);
            }
        }
        self.micro_batches = 0;
        out
    }
}

/// Whether `g` is a contiguous f32 CPU tensor spanning its whole storage (not a view into a
/// larger buffer), so it can serve as an accumulation sum and be updated in place.
fn owns_f32_storage(g: &Tensor) -> bool {
    if !(on_cpu_path(g) && g.dtype() == DType::F32 && g.is_contiguous()) {
        return false;
    }
    let (s, l) = g.storage_and_layout();
    match &*s {
        Storage::Cpu(cs) => {
            l.start_offset() == 0
                && cs
                    .as_slice::<f32>()
                    .is_ok_and(|v| v.len() == g.elem_count())
        }
        _ => false,
    }
}

/// `weight * g` as a new tensor owning its storage: f32 (f64 for f64 `g`), one parallel pass on
/// the CPU.
fn scaled_copy_tensor(g: &Tensor, weight: f64) -> Result<Tensor> {
    if is_fusable(g) {
        let (s, l) = g.storage_and_layout();
        if let Storage::Cpu(cs) = &*s {
            if let Some(x) = float_slice(cs, l) {
                let mut out = vec![0f32; x.len()];
                let w = weight as f32;
                let chunks = out.par_chunks_mut(CHUNK).enumerate();
                match x {
                    FloatSlice::F32(x) => {
                        chunks.for_each(|(i, o)| scaled_copy(o, &x[i * CHUNK..], w))
                    }
                    FloatSlice::BF16(x) => {
                        chunks.for_each(|(i, o)| scaled_copy(o, &x[i * CHUNK..], w))
                    }
                    FloatSlice::F16(x) => {
                        chunks.for_each(|(i, o)| scaled_copy(o, &x[i * CHUNK..], w))
                    }
                }
                return Ok(Tensor::from_vec(out, g.shape(), g.device())?);
            }
        }
    }
    let dtype = sum_dtype(g.dtype());
    // `affine` always allocates, so the sum never shares storage with `g`. Detached: a tracked
    // gradient's graph must not live on in the sum.
    Ok((g.to_dtype(dtype)? * weight)?.detach())
}

/// The dtype a sum of gradients of dtype `d` is computed in: f64 for f64, else f32.
fn sum_dtype(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// `sum += w * g` in place on the CPU; `false` if either tensor is not handled there.
fn add_in_place(sum: &Tensor, g: &Tensor, w: f32) -> Result<bool> {
    if !(is_fusable(g) && on_cpu_path(sum) && sum.dtype() == DType::F32) {
        return Ok(false);
    }
    let (gs, gl) = g.storage_and_layout();
    let Storage::Cpu(gs) = &*gs else {
        return Ok(false);
    };
    let Some(x) = float_slice(gs, gl) else {
        return Ok(false);
    };
    with_cpu_mut(sum, |ss, sl| {
        let acc = f32_slice_mut(ss, sl)?;
        let chunks = acc.par_chunks_mut(CHUNK).enumerate();
        match &x {
            FloatSlice::F32(x) => chunks.for_each(|(i, a)| axpy(a, &x[i * CHUNK..], w)),
            FloatSlice::BF16(x) => chunks.for_each(|(i, a)| axpy(a, &x[i * CHUNK..], w)),
            FloatSlice::F16(x) => chunks.for_each(|(i, a)| axpy(a, &x[i * CHUNK..], w)),
        }
        Ok(())
    })?;
    Ok(true)
}
