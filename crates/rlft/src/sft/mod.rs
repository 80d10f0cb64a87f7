//! The SFT trainer: `rlft sft --config sft.toml`.
//!
//! One optimiser step reads top to bottom: take `gradient_accumulation_steps` micro-batches,
//! forward + backward each (loss = summed NLL of the assistant/completion tokens divided by the
//! step's total target count), clip the global gradient norm, AdamW, LR schedule; then log,
//! evaluate and save on their cadences. A non-finite gradient norm skips the step (warned and
//! counted). Ctrl-C saves a checkpoint and exits; `resume` continues exactly from the latest one.

pub mod batch;
mod setup;

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{backprop::GradStore, Var};
use rlft_model::checkpoint::Checkpointing;
use rlft_model::CausalLm;
use rlft_train::checkpoint::{
    latest_checkpoint, load_checkpoint, Checkpoint, CheckpointManager, DataPosition, RlftState,
    TrainerState,
};
use rlft_train::metrics::MetricsLogger;
use rlft_train::progress::Progress;
use rlft_train::shutdown::ShutdownFlag;
use rlft_train::{clip_grad_norm, AdamW, GradAccumulator, LrScheduler};
use serde_json::{json, Value};

use crate::config::sft::SftConfig;
use crate::sft_data::SftExample;
use crate::train_setup::{self, DataCursor};
pub use setup::{prepare, Prepared};

