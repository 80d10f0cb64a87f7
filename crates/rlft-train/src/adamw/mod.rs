//! AdamW with PyTorch's semantics (`torch.optim.AdamW`, Loshchilov & Hutter, "Decoupled Weight
//! Decay Regularization", 2019), with parameter groups.
//!
//! For each parameter `p` with gradient `g` at its `t`-th step (t counts the steps on which `p`
//! had a gradient, as PyTorch's per-parameter `step`), with the group's `lr` and `weight_decay`:
//!
//! ```text
//! p  = p * (1 - lr * weight_decay)          decoupled weight decay, before the Adam update
//! m  = m + (1 - beta1) * (g - m)            = beta1 * m + (1 - beta1) * g
//! v  = beta2 * v + (1 - beta2) * g * g
//! p  = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//! ```
//!
//! Parameters without a gradient in the [`GradStore`] are skipped (their `t` does not advance).
//! Two kernels compute the same thing ([`AdamWKernel`]): `Reference`, candle tensor ops (runs
//! anywhere, allocates new tensors), and `Fused` (default): one in-place pass per tensor over
//! parameter, `m`, `v` and gradient on the CPU, all tensors of a step in one rayon parallel region
//! (134.5M params: ~85 ms on 2 cores, on par with PyTorch's `fused=True`, see
//! `examples/adamw_bench.rs`); on other devices and for f64 parameters it falls back to the
//! reference ops.
//!
//! Checkpoints: [`AdamW::state_tensors`] / [`AdamW::load_state_tensors`], named like PyTorch's
//! `state_dict()["state"]` (`state.{i}.exp_avg`, ...; see `state.rs`).
//!
//! **Precision** ([`AdamWPrecision`], `precision.rs`). By default `m` and `v` are f32 (f64 for
//! f64 parameters), and bf16/f16 parameters also get an f32 master copy of the weights: the
//! update is applied to the master and the parameter receives its rounding, so updates smaller
//! than a bf16 ulp are not lost. `SplitMaster` keeps that master in 2 bytes beside a bf16
//! parameter with the same results bit for bit; `ParamDtype` is PyTorch's AdamW on the
//! parameter (moments in its dtype, no master). The master is made from the parameter on its
//! first step; after loading new weights into the vars mid-run, call
//! [`AdamW::sync_master_from_params`].
//!
//! Simplified: no `amsgrad`, `maximize` or `capturable`; hyperparameters other than `lr` and
//! `weight_decay` are shared by all groups.

#![warn(missing_docs)]

mod fused;
pub(crate) mod precision;
mod state;

pub use precision::AdamWPrecision;

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, TensorId, Var};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// Hyperparameters of [`AdamW`], with PyTorch's names and defaults (the transformers/TRL names
/// `learning_rate`, `adam_beta1`, `adam_beta2`, `adam_epsilon` are accepted as aliases).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdamWConfig {
    /// Base learning rate; a group uses `lr * lr_mult`. Usually overwritten every step from the
    /// schedule with [`AdamW::set_lr`]. Default 1e-3.
    #[serde(alias = "learning_rate")]
    pub lr: f64,
    /// Decay rate of the first moment, in [0, 1). Default 0.9.
    #[serde(alias = "adam_beta1")]
    pub beta1: f64,
    /// Decay rate of the second moment, in [0, 1). Default 0.999.
    #[serde(alias = "adam_beta2")]
    pub beta2: f64,
    /// Added to `sqrt(v_hat)` in the denominator, >= 0. Default 1e-8.
    #[serde(alias = "adam_epsilon")]
    pub eps: f64,
    /// Decoupled weight decay of groups that do not set their own, >= 0. Default 0.01 (PyTorch;
    /// transformers' Trainer defaults to 0.0).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl AdamWConfig {
    /// Checks every value is in range; the error names the option and the valid range.
    pub fn validate(&self) -> Result<()> {
        let bad = |what, value: f64, fix| TrainError::Hyperparameter { what, value, fix };
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(bad(
                "lr",
                self.lr,
                "the learning rate must be finite and >= 0",
            ));
        }
        for (what, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(bad(
                    what,
                    b,
                    "Adam betas must be in [0, 1), e.g. 0.9 and 0.999",
                ));
            }
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(bad(
                "eps",
                self.eps,
                "eps must be finite and >= 0, e.g. 1e-8",
            ));
        }
        check_weight_decay(self.weight_decay)
    }
}

