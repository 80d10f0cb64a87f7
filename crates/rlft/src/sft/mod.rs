//! The SFT trainer: `rlft sft --config sft.toml`, on the run core ([`crate::run`]).
//!
//! One optimiser step takes `gradient_accumulation_steps` micro-batches of examples; the loss of
//! each is the summed NLL of its assistant/completion tokens divided by the step's total target
//! count, so batch 8 x accumulation 1 equals batch 1 x accumulation 8 (TRL's `SFTTrainer` with
//! `average_tokens_across_devices`). Eval is the mean token NLL of the held-out examples.

pub mod batch;
mod setup;

use candle_core::{DType, Tensor};
use serde_json::{json, Value};

use crate::config::sft::SftConfig;
use crate::data::sft::SftExample;
use crate::data::DataCursor;
use crate::error::Result;
use crate::run::{
    Algorithm, Console, Metrics, Policy, Position, RunOptions, RunSummary, Shown, StepOutcome,
    StepStats, GRAD_NORM, LEARNING_RATE, LOSS,
};
pub use setup::{prepare, Prepared};

/// Mean token NLL over `examples` without gradients.
fn eval_loss(policy: &Policy, examples: &[SftExample], batch_size: usize) -> Result<Option<f64>> {
    if examples.is_empty() {
        return Ok(None);
    }
    let plain = rlft_model::trainable::detached(&policy.model);
    let (mut total, mut count) = (0f64, 0usize);
    for chunk in examples.chunks(batch_size.max(1)) {
        let refs: Vec<&SftExample> = chunk.iter().collect();
        let mb = batch::micro_batch(&refs, policy.pad_id, plain.device())?;
        total += batch::summed_nll(&plain, &mb, false)?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?;
        count += mb.num_targets;
    }
    Ok(Some(total / count.max(1) as f64))
}

/// SFT as an [`Algorithm`]: a unit is one optimiser step's micro-batches of example indices.
struct Sft<'a> {
    cfg: &'a SftConfig,
    train: &'a [SftExample],
    eval: &'a [SftExample],
    total_steps: u64,
}

impl Algorithm for Sft<'_> {
    type Unit = Vec<Vec<usize>>;

    const CONSOLE: Console = Console {
        step: &[LOSS, GRAD_NORM, LEARNING_RATE],
        progress: &[LOSS],
        eval: &[Shown::new("eval_loss", "loss")],
    };

    fn data_len(&self) -> usize {
        self.train.len()
    }

    fn total_steps(&self) -> u64 {
        self.total_steps
    }

    fn next_unit(
        &mut self,
        _policy: &Policy,
        data: &mut DataCursor,
        _at: Position,
        _times: &mut Metrics,
    ) -> Result<Self::Unit> {
        Ok(crate::run::offline::next_step_rows(&self.cfg.args, data))
    }

    fn steps(&self, unit: &Self::Unit) -> Vec<Vec<Vec<usize>>> {
        vec![unit.clone()]
    }

    fn micro_loss(
        &self,
        policy: &Policy,
        _unit: &Self::Unit,
        step: &[Vec<usize>],
        micro: &[usize],
        stats: &mut StepStats,
    ) -> Result<Option<Tensor>> {
        let total_targets: usize = step
            .iter()
            .flatten()
            .map(|&i| self.train[i].loss_mask[1..].iter().filter(|&&m| m).count())
            .sum();
        let refs: Vec<&SftExample> = micro.iter().map(|&i| &self.train[i]).collect();
        let mb = batch::micro_batch(&refs, policy.pad_id, policy.model.device())?;
        let nll = batch::summed_nll(&policy.model, &mb, true)?;
        stats.tokens += mb.num_tokens;
        Ok(Some((nll / total_targets.max(1) as f64)?))
    }

    fn step_metrics(&self, _: &Self::Unit, out: &StepOutcome, _: bool, _: &Metrics) -> Metrics {
        vec![
            ("loss".into(), out.loss),
            ("learning_rate".into(), out.lr),
            ("grad_norm".into(), out.grad_norm),
            (
                "tokens_per_s".into(),
                out.tokens as f64 / out.seconds.max(1e-9),
            ),
        ]
    }

    fn evaluate(&mut self, policy: &Policy, _at: Position) -> Result<Option<Metrics>> {
        let batch = self.cfg.args.per_device_train_batch_size;
        Ok(eval_loss(policy, self.eval, batch)?.map(|l| vec![("eval_loss".to_string(), l)]))
    }
}

/// Runs SFT as configured. Prints progress when asked; writes metrics, checkpoints and the final
/// model under `output_dir`.
pub fn train(cfg: &SftConfig, p: &mut Prepared, opts: &RunOptions) -> Result<RunSummary> {
    let mut algo = Sft {
        cfg,
        train: &p.train,
        eval: &p.eval,
        total_steps: p.total_steps as u64,
    };
    crate::run::run(cfg, &mut algo, &mut p.policy, opts)
}

/// The JSON summary line `rlft sft` prints at the end.
pub fn summary_json(s: &RunSummary) -> Value {
    json!({
        "global_step": s.global_step,
        "initial_eval_loss": s.initial_metric("eval_loss"),
        "final_eval_loss": s.final_metric("eval_loss"),
        "last_train_loss": s.step_values("loss").last(),
        "skipped_steps": s.skipped_steps,
        "interrupted": s.interrupted,
        "final_dir": s.final_dir,
    })
}