/// SFT errors; each says what happened and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum SftError {
    /// Config problems.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Dataset problems.
    #[error(transparent)]
    Data(#[from] rlft_data::DataError),
    /// Row formatting problems.
    #[error(transparent)]
    SftData(#[from] crate::sft_data::SftDataError),
    /// Model problems.
    #[error(transparent)]
    Model(#[from] rlft_model::ModelError),
    /// Optimiser problems.
    #[error(transparent)]
    Train(#[from] rlft_train::TrainError),
    /// Checkpoint problems.
    #[error(transparent)]
    Checkpoint(#[from] rlft_train::checkpoint::CheckpointError),
    /// Metrics problems.
    #[error(transparent)]
    Metrics(#[from] rlft_train::metrics::MetricsError),
    /// Tensor errors.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// Anything else, with its fix.
    #[error("{0}")]
    Other(String),
}

/// Result alias of the trainer.
pub type Result<T, E = SftError> = std::result::Result<T, E>;

/// What a finished (or interrupted) run reports.
#[derive(Debug, Clone, PartialEq)]
pub struct SftSummary {
    /// Optimiser steps taken in total.
    pub global_step: u64,
    /// Eval loss before training (None without eval data or when resuming).
    pub initial_eval_loss: Option<f64>,
    /// Eval loss at the end.
    pub final_eval_loss: Option<f64>,
    /// Train loss of every step run in this process.
    pub train_losses: Vec<f64>,
    /// Steps skipped for non-finite gradients.
    pub skipped_steps: u64,
    /// Whether Ctrl-C stopped the run early.
    pub interrupted: bool,
    /// Where the final model (or adapter) was written.
    pub final_dir: Option<PathBuf>,
}

/// Options of one run beyond the config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Continue from the latest checkpoint in `output_dir`.
    pub resume: bool,
    /// Stop after this many optimiser steps in this process (tests of exact resume).
    pub stop_after: Option<u64>,
    /// Ctrl-C flag (None: not interruptible).
    pub shutdown: Option<ShutdownFlag>,
    /// Print progress to stderr.
    pub progress: bool,
}

/// Mean token NLL over `examples` without gradients.
fn eval_loss(
    model: &CausalLm,
    examples: &[SftExample],
    batch_size: usize,
    pad_id: u32,
) -> Result<Option<f64>> {
    if examples.is_empty() {
        return Ok(None);
    }
    let plain = rlft_model::trainable::detached(model);
    let (mut total, mut count) = (0f64, 0usize);
    for chunk in examples.chunks(batch_size.max(1)) {
        let refs: Vec<&SftExample> = chunk.iter().collect();
        let mb = batch::micro_batch(&refs, pad_id, plain.device())?;
        total += batch::summed_nll(&plain, &mb, false)?
            .to_dtype(candle_core::DType::F64)?
            .to_scalar::<f64>()?;
        count += mb.num_targets;
    }
    Ok(Some(total / count.max(1) as f64))
}

struct Loop<'a> {
    cfg: &'a SftConfig,
    p: &'a mut Prepared,
    opt: AdamW,
    sched: LrScheduler,
    data: DataCursor,
    state: TrainerState,
}

impl Loop<'_> {
    /// One optimiser step; returns (loss, grad norm, tokens) or None when skipped.
    fn step(&mut self) -> Result<(f64, Option<f64>, usize)> {
        let cfg = self.cfg;
        let micro: Vec<Vec<usize>> = (0..cfg.gradient_accumulation_steps)
            .map(|_| self.data.take(cfg.per_device_train_batch_size))
            .collect();
        let total_targets: usize = micro
            .iter()
            .flatten()
            .map(|&i| {
                self.p.train[i].loss_mask[1..]
                    .iter()
                    .filter(|&&m| m)
                    .count()
            })
            .sum();
        // LoRA dropout masks depend only on (seed, step), so a resumed run draws the same ones.
        if self.p.lora.is_some() {
            let seed =
                self.cfg.seed ^ (self.state.global_step + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            rlft_model::lora::set_dropout_seed(&mut self.p.model, Some(seed));
        }
        let vars: Vec<Var> = self.p.vars.iter().map(|(_, v)| v.clone()).collect();
        let mut acc = GradAccumulator::new(vars.clone());
        let (mut loss_sum, mut tokens) = (0f64, 0usize);
        for idx in &micro {
            let refs: Vec<&SftExample> = idx.iter().map(|&i| &self.p.train[i]).collect();
            let mb = batch::micro_batch(&refs, self.p.pad_id, self.p.model.device())?;
            let session = cfg
                .gradient_checkpointing
                .then(|| Checkpointing::begin(&self.p.model))
                .transpose()?;
            let nll = batch::summed_nll(&self.p.model, &mb, true)?;
            let loss = (nll / total_targets.max(1) as f64)?;
            loss_sum += loss.to_dtype(candle_core::DType::F64)?.to_scalar::<f64>()?;
            tokens += mb.num_tokens;
            let grads: GradStore = match session {
                Some(s) => s.backward(&loss, &self.p.vars)?,
                None => rlft_model::trainable::backward(&loss, &self.p.vars)?,
            };
            acc.add_owned(grads, 1.0)?;
        }
        let mut grads = acc.finish();
        let lr = self
            .sched
            .lr_at(self.state.rlft.scheduler_step as usize, self.p.total_steps);
        let norm = if cfg.max_grad_norm > 0.0 {
            let c = clip_grad_norm(&mut grads, &vars, cfg.max_grad_norm)?;
            if !c.is_finite() {
                return Ok((loss_sum, None, tokens));
            }
            c.total_norm
        } else {
            rlft_train::global_grad_norm(&grads, &vars)?
        };
        if !norm.is_finite() || !loss_sum.is_finite() {
            return Ok((loss_sum, None, tokens));
        }
        self.opt.set_lr(lr);
        self.opt.step(&grads)?;
        self.state.rlft.scheduler_step += 1;
        Ok((loss_sum, Some(norm), tokens))
    }

    fn checkpoint(&self) -> Result<Checkpoint> {
        Ok(train_setup::checkpoint(
            &self.p.vars,
            self.p.adapter_config.as_ref(),
            &self.opt,
            &self.state,
            &self.data,
            json!({"seed": self.cfg.seed}),
        )?)
    }
}

/// Runs SFT as configured. Prints progress when asked; writes metrics, checkpoints and the final
/// model under `output_dir`.
pub fn train(cfg: &SftConfig, p: &mut Prepared, opts: &RunOptions) -> Result<SftSummary> {
    let start = Instant::now();
    let manager = CheckpointManager::new(&cfg.output_dir)
        .keep_last((cfg.save_total_limit > 0).then_some(cfg.save_total_limit));
    let resume_from = if opts.resume {
        latest_checkpoint(&cfg.output_dir)?
    } else {
        None
    };
    if opts.resume && resume_from.is_none() {
        eprintln!(
            "no checkpoint in {} to resume from; starting from scratch",
            cfg.output_dir.display()
        );
    }
    let mut opt = setup::optimizer(cfg, &p.vars)?;
    let mut state = TrainerState {
        max_steps: Some(p.total_steps as u64),
        num_train_epochs: Some(cfg.num_train_epochs),
        logging_steps: Some(cfg.logging_steps as u64),
        eval_steps: Some(cfg.eval_steps as u64),
        save_steps: Some(cfg.save_steps as u64),
        train_batch_size: Some(cfg.per_device_train_batch_size as u64),
        rlft: RlftState::default(),
        ..Default::default()
    };
    let mut pos = DataPosition::default();
    let mut initial_eval = None;
    if let Some(dir) = &resume_from {
        let ck = load_checkpoint(dir, p.model.device())?;
        setup::restore_weights(&p.vars, &ck.weights.tensors)?;
        if let Some(o) = &ck.optimizer {
            let map = o.tensors.iter().cloned().collect();
            opt.load_state_tensors(&map)?;
        }
        state = ck.trainer_state;
        pos = state.rlft.data_position;
        eprintln!(
            "resumed from {} (step {})",
            dir.display(),
            state.global_step
        );
    } else {
        initial_eval = eval_loss(&p.model, &p.eval, cfg.per_device_train_batch_size, p.pad_id)?;
        if let Some(l) = initial_eval {
            eprintln!("eval loss before training: {l:.4}");
        }
    }
    let tensorboard = cfg.report_to.iter().any(|r| r == "tensorboard");
    let mut metrics = if resume_from.is_some() {
        MetricsLogger::resume(&cfg.output_dir, state.global_step, tensorboard)?
    } else {
        std::fs::create_dir_all(&cfg.output_dir)
            .map_err(|e| SftError::Other(format!("{}: {e}", cfg.output_dir.display())))?;
        MetricsLogger::create(&cfg.output_dir, tensorboard)?
    };
    let sched = setup::scheduler(cfg)?;
    let data = DataCursor::new(p.train.len(), cfg.seed, pos);
    let mut lp = Loop {
        cfg,
        p,
        opt,
        sched,
        data,
        state,
    };
    let total = lp.p.total_steps as u64;
    let mut progress = if opts.progress {
        Progress::new(total, lp.state.global_step)
    } else {
        Progress::hidden(total, lp.state.global_step)
    };
    let mut summary = SftSummary {
        global_step: lp.state.global_step,
        initial_eval_loss: initial_eval,
        final_eval_loss: None,
        train_losses: Vec::new(),
        skipped_steps: 0,
        interrupted: false,
        final_dir: None,
    };
    let mut ran = 0u64;
    while lp.state.global_step < total {
        if opts
            .shutdown
            .as_ref()
            .is_some_and(ShutdownFlag::is_requested)
        {
            summary.interrupted = true;
            break;
        }
        if opts.stop_after.is_some_and(|s| ran >= s) {
            break;
        }
        let t0 = Instant::now();
        let device = lp.p.model.device().clone();
        let (loss, norm, tokens) = rlft_kernels::pool::on_pool_for(&device, || lp.step())?;
        lp.state.global_step += 1;
        lp.state.num_input_tokens_seen += tokens as u64;
        lp.state.epoch = lp.data.epoch();
        ran += 1;
        summary.train_losses.push(loss);
        let step = lp.state.global_step;
        let lr = lp.opt.lr();
        if norm.is_none() {
            summary.skipped_steps += 1;
            progress.println(&format!(
                "warning: step {step}: non-finite loss or gradient norm; step skipped (lower the learning rate or check the data)"
            ));
        }
        let dt = t0.elapsed().as_secs_f64();
        let mut values = vec![
            ("loss", loss),
            ("learning_rate", lr),
            ("grad_norm", norm.unwrap_or(f64::NAN)),
            ("tokens_per_s", tokens as f64 / dt.max(1e-9)),
            ("skipped_steps", summary.skipped_steps as f64),
        ];
        let eval_now = cfg.eval_steps > 0 && step.is_multiple_of(cfg.eval_steps as u64);
        if eval_now {
            if let Some(l) = eval_loss(
                &lp.p.model,
                &lp.p.eval,
                cfg.per_device_train_batch_size,
                lp.p.pad_id,
            )? {
                values.push(("eval_loss", l));
            }
        }
        if step.is_multiple_of(cfg.logging_steps.max(1) as u64) || eval_now || step == total {
            metrics.log(step, lp.state.epoch, &values)?;
            let mut entry = serde_json::Map::new();
            for (k, v) in &values {
                entry.insert(k.to_string(), json!(v));
            }
            entry.insert("step".into(), json!(step));
            entry.insert("epoch".into(), json!(lp.state.epoch));
            lp.state.log_history.push(entry);
        }
        progress.update(step, &format!("loss {loss:.4} lr {lr:.2e}"));
        if cfg.save_steps > 0 && step.is_multiple_of(cfg.save_steps as u64) && step < total {
            manager.save(&lp.checkpoint()?)?;
        }
    }
    summary.global_step = lp.state.global_step;
    // Save where we stopped (end, Ctrl-C or stop_after) so the run can resume.
    manager.save(&lp.checkpoint()?)?;
    if lp.state.global_step >= total {
        summary.final_eval_loss = eval_loss(
            &lp.p.model,
            &lp.p.eval,
            cfg.per_device_train_batch_size,
            lp.p.pad_id,
        )?;
        if let Some(l) = summary.final_eval_loss {
            metrics.log(lp.state.global_step, lp.state.epoch, &[("eval_loss", l)])?;
        }
        summary.final_dir = Some(setup::export_final(cfg, lp.p)?);
    }
    progress.finish(&format!(
        "{} steps in {:.1}s",
        summary.global_step,
        start.elapsed().as_secs_f64()
    ));
    Ok(summary)
}

/// The JSON summary line `rlft sft` prints at the end.
pub fn summary_json(s: &SftSummary) -> Value {
    json!({
        "global_step": s.global_step,
        "initial_eval_loss": s.initial_eval_loss,
        "final_eval_loss": s.final_eval_loss,
        "last_train_loss": s.train_losses.last(),
        "skipped_steps": s.skipped_steps,
        "interrupted": s.interrupted,
        "final_dir": s.final_dir,
    })
}
