//! The optimiser step every trainer takes: micro-batches (forward, loss, backward, gradients
//! summed), the global-norm clip, AdamW and the LR schedule; a non-finite loss or gradient norm
//! skips the update (the schedule does not advance). Also AdamW and the schedule built from
//! [`TrainingArgs`].

use std::collections::BTreeMap;
use std::time::Instant;

use candle_core::{DType, Tensor, Var};
use rlft_model::checkpoint::Checkpointing;
use rlft_train::checkpoint::TrainerState;
use rlft_train::{
    clip_grad_norm, AdamW, AdamWConfig, GradAccumulator, LrSchedule, LrScheduler, ParamGroup,
    TrainError, Warmup,
};

use super::{Algorithm, MicroContext, Policy};
use crate::config::{LrSchedulerType, Optim, TrainingArgs};
use crate::error::Result;

/// Token-weighted means of a step's diagnostics (clip ratios, KL, entropy...), summed over its
/// micro-batches, counts summed over them, and extremes (smallest / largest) over them.
#[derive(Debug, Clone, Default)]
pub struct StepStats {
    sums: BTreeMap<&'static str, (f64, f64)>,
    totals: BTreeMap<&'static str, f64>,
    lows: BTreeMap<&'static str, f64>,
    highs: BTreeMap<&'static str, f64>,
    /// Tokens the step's forward passes processed (for `tokens_per_s`).
    pub tokens: usize,
}

impl StepStats {
    /// Adds `value`, weighted by `weight` (usually the micro-batch's token count).
    pub fn add(&mut self, key: &'static str, value: f64, weight: f64) {
        let e = self.sums.entry(key).or_insert((0.0, 0.0));
        e.0 += value * weight;
        e.1 += weight;
    }

    /// The weighted means, by key.
    pub fn means(&self) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        self.sums
            .iter()
            .filter(|(_, (_, w))| *w > 0.0)
            .map(|(k, (s, w))| (*k, s / w))
    }

    /// Adds `n` to the step's count `key` (reported even when it stays 0).
    pub fn count(&mut self, key: &'static str, n: f64) {
        *self.totals.entry(key).or_insert(0.0) += n;
    }

    /// The counts, by key.
    pub fn counts(&self) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        self.totals.iter().map(|(k, n)| (*k, *n))
    }

    /// Keeps the smallest `value` seen under `key`.
    pub fn min(&mut self, key: &'static str, value: f64) {
        let e = self.lows.entry(key).or_insert(f64::INFINITY);
        *e = e.min(value);
    }

    /// Keeps the largest `value` seen under `key`.
    pub fn max(&mut self, key: &'static str, value: f64) {
        let e = self.highs.entry(key).or_insert(f64::NEG_INFINITY);
        *e = e.max(value);
    }

    /// The smallest value kept under `key` by [`Self::min`], or the largest by [`Self::max`].
    pub fn extreme(&self, key: &str) -> Option<f64> {
        self.lows.get(key).or_else(|| self.highs.get(key)).copied()
    }
}

/// What an optimiser step did.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    /// The step's loss (sum of its micro-batch losses).
    pub loss: f64,
    /// Global gradient norm before clipping; NaN when the update was skipped.
    pub grad_norm: f64,
    /// Learning rate of the step.
    pub lr: f64,
    /// False when a non-finite loss or norm skipped the update: the one signal of a skipped
    /// step (the run core counts and warns; `grad_norm` is then NaN in the metrics).
    pub applied: bool,
    /// Tokens processed.
    pub tokens: usize,
    /// Wall seconds of the step.
    pub seconds: f64,
    /// The algorithm's diagnostics.
    pub stats: StepStats,
}