fn check_weight_decay(wd: f64) -> Result<()> {
    if wd.is_finite() && wd >= 0.0 {
        return Ok(());
    }
    Err(TrainError::Hyperparameter {
        what: "weight_decay",
        value: wd,
        fix: "weight decay must be finite and >= 0 (0 disables it)",
    })
}

/// A parameter group: vars sharing a learning-rate multiplier and a weight decay (PyTorch's
/// `param_groups` entry).
#[derive(Clone, Debug)]
pub struct ParamGroup {
    /// The trainable tensors of the group (any shapes; float dtypes).
    pub vars: Vec<Var>,
    /// The group's lr is `AdamW::lr() * lr_mult`. Default 1.
    pub lr_mult: f64,
    /// Weight decay of this group; `None` uses [`AdamWConfig::weight_decay`].
    pub weight_decay: Option<f64>,
}

impl ParamGroup {
    /// A group with lr multiplier 1 and the config's weight decay.
    pub fn new(vars: Vec<Var>) -> Self {
        Self {
            vars,
            lr_mult: 1.0,
            weight_decay: None,
        }
    }

    /// Sets the lr multiplier.
    pub fn with_lr_mult(mut self, lr_mult: f64) -> Self {
        self.lr_mult = lr_mult;
        self
    }

    /// Sets the group's own weight decay.
    pub fn with_weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = Some(weight_decay);
        self
    }

    /// The usual split: matrices (rank >= 2, including embeddings) decay with the config's weight
    /// decay; vectors (rank < 2: biases and norm weights) get none. For Llama/Qwen models this is
    /// the set transformers' Trainer decays (it excludes `bias` and norm-layer weights by name).
    /// Returns `[decayed, not decayed]`.
    pub fn split_decay(vars: Vec<Var>) -> Vec<ParamGroup> {
        let (decay, no_decay): (Vec<Var>, Vec<Var>) = vars.into_iter().partition(|v| v.rank() >= 2);
        vec![
            ParamGroup::new(decay),
            ParamGroup::new(no_decay).with_weight_decay(0.0),
        ]
    }
}

/// Which code computes the update (the results agree to float rounding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdamWKernel {
    /// candle tensor ops, one allocation per intermediate: the readable reference, any device.
    Reference,
    /// In-place, multi-threaded single pass per tensor on the CPU; falls back to `Reference` on
    /// other devices and for f64 parameters.
    #[default]
    Fused,
}

/// `lr` and weight decay of one group, validated.
#[derive(Clone, Copy, Debug)]
struct GroupOptions {
    lr_mult: f64,
    weight_decay: f64,
}

/// The master weights of a bf16/f16 parameter.
#[derive(Debug)]
enum Master {
    /// An f32 copy.
    F32(Tensor),
    /// The low halves of the f32 master beside a bf16 parameter (`precision::split`), 16 bits
    /// each in a bf16 tensor.
    Low(Tensor),
}

/// Which [`Master`] a parameter keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MasterForm {
    F32,
    Low,
}

/// Per-parameter state: PyTorch's `step`, `exp_avg`, `exp_avg_sq`, plus the master weights of
/// low-precision parameters.
#[derive(Debug)]
struct ParamState {
    var: Var,
    group: usize,
    step: u64,
    /// `m`, same shape as the parameter, of [`moment_dtype`].
    exp_avg: Tensor,
    /// `v`, like `exp_avg`.
    exp_avg_sq: Tensor,
    /// Master weights of bf16/f16 parameters (not with `ParamDtype`), made on the first step.
    master: Option<Master>,
}

impl ParamState {
    fn new(var: Var, group: usize, precision: AdamWPrecision) -> Result<Self> {
        let dtype = moment_dtype(var.dtype(), precision);
        let exp_avg = state_zeros(var.shape(), dtype, var.device())?;
        let exp_avg_sq = state_zeros(var.shape(), dtype, var.device())?;
        Ok(Self {
            var,
            group,
            step: 0,
            exp_avg,
            exp_avg_sq,
            master: None,
        })
    }

    /// The form of master this parameter keeps under `precision`: `None` for f32/f64
    /// parameters and `ParamDtype`.
    fn master_form(&self, precision: AdamWPrecision) -> Option<MasterForm> {
        match (self.var.dtype(), precision) {
            (_, AdamWPrecision::ParamDtype) | (DType::F32 | DType::F64, _) => None,
            (DType::BF16, AdamWPrecision::SplitMaster) => Some(MasterForm::Low),
            _ => Some(MasterForm::F32),
        }
    }

