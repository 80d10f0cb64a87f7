//! The SFT trainer: `rlft sft --config sft.toml`, on the run core ([`crate::run`]).
//!
//! One optimiser step takes `gradient_accumulation_steps` micro-batches of examples; the loss of
//! each is the summed NLL of its assistant/completion tokens divided by the step's total target
//! count, so batch 8 x accumulation 1 equals batch 1 x accumulation 8 (TRL's `SFTTrainer` with
//! `average_tokens_across_devices`). Eval is the mean token NLL of the held-out examples.

pub mod batch;
mod setup;

use candle_core::{DType, Tensor};

use crate::config::sft::SftConfig;
use crate::data::sft::SftExample;
use crate::error::Result;
use crate::run::offline::{self, OfflineAlgorithm, OfflineStep};
use crate::run::{
    Console, Metrics, MicroContext, Policy, RunOptions, RunSummary, Shown, GRAD_NORM,
    LEARNING_RATE, LOSS,
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

/// SFT as an [`OfflineAlgorithm`]: a step is micro-batches of example indices.
struct Sft<'a> {
    cfg: &'a SftConfig,
    train: &'a [SftExample],
    eval: &'a [SftExample],
}

impl OfflineAlgorithm for Sft<'_> {
    type Extra = ();

    const CONSOLE: Console = Console {
        step: &[LOSS, GRAD_NORM, LEARNING_RATE],
        progress: &[LOSS],
        eval: &[Shown::new("eval_loss", "loss")],
    };

    fn micro_loss(&self, cx: MicroContext<'_, OfflineStep<()>>) -> Result<Tensor> {
        let (policy, step, micro, stats) = (cx.policy, cx.unit, cx.micro, cx.stats);
        let total_targets: usize = step
            .micro
            .iter()
            .flatten()
            .map(|&i| self.train[i].loss_mask[1..].iter().filter(|&&m| m).count())
            .sum();
        let refs: Vec<&SftExample> = micro.iter().map(|&i| &self.train[i]).collect();
        let mb = batch::micro_batch(&refs, policy.pad_id, policy.model.device())?;
        let nll = batch::summed_nll(&policy.model, &mb, true)?;
        stats.tokens += mb.num_tokens;
        Ok((nll / total_targets.max(1) as f64)?)
    }

    fn evaluate(&mut self, policy: &Policy) -> Result<Option<Metrics>> {
        let batch = self.cfg.args.per_device_train_batch_size;
        Ok(eval_loss(policy, self.eval, batch)?.map(|l| vec![("eval_loss".to_string(), l)]))
    }
}

/// Runs SFT as configured. Prints progress when asked; writes metrics, checkpoints and the final
/// model under `output_dir`.
pub fn train(cfg: &SftConfig, p: &mut Prepared, opts: &RunOptions) -> Result<RunSummary> {
    let algo = Sft {
        cfg,
        train: &p.train,
        eval: &p.eval,
    };
    let steps = (p.train.len(), p.total_steps);
    offline::run(cfg, algo, steps, &mut p.policy, opts)
}