/// A seed mixing the run seed with a counter (splitmix64 finaliser).
pub fn mix(seed: u64, k: u64) -> u64 {
    let mut z = seed ^ k.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One optimiser step over `micro` (its micro-batches).
#[allow(clippy::too_many_arguments)]
pub(super) fn step<A: Algorithm>(
    algo: &mut A,
    policy: &mut Policy,
    all_vars: &[(String, Var)],
    unit: &A::Unit,
    micro: &[Vec<usize>],
    opt: &mut AdamW,
    sched: &LrScheduler,
    state: &mut TrainerState,
    args: &TrainingArgs,
) -> Result<StepOutcome> {
    let t0 = Instant::now();
    // LoRA dropout masks depend only on (seed, step), so a resumed run draws the same ones.
    if policy.lora.is_some() {
        let seed = mix(args.seed ^ 0x5EED, state.global_step);
        rlft_model::lora::set_dropout_seed(&mut policy.model, Some(seed));
    }
    let policy = &*policy;
    let vars: Vec<Var> = all_vars.iter().map(|(_, v)| v.clone()).collect();
    let mut acc = GradAccumulator::new(vars.clone());
    // PyTorch's AdamW layout keeps the gradient sums in the weights' dtype too.
    if args.optim == Optim::AdamWTorch {
        acc = acc.in_param_dtype();
    }
    let mut stats = StepStats::default();
    let mut loss_sum = 0f64;
    for mb in micro {
        let session = args
            .gradient_checkpointing
            .then(|| Checkpointing::begin(&policy.model))
            .transpose()?;
        // `None`: the micro-batch's loss and gradient are exactly 0 and were not computed.
        let (step, stats) = (micro, &mut stats);
        let cx = MicroContext {
            policy,
            unit,
            step,
            micro: mb,
            stats,
        };
        let Some(loss) = algo.micro_loss(cx)? else {
            continue;
        };
        loss_sum += loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let grads = match session {
            Some(s) => s.backward(&loss, all_vars)?,
            None => rlft_model::trainable::backward(&loss, all_vars)?,
        };
        acc.add_owned(grads, 1.0)?;
    }
    let mut grads = if acc.micro_batches() == 0 {
        zero_grads(&vars)?
    } else {
        acc.finish()
    };
    let lr = sched.lr_at(
        state.rlft.scheduler_step as usize,
        algo.total_steps() as usize,
    );
    let norm = if args.max_grad_norm > 0.0 {
        clip_grad_norm(&mut grads, &vars, args.max_grad_norm)?.total_norm
    } else {
        rlft_train::global_grad_norm(&grads, &vars)?
    };
    let applied = norm.is_finite() && loss_sum.is_finite();
    if applied {
        opt.set_lr(lr);
        opt.step(&grads)?;
        state.rlft.scheduler_step += 1;
    }
    Ok(StepOutcome {
        loss: loss_sum,
        grad_norm: if applied { norm } else { f64::NAN },
        lr,
        applied,
        tokens: stats.tokens,
        seconds: t0.elapsed().as_secs_f64(),
        stats,
    })
}

/// The gradients of a step none of whose micro-batches was computed (each one's is exactly 0,
/// see [`Algorithm::micro_loss`]): a zero for every var, in the dtype [`GradAccumulator`] sums
/// in (f32; f64 for f64 vars). AdamW then steps as it does after computed zero gradients: its
/// moments decay, weight decay applies and its step count advances.
fn zero_grads(vars: &[Var]) -> Result<candle_core::backprop::GradStore> {
    let mut grads = candle_core::backprop::GradStore::default();
    for v in vars {
        let dtype = if v.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        grads.insert(v.as_tensor(), Tensor::zeros(v.shape(), dtype, v.device())?);
    }
    Ok(grads)
}

/// AdamW over the trainable parameters (no decay on vectors: biases, norms), keeping its state
/// as `optim` says.
pub fn optimizer(args: &TrainingArgs, vars: &[(String, Var)]) -> Result<AdamW, TrainError> {
    let groups = ParamGroup::split_decay(vars.iter().map(|(_, v)| v.clone()).collect());
    AdamW::new(
        groups,
        AdamWConfig {
            lr: args.learning_rate,
            beta1: args.adam_beta1,
            beta2: args.adam_beta2,
            eps: args.adam_epsilon,
            weight_decay: args.weight_decay,
        },
    )?
    .with_precision(args.optim.precision())
}

/// The LR schedule of the settings.
pub fn scheduler(args: &TrainingArgs) -> Result<LrScheduler, TrainError> {
    let schedule = match args.lr_scheduler_type {
        LrSchedulerType::Constant | LrSchedulerType::ConstantWithWarmup => LrSchedule::Constant,
        LrSchedulerType::Linear => LrSchedule::Linear,
        LrSchedulerType::Cosine => LrSchedule::Cosine,
        LrSchedulerType::CosineWithMinLr => LrSchedule::CosineWithMinLr {
            min_lr_rate: args.min_lr_rate,
        },
    };
    let warmup = if args.warmup_steps > 0 {
        Warmup::Steps(args.warmup_steps)
    } else {
        Warmup::Ratio(args.warmup_ratio)
    };
    Ok(LrScheduler {
        base_lr: args.learning_rate,
        schedule,
        warmup,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schedule_builds() {
        let mut a = TrainingArgs {
            learning_rate: 1e-3,
            min_lr_rate: 0.1,
            ..Default::default()
        };
        for t in [
            LrSchedulerType::Constant,
            LrSchedulerType::ConstantWithWarmup,
            LrSchedulerType::Linear,
            LrSchedulerType::Cosine,
            LrSchedulerType::CosineWithMinLr,
        ] {
            a.lr_scheduler_type = t;
            let end = scheduler(&a).unwrap().lr_at(100, 100);
            if t == LrSchedulerType::CosineWithMinLr {
                assert!((end - 1e-4).abs() < 1e-12, "{end}");
            }
        }
    }

    #[test]
    fn weighted_means_by_key() {
        let mut s = StepStats::default();
        s.add("kl", 1.0, 1.0);
        s.add("kl", 4.0, 3.0);
        s.add("entropy", 2.0, 0.0);
        let m: Vec<_> = s.means().collect();
        assert_eq!(m, vec![("kl", 13.0 / 4.0)]);
    }
}