    /// The master this parameter keeps under `precision`, made from the parameter: an exact
    /// f32 copy, or zero low halves.
    fn new_master(&self, precision: AdamWPrecision) -> Result<Option<Master>> {
        let t = self.var.as_tensor();
        // Detached: a copy made from the var would otherwise record the op, and every later
        // master (computed from it) would keep the whole chain of earlier ones.
        Ok(match self.master_form(precision) {
            None => None,
            Some(MasterForm::Low) => Some(Master::Low(t.zeros_like()?.detach())),
            Some(MasterForm::F32) => Some(Master::F32(t.to_dtype(DType::F32)?.detach())),
        })
    }
}

/// A zero moment tensor of `shape` (`dtype` f32 or f64). On the CPU its memory is written
/// here, by the pool's threads, rather than allocated zeroed: a zeroed allocation that large
/// comes straight from the kernel and maps every page to the shared zero page on the first
/// step's read, then copies each page on write with a TLB flush on every core (about 5 s of
/// the first optimizer step over SmolLM2-135M's 134.5M parameters on 2 cores, against 0.1 s
/// for the later steps; see `docs/kernels.md`).
fn state_zeros(
    shape: &candle_core::Shape,
    dtype: DType,
    dev: &candle_core::Device,
) -> Result<Tensor> {
    fn written<T: candle_core::WithDType>(n: usize) -> Vec<T> {
        let mut v: Vec<T> = Vec::with_capacity(n);
        v.spare_capacity_mut()
            .par_chunks_mut(1 << 16)
            .for_each(|c| {
                c.iter_mut().for_each(|x| {
                    x.write(T::zero());
                })
            });
        // SAFETY: the loop above initialised all `n` elements of the capacity.
        unsafe { v.set_len(n) };
        v
    }
    let n = shape.elem_count();
    Ok(match (dev, dtype) {
        (candle_core::Device::Cpu, DType::F32) => Tensor::from_vec(written::<f32>(n), shape, dev)?,
        (candle_core::Device::Cpu, DType::F64) => Tensor::from_vec(written::<f64>(n), shape, dev)?,
        _ => Tensor::zeros(shape, dtype, dev)?,
    })
}

