//! What the offline trainers (SFT, reward models, DPO) share: a unit is one optimiser step's
//! micro-batches of dataset rows, and the step count follows from epochs or `max_steps`.
//!
//! An offline trainer implements [`OfflineAlgorithm`] (its loss, its eval, what a step carries
//! besides its rows); [`run`] runs it on the run core as an [`Algorithm`].

use std::path::{Path, PathBuf};

use candle_core::Tensor;

use serde_json::{json, Value};

use super::{
    Algorithm, Console, Metrics, MicroContext, Policy, Position, RunOptions, RunSummary,
    StepOutcome, StepStats, UnitContext,
};
use crate::config::{TrainerConfig, TrainingArgs};
use crate::data::DataCursor;
use crate::error::Result;

/// Optimiser steps of a run over `rows` rows: `max_steps` when set, else `num_train_epochs`
/// epochs of `train_batch()` rows per step (at least 1).
pub fn total_steps(args: &TrainingArgs, rows: usize) -> usize {
    if args.max_steps > 0 {
        return args.max_steps;
    }
    let per_epoch = rows.div_ceil(args.train_batch().max(1));
    ((per_epoch as f64) * args.num_train_epochs).ceil().max(1.0) as usize
}

/// The next optimiser step's micro-batches: `gradient_accumulation_steps` of
/// `per_device_train_batch_size` rows each.
pub fn next_step_rows(args: &TrainingArgs, data: &mut DataCursor) -> Vec<Vec<usize>> {
    (0..args.gradient_accumulation_steps)
        .map(|_| data.take(args.per_device_train_batch_size))
        .collect()
}

/// The JSON line an offline command prints at the end: the steps taken, the eval figures
/// `evals` (`(name, metric key)`: a name starting `initial_` reads the eval before training,
/// the others the eval at the end), the last train loss, skipped steps, whether Ctrl-C stopped
/// the run, and where the final model is.
pub fn summary_json(s: &RunSummary, evals: &[(&str, &str)]) -> Value {
    let mut out = json!({ "global_step": s.global_step });
    for (name, key) in evals {
        out[*name] = json!(if name.starts_with("initial_") {
            s.initial_metric(key)
        } else {
            s.final_metric(key)
        });
    }
    out["last_train_loss"] = json!(s.step_values("loss").last());
    out["skipped_steps"] = json!(s.skipped_steps);
    out["interrupted"] = json!(s.interrupted);
    out["final_dir"] = json!(s.final_dir);
    out
}

/// One optimiser step of an offline trainer: its micro-batches of row indices and what the
/// trainer prepared for them ([`OfflineAlgorithm::prepare`]).
pub struct OfflineStep<E> {
    /// The micro-batches, `gradient_accumulation_steps` of them.
    pub micro: Vec<Vec<usize>>,
    /// The trainer's own data for the step (DPO: the pairs' reference log-probs).
    pub extra: E,
}

impl<E> OfflineStep<E> {
    /// Rows of the whole step (the normaliser of the losses that average over it).
    pub fn rows(&self) -> usize {
        self.micro.iter().map(Vec::len).sum()
    }
}

/// An offline trainer's own part.
pub trait OfflineAlgorithm: Send {
    /// What a step carries besides its rows (`()` for none).
    type Extra: Sync + Default;

    /// The metrics the console shows.
    const CONSOLE: Console;

    /// The step's own data, from its micro-batches; timed phases go to `times`. Default: none.
    fn prepare(&mut self, _: &Policy, _: &[Vec<usize>], _: &mut Metrics) -> Result<Self::Extra> {
        Ok(Self::Extra::default())
    }

    /// The differentiable loss of micro-batch `cx.micro` of step `cx.unit`.
    fn micro_loss(&self, cx: MicroContext<'_, OfflineStep<Self::Extra>>) -> Result<Tensor>;

    /// The step's own metrics, logged after its loss, learning rate and gradient norm: the
    /// means of `stats` unless said otherwise.
    fn own_metrics(&self, stats: &StepStats) -> Metrics {
        stats.means().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// An eval pass (None without eval data).
    fn evaluate(&mut self, policy: &Policy) -> Result<Option<Metrics>>;

    /// Writes the final model ([`Algorithm::export`]).
    fn export(&self, out_dir: &Path, model_name: &str, policy: &Policy) -> Result<PathBuf> {
        Ok(super::setup::export_final(out_dir, model_name, policy)?)
    }
}

/// Runs `algo` as `cfg` says ([`super::run`]): `total_steps` optimiser steps over `rows`
/// training rows, each step the next `gradient_accumulation_steps` micro-batches of
/// `per_device_train_batch_size` rows.
pub fn run<C: TrainerConfig, A: OfflineAlgorithm>(
    cfg: &C,
    algo: A,
    (rows, total_steps): (usize, usize),
    policy: &mut Policy,
    opts: &RunOptions,
) -> Result<RunSummary> {
    let args = cfg.args();
    let total_steps = total_steps as u64;
    let mut offline = Offline {
        algo,
        args,
        rows,
        total_steps,
    };
    super::run(cfg, &mut offline, policy, opts)
}

/// An [`OfflineAlgorithm`] as an [`Algorithm`]: each unit is one optimiser step of the next
/// rows, for `total_steps` steps.
struct Offline<'a, A> {
    algo: A,
    args: &'a TrainingArgs,
    rows: usize,
    total_steps: u64,
}

impl<A: OfflineAlgorithm> Algorithm for Offline<'_, A> {
    type Unit = OfflineStep<A::Extra>;

    const CONSOLE: Console = A::CONSOLE;

    fn data_len(&self) -> usize {
        self.rows
    }

    fn total_steps(&self) -> u64 {
        self.total_steps
    }

    fn next_unit(&mut self, cx: UnitContext<'_>) -> Result<Self::Unit> {
        let micro = next_step_rows(self.args, cx.data);
        let extra = self.algo.prepare(cx.policy, &micro, cx.times)?;
        Ok(OfflineStep { micro, extra })
    }

    fn steps(&self, unit: &Self::Unit) -> Vec<Vec<Vec<usize>>> {
        vec![unit.micro.clone()]
    }

    fn micro_loss(&self, cx: MicroContext<'_, Self::Unit>) -> Result<Option<Tensor>> {
        Ok(Some(self.algo.micro_loss(cx)?))
    }

    fn step_metrics(
        &self,
        _unit: &Self::Unit,
        out: &StepOutcome,
        first_of_unit: bool,
        unit_times: &Metrics,
    ) -> Metrics {
        let mut m: Metrics = vec![
            ("loss".into(), out.loss),
            ("learning_rate".into(), out.lr),
            ("grad_norm".into(), out.grad_norm),
        ];
        m.extend(self.algo.own_metrics(&out.stats));
        m.push((
            "tokens_per_s".into(),
            out.tokens as f64 / out.seconds.max(1e-9),
        ));
        m.push(("time/update".into(), out.seconds));
        if first_of_unit {
            m.extend(unit_times.iter().cloned());
        }
        m
    }

    fn evaluate(&mut self, policy: &Policy, _at: Position) -> Result<Option<Metrics>> {
        self.algo.evaluate(policy)
    }

    fn export(&self, out_dir: &Path, model_name: &str, policy: &Policy) -> Result<PathBuf> {
        self.algo.export(out_dir, model_name, policy)
    }
}