/// Dtype the update is computed in for a parameter of dtype `d`: f64 for f64, else f32.
fn compute_dtype(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Dtype of the moments of a parameter of dtype `d` under `precision`.
fn moment_dtype(d: DType, precision: AdamWPrecision) -> DType {
    match precision {
        AdamWPrecision::ParamDtype => d,
        _ => compute_dtype(d),
    }
}

/// The scalars of one parameter's update at its step `t`, in f64.
#[derive(Clone, Copy, Debug)]
struct StepScalars {
    decay: f64,
    one_minus_beta1: f64,
    beta2: f64,
    step_size: f64,
    bc2_sqrt: f64,
    eps: f64,
}

impl StepScalars {
    fn new(cfg: &AdamWConfig, lr: f64, weight_decay: f64, t: u64) -> Self {
        // `powf` like Python's `beta ** step` (C `pow`), not repeated multiplication.
        let bc1 = 1.0 - cfg.beta1.powf(t as f64);
        let bc2 = 1.0 - cfg.beta2.powf(t as f64);
        Self {
            decay: 1.0 - lr * weight_decay,
            one_minus_beta1: 1.0 - cfg.beta1,
            beta2: cfg.beta2,
            step_size: lr / bc1,
            bc2_sqrt: bc2.sqrt(),
            eps: cfg.eps,
        }
    }
}

/// AdamW over parameter groups; see the module docs for the maths and precision.
#[derive(Debug)]
pub struct AdamW {
    cfg: AdamWConfig,
    kernel: AdamWKernel,
    precision: AdamWPrecision,
    groups: Vec<GroupOptions>,
    /// One entry per var, groups in order, vars in group order (PyTorch's state index order).
    params: Vec<ParamState>,
}

impl AdamW {
    /// Builds the optimizer with the fused kernel and zeroed moments (allocated now, on each
    /// var's device). Errors if the config is out of range, a var is listed twice or is not float.
    pub fn new(groups: Vec<ParamGroup>, cfg: AdamWConfig) -> Result<Self> {
        cfg.validate()?;
        let mut seen: std::collections::HashMap<TensorId, usize> = Default::default();
        let mut options = Vec::with_capacity(groups.len());
        let mut params = Vec::new();
        for (gi, group) in groups.into_iter().enumerate() {
            let weight_decay = group.weight_decay.unwrap_or(cfg.weight_decay);
            check_weight_decay(weight_decay)?;
            if !(group.lr_mult.is_finite() && group.lr_mult >= 0.0) {
                return Err(TrainError::Hyperparameter {
                    what: "lr_mult",
                    value: group.lr_mult,
                    fix: "a group's lr multiplier must be finite and >= 0",
                });
            }
            options.push(GroupOptions {
                lr_mult: group.lr_mult,
                weight_decay,
            });
            for var in group.vars {
                if let Some(prev) = seen.insert(var.id(), gi) {
                    return Err(TrainError::Groups(format!(
                        "a var of shape {:?} is in group {prev} and group {gi}; list each var once",
                        var.dims()
                    )));
                }
                if !var.dtype().is_float() {
                    return Err(TrainError::Groups(format!(
                        "a var of dtype {:?} cannot be trained; keep integer tensors out of the groups",
                        var.dtype()
                    )));
                }
                params.push(ParamState::new(var, gi, AdamWPrecision::default())?);
            }
        }
        Ok(Self {
            cfg,
            kernel: AdamWKernel::default(),
            precision: AdamWPrecision::default(),
            groups: options,
            params,
        })
    }

    /// Selects the kernel (default [`AdamWKernel::Fused`]).
    pub fn with_kernel(mut self, kernel: AdamWKernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// The kernel in use.
    pub fn kernel(&self) -> AdamWKernel {
        self.kernel
    }

    /// Selects where the state is kept (default [`AdamWPrecision::F32Master`]); before the
    /// first step. `SplitMaster` updates its bf16 parameters on the CPU only: elsewhere it is
    /// refused with the alternatives.
    pub fn with_precision(mut self, precision: AdamWPrecision) -> Result<Self> {
        if precision == self.precision {
            return Ok(self);
        }
        if self.params.iter().any(|p| p.step > 0) {
            return Err(TrainError::Precision(
                "the precision is chosen before the first step; build the optimizer again".into(),
            ));
        }
        if precision == AdamWPrecision::SplitMaster {
            let off_cpu = |p: &ParamState| p.var.dtype() == DType::BF16 && !p.var.device().is_cpu();
            if self.params.iter().any(off_cpu) {
                return Err(TrainError::Precision(
                    "the split master (optim = \"adamw_exact\") runs on the CPU only in this \
                     build; on a GPU use the f32 master (optim = \"adamw_f32_master\", the \
                     default) or PyTorch's bf16 state (optim = \"adamw_torch\")"
                        .into(),
                ));
            }
        }
        // No master exists before the first step: only moments of another dtype are re-made.
        for p in &mut self.params {
            if moment_dtype(p.var.dtype(), precision) != p.exp_avg.dtype() {
                *p = ParamState::new(p.var.clone(), p.group, precision)?;
            }
        }
        self.precision = precision;
        Ok(self)
    }

    /// Where the state is kept.
    pub fn precision(&self) -> AdamWPrecision {
        self.precision
    }

    /// The hyperparameters (`lr` is the current base lr).
    pub fn config(&self) -> &AdamWConfig {
        &self.cfg
    }

    /// Current base learning rate (group `i` uses `lr() * lr_mult_i`).
    pub fn lr(&self) -> f64 {
        self.cfg.lr
    }

    /// Sets the base learning rate, e.g. from [`crate::LrScheduler::lr_at`] before each step.
    pub fn set_lr(&mut self, lr: f64) {
        self.cfg.lr = lr;
    }

    /// All vars, in state order (groups in order, then vars in group order).
    pub fn vars(&self) -> Vec<Var> {
        self.params.iter().map(|p| p.var.clone()).collect()
    }

    /// Total number of trainable elements.
    pub fn num_params(&self) -> usize {
        self.params.iter().map(|p| p.var.elem_count()).sum()
    }

    /// Steps taken by parameter `index` (state order); `None` if out of range.
    pub fn param_step(&self, index: usize) -> Option<u64> {
        self.params.get(index).map(|p| p.step)
    }

    /// One AdamW step: updates every var that has a gradient in `grads` (gradient shape = var
    /// shape, any float dtype) in place. Vars without a gradient are left untouched.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        // Checks first, so that an error leaves every parameter untouched.
        let mut work = Vec::new();
        for (index, st) in self.params.iter().enumerate() {
            let Some(grad) = grads.get(st.var.as_tensor()) else {
                continue;
            };
            if grad.dims() != st.var.dims() {
                return Err(TrainError::State(format!(
                    "the gradient of parameter {index} has shape {:?} but the var has {:?}; pass \
                     the GradStore computed from this model's loss",
                    grad.dims(),
                    st.var.dims()
                )));
            }
            let group = self.groups[st.group];
            let lr = self.cfg.lr * group.lr_mult;
            let sc = StepScalars::new(&self.cfg, lr, group.weight_decay, st.step + 1);
            work.push((index, grad.clone(), sc));
        }
        for (index, _, _) in &work {
            let st = &mut self.params[*index];
            if st.master.is_none() {
                st.master = st.new_master(self.precision)?;
            }
        }
        let fuse = |st: &ParamState, g: &Tensor| {
            self.kernel == AdamWKernel::Fused && fused::can_update(st, g)
        };
        let (fusable, rest): (Vec<_>, Vec<_>) =
            work.iter().partition(|(i, g, _)| fuse(&self.params[*i], g));
        // One parallel region for all fused tensors: rayon balances tensors and their chunks
        // over the pool instead of waking it once per tensor.
        fusable
            .par_iter()
            .try_for_each(|(i, g, sc)| fused::update(&self.params[*i], g, sc))?;
        for (i, g, sc) in rest {
            reference_update(&mut self.params[*i], g, sc)?;
        }
        for (index, _, _) in &work {
            self.params[*index].step += 1;
        }
        Ok(())
    }

    /// Forgets the master weights of bf16/f16 parameters; they are re-made from the vars on
    /// their next step. Call after writing new values into the vars (e.g. loading weights).
    pub fn sync_master_from_params(&mut self) {
        for st in &mut self.params {
            st.master = None;
        }
    }
}

/// The update with candle tensor ops (allocating); `st.step` is not yet incremented. The maths
/// is in f32 (f64 for f64 parameters) whatever the state's dtypes.
fn reference_update(st: &mut ParamState, grad: &Tensor, sc: &StepScalars) -> Result<()> {
    let dtype = compute_dtype(st.var.dtype());
    // A gradient straight from candle's backward can be tracked; moments made from it would keep
    // its graph (the forward's activations) alive.
    let g = grad.to_dtype(dtype)?.detach();
    // Detached: the update is not differentiated, and a tracked result would hold its inputs
    // (the previous master, the step) alive for as long as it lives, step after step.
    let p = match &st.master {
        Some(Master::F32(w)) => w.detach(),
        Some(Master::Low(lo)) => host_join(st.var.as_tensor(), lo)?,
        None => st.var.as_tensor().to_dtype(dtype)?.detach(),
    };
    // Multiplying by exactly 1 changes nothing: skip the pass when there is no decay.
    let p = if sc.decay != 1.0 {
        p.affine(sc.decay, 0.0)?
    } else {
        p
    };
    let (m0, v0) = (st.exp_avg.to_dtype(dtype)?, st.exp_avg_sq.to_dtype(dtype)?);
    let m = (&m0 + ((&g - &m0)? * sc.one_minus_beta1)?)?;
    let v = ((&v0 * sc.beta2)? + (g.sqr()? * (1.0 - sc.beta2))?)?;
    let denom = ((v.sqrt()? / sc.bc2_sqrt)? + sc.eps)?;
    let p = (p - ((&m / &denom)? * sc.step_size)?)?;
    st.exp_avg = m.to_dtype(st.exp_avg.dtype())?;
    st.exp_avg_sq = v.to_dtype(st.exp_avg_sq.dtype())?;
    match &mut st.master {
        Some(Master::F32(w)) => {
            st.var.set(&p.to_dtype(st.var.dtype())?)?;
            *w = p;
        }
        Some(Master::Low(lo)) => {
            let (hi, low) = host_split(&p)?;
            st.var.set(&hi)?;
            *lo = low;
        }
        None => st.var.set(&p.to_dtype(st.var.dtype())?)?,
    }
    Ok(())
}

/// The f32 masters of bf16 parameters `hi` with low halves `lo` (CPU tensors of one shape).
fn host_join(hi: &Tensor, lo: &Tensor) -> Result<Tensor> {
    let (h, l) = (host_bf16(hi)?, host_bf16(lo)?);
    let w: Vec<f32> = h
        .iter()
        .zip(&l)
        .map(|(&h, &l)| precision::join(h, l))
        .collect();
    Ok(Tensor::from_vec(w, hi.shape(), hi.device())?)
}

/// `(hi, lo)` of f32 masters `w` (a CPU tensor): the bf16 parameters and their low halves.
fn host_split(w: &Tensor) -> Result<(Tensor, Tensor)> {
    let (shape, dev) = (w.shape().clone(), w.device().clone());
    let w = w.flatten_all()?.to_vec1::<f32>()?;
    let (hi, lo): (Vec<_>, Vec<_>) = w.into_iter().map(precision::split).unzip();
    let hi = Tensor::from_vec(hi, &shape, &dev)?;
    Ok((hi, Tensor::from_vec(lo, shape, &dev)?))
}

/// The elements of a bf16 tensor, in order.
fn host_bf16(t: &Tensor) -> Result<Vec<half::bf16>> {
    Ok(t.flatten_all()?.to_vec1::<half::bf16>()?)
}

impl candle_nn::Optimizer for AdamW {
    type Config = AdamWConfig;

    /// One group holding `vars` with the config's weight decay; fused kernel.
    fn new(vars: Vec<Var>, config: AdamWConfig) -> candle_core::Result<Self> {
        AdamW::new(vec![ParamGroup::new(vars)], config).map_err(candle_core::Error::wrap)
    }

    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        AdamW::step(self, grads).map_err(candle_core::Error::wrap)
    }

    fn learning_rate(&self) -> f64 {
        self.lr()
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.set_lr(lr)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Shape, Tensor, Var};
    use candle_nn::Optimizer;

    /// The tensor path (the one every non-CPU device takes) keeps no op graph in its state:
    /// a tracked master or moment would hold every earlier step's tensors alive (on a GPU,
    /// three parameter-sized f32 tensors more per step until memory runs out).
    #[test]
    fn reference_update_state_tracks_no_graph() {
        for dtype in [DType::BF16, DType::F32] {
            let w = Tensor::arange(0f32, 6.0, &Device::Cpu).unwrap();
            let var =
                Var::from_tensor(&w.to_dtype(dtype).unwrap().reshape((2, 3)).unwrap()).unwrap();
            let mut opt = super::AdamW::new(
                vec![super::ParamGroup::new(vec![var.clone()])],
                super::AdamWConfig {
                    weight_decay: 0.1,
                    ..Default::default()
                },
            )
            .unwrap()
            .with_kernel(super::AdamWKernel::Reference);
            for _ in 0..3 {
                let loss = var
                    .as_tensor()
                    .to_dtype(DType::F32)
                    .unwrap()
                    .sqr()
                    .unwrap()
                    .sum_all();
                let grads = loss.unwrap().backward().unwrap();
                Optimizer::step(&mut opt, &grads).unwrap();
            }
            let st = &opt.params[0];
            assert_eq!(st.step, 3);
            assert_eq!(st.master.is_some(), dtype == DType::BF16);
            let master = st.master.as_ref().map(|m| match m {
                super::Master::F32(w) | super::Master::Low(w) => w,
            });
            for t in [Some(&st.exp_avg), Some(&st.exp_avg_sq), master]
                .into_iter()
                .flatten()
            {
                assert!(
                    !t.track_op(),
                    "{dtype:?}: optimizer state records an op graph"
                );
            }
        }
    }

    /// The written zeros are zeros of the asked shape and dtype, across several of the
    /// parallel fill's chunks and a partial last one.
    #[test]
    fn state_zeros_are_zero() {
        let shape = Shape::from((3, 70_001));
        for dtype in [DType::F32, DType::F64] {
            let t = super::state_zeros(&shape, dtype, &Device::Cpu).unwrap();
            assert_eq!((t.dims(), t.dtype()), (shape.dims(), dtype));
            let max = t.abs().unwrap().max_all().unwrap();
            assert_eq!(
                max.to_dtype(DType::F64)
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap(),
                0.0
            );
        }
    }
}
