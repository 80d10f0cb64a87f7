//! The run core every trainer uses: the loop, the optimiser step, checkpoints and exact resume,
//! eval cadence, metrics (stdout, `metrics.jsonl`, TensorBoard), progress, Ctrl-C, the final
//! export and `run_summary.json`.
//!
//! A trainer is an [`Algorithm`]: it says how to make the next unit of work (a rollout for the
//! online algorithms, one step's rows for the offline ones), how that unit splits into optimiser
//! steps and micro-batches, the loss of one micro-batch, its metrics and its eval. Everything
//! else lives here once:
//!
//! ```text
//! resume? -> eval before -> [ unit -> for each of its steps: micro-batches (loss, backward,
//! accumulate) -> clip -> AdamW -> schedule -> log / eval / save due ] -> save at the unit's end
//! -> ... -> final save -> eval after -> export (HF dir; with LoRA also the PEFT adapter)
//! ```
//!
//! Checkpoints are taken at unit boundaries, so a resumed run regenerates nothing it already
//! trained on and continues exactly: the data order, rollout seeds and LoRA dropout masks are
//! functions of (seed, step).

mod console;
mod context;
pub mod offline;
pub mod optim;
pub mod setup;
mod summary;

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{Tensor, Var};
use rlft_model::lora::LoraConfig;
use rlft_model::{CausalLm, GenerationConfig};
use rlft_text::TextBundle;
use rlft_train::checkpoint::{
    latest_checkpoint, load_checkpoint, CheckpointManager, DataPosition, RlftState, TrainerState,
};
use rlft_train::metrics::MetricsLogger;
use rlft_train::progress::Progress;
use rlft_train::shutdown::ShutdownFlag;
use serde_json::{json, Value};

use crate::config::TrainerConfig;
use crate::data::DataCursor;
use crate::error::{Result, TrainerError};
use console::{line, log};
pub use console::{Console, Format, Shown, GRAD_NORM, LEARNING_RATE, LOSS};
pub use context::{MicroContext, Position, UnitContext};
pub use optim::{StepOutcome, StepStats};
use summary::find;
pub use summary::RunSummary;

/// `(name, value)` metric pairs in logging order.
pub type Metrics = Vec<(String, f64)>;

/// Options of one run beyond the config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Continue from the latest checkpoint in `output_dir`.
    pub resume: bool,
    /// Stop after this many optimiser steps in this process, at the end of the unit that reaches
    /// them (tests of exact resume).
    pub stop_after: Option<u64>,
    /// Ctrl-C flag (None: not interruptible).
    pub shutdown: Option<ShutdownFlag>,
    /// Print progress to stderr.
    pub progress: bool,
}

/// The model being trained and what belongs to it.
pub struct Policy {
    /// The model (its trainable weights are `Var`s inside it).
    pub model: CausalLm,
    /// Trainable parameters (HF or PEFT names).
    pub vars: Vec<(String, Var)>,
    /// LoRA settings when training adapters.
    pub lora: Option<LoraConfig>,
    /// `adapter_config.json` for checkpoints when training adapters.
    pub adapter_config: Option<Value>,
    /// Tokenizer and chat template.
    pub text: TextBundle,
    /// Generation defaults of the model (eos ids, pad id).
    pub generation: GenerationConfig,
    /// Padding id.
    pub pad_id: u32,
}

/// An algorithm plugged into the run core: what is its own, nothing else.
pub trait Algorithm: Send {
    /// One unit of work between checkpoint boundaries: a rollout (online algorithms) or one
    /// optimiser step's rows (offline ones).
    type Unit: Sync;

    /// The metrics the console shows: on the step line, beside the progress bar, on eval.
    const CONSOLE: Console;

    /// Rows the data cursor walks over (prompts, examples, pairs).
    fn data_len(&self) -> usize;

    /// Optimiser steps of the whole run.
    fn total_steps(&self) -> u64;

    /// Opens the algorithm's own logs in `out_dir` (`resumed_at`: the step resumed from).
    fn open_logs(&mut self, _out_dir: &Path, _resumed_at: Option<u64>) -> Result<()> {
        Ok(())
    }

    /// Makes the next unit from the next rows of `cx.data`; timed phases go to `cx.times`.
    fn next_unit(&mut self, cx: UnitContext<'_>) -> Result<Self::Unit>;

    /// The optimiser steps of `unit`, each as its micro-batches of row indices.
    fn steps(&self, unit: &Self::Unit) -> Vec<Vec<Vec<usize>>>;

    /// The differentiable loss of micro-batch `cx.micro` of optimiser step `cx.step`.
    ///
    /// `None` says that the micro-batch's loss and its gradient with respect to every var are
    /// exactly 0, so nothing was computed (GRPO's zero-advantage rows). A step whose
    /// micro-batches are all `None` gets a zero gradient for every var, as a computed pass
    /// would give it (every var the pass reaches: all of them for the trainers here).
    fn micro_loss(&self, cx: MicroContext<'_, Self::Unit>) -> Result<Option<Tensor>>;

    /// The metrics of a finished optimiser step, in logging order (the core appends
    /// `skipped_steps`). `unit_times` holds the unit's phase times on its first step only.
    fn step_metrics(
        &self,
        unit: &Self::Unit,
        out: &StepOutcome,
        first_of_unit: bool,
        unit_times: &Metrics,
    ) -> Metrics;

    /// Tokens of `step` to count in `num_input_tokens_seen`.
    fn tokens_seen(&self, _unit: &Self::Unit, _step: &[Vec<usize>], out: &StepOutcome) -> u64 {
        out.tokens as u64
    }

    /// Warnings (with their likely fix) raised by a step's metrics.
    fn observe(&mut self, _step: u64, _metrics: &Metrics) -> Vec<String> {
        Vec::new()
    }

    /// Called after a step's metrics were logged (e.g. writes sample completions).
    fn on_logged(&mut self, _unit: &Self::Unit, _step: u64, _first_of_unit: bool) -> Result<()> {
        Ok(())
    }

    /// An eval pass of the policy (None without eval data).
    fn evaluate(&mut self, policy: &Policy, at: Position) -> Result<Option<Metrics>>;

    /// Trainable parameters the algorithm owns besides the policy's (PPO's critic): optimised,
    /// clipped and checkpointed with them. Names must not clash with the policy's.
    fn extra_vars(&self) -> Vec<(String, Var)> {
        Vec::new()
    }

    /// Writes the final model under `out_dir` (`model_name`: the config's `model`, recorded in
    /// a PEFT adapter) and returns the directory of the usable model. Default: the policy as a
    /// causal LM ([`setup::export_final`]); a reward model writes its score head too.
    fn export(&self, out_dir: &Path, model_name: &str, policy: &Policy) -> Result<PathBuf> {
        Ok(setup::export_final(out_dir, model_name, policy)?)
    }
}

/// An optimiser step as the core logs it.
struct StepLog {
    /// The algorithm's step metrics.
    metrics: Metrics,
    /// Whether the update was applied ([`StepOutcome::applied`]).
    applied: bool,
    /// Whether it is the first step of its unit.
    first_of_unit: bool,
}

/// Everything one run holds besides the algorithm and the policy.
struct Run<'a> {
    out_dir: &'a Path,
    /// Every trainable parameter: the policy's, then the algorithm's own.
    vars: Vec<(String, Var)>,
    manager: CheckpointManager,
    opt: rlft_train::AdamW,
    sched: rlft_train::LrScheduler,
    state: TrainerState,
    data: DataCursor,
    metrics: MetricsLogger,
    progress: Progress,
    summary: RunSummary,
}

impl Run<'_> {
    fn at(&self) -> Position {
        Position {
            global_step: self.state.global_step,
            total_steps: self.state.max_steps.unwrap_or(0),
            epoch: self.state.epoch,
        }
    }

    fn eval<A: Algorithm>(&mut self, algo: &mut A, policy: &Policy) -> Result<Option<Metrics>> {
        let at = self.at();
        let t = Instant::now();
        let Some(mut m) = algo.evaluate(policy, at)? else {
            return Ok(None);
        };
        m.push(("time/eval".into(), t.elapsed().as_secs_f64()));
        log(&mut self.metrics, at, &m)?;
        Ok(Some(m))
    }

    fn save(&mut self, policy: &Policy, seed: u64) -> Result<()> {
        let ck = setup::checkpoint(
            &self.vars,
            policy.adapter_config.clone(),
            &self.opt,
            &self.state,
            &self.data,
            seed,
        )?;
        self.manager.save(&ck)?;
        Ok(())
    }

    /// Logs, warns, evaluates and marks saves after an optimiser step of `unit`.
    fn after_step<A: Algorithm>(
        &mut self,
        algo: &mut A,
        policy: &Policy,
        unit: &A::Unit,
        done: StepLog,
        args: &crate::config::TrainingArgs,
    ) -> Result<bool> {
        let (mut m, first_of_unit) = (done.metrics, done.first_of_unit);
        let (step, total) = (self.state.global_step, self.at().total_steps);
        if !done.applied {
            self.summary.skipped_steps += 1;
            self.progress.println(&format!(
                "warning [non_finite]: step {step}: non-finite loss or gradient norm; the update \
                 was skipped. Lower learning_rate, check the data and rewards for NaN, or set \
                 max_grad_norm"
            ));
        }
        m.push(("skipped_steps".into(), self.summary.skipped_steps as f64));
        for w in algo.observe(step, &m) {
            self.progress.println(&format!("warning {w}"));
        }
        if step.is_multiple_of(args.logging_steps as u64) || step == total {
            let at = self.at();
            log(&mut self.metrics, at, &m)?;
            let mut entry = serde_json::Map::new();
            for (k, v) in &m {
                entry.insert(k.clone(), json!(v));
            }
            entry.insert("step".into(), json!(step));
            entry.insert("epoch".into(), json!(self.state.epoch));
            self.state.log_history.push(entry);
            self.progress.println(&format!(
                "step {step}/{total} {}",
                line(&m, A::CONSOLE.step)
            ));
            algo.on_logged(unit, step, first_of_unit)?;
        }
        if args.eval_steps > 0 && step.is_multiple_of(args.eval_steps as u64) && step < total {
            if let Some(em) = self.eval(algo, policy)? {
                let line = line(&em, A::CONSOLE.eval);
                self.progress
                    .println(&format!("eval at step {step}: {line}"));
            }
        }
        self.progress.update(step, &line(&m, A::CONSOLE.progress));
        self.summary.steps.push(m);
        Ok(args.save_steps > 0 && step.is_multiple_of(args.save_steps as u64))
    }
}

/// Runs `algo` on `policy` as `cfg` says: prints progress, writes metrics, checkpoints, the
/// final model and `run_summary.json` under `output_dir`.
pub fn run<C: TrainerConfig, A: Algorithm>(
    cfg: &C,
    algo: &mut A,
    policy: &mut Policy,
    opts: &RunOptions,
) -> Result<RunSummary> {
    let start = Instant::now();
    let args = cfg.args();
    let out_dir = args.output_dir.as_path();
    std::fs::create_dir_all(out_dir).map_err(TrainerError::io(out_dir))?;
    let resume_from = if opts.resume {
        latest_checkpoint(out_dir)?
    } else {
        None
    };
    if opts.resume && resume_from.is_none() {
        eprintln!(
            "no checkpoint in {} to resume from; starting from scratch",
            out_dir.display()
        );
    }
    let mut vars = policy.vars.clone();
    vars.extend(algo.extra_vars());
    let mut opt = optim::optimizer(args, &vars)?;
    let total = algo.total_steps();
    let mut state = TrainerState {
        max_steps: Some(total),
        num_train_epochs: Some(args.num_train_epochs),
        logging_steps: Some(args.logging_steps as u64),
        eval_steps: Some(args.eval_steps as u64),
        save_steps: Some(args.save_steps as u64),
        train_batch_size: Some(args.per_device_train_batch_size as u64),
        rlft: RlftState::default(),
        ..Default::default()
    };
    let mut pos = DataPosition::default();
    if let Some(dir) = &resume_from {
        let ck = load_checkpoint(dir, policy.model.device())?;
        setup::restore_weights(&vars, &ck.weights.tensors)?;
        if let Some(o) = &ck.optimizer {
            opt.load_state_tensors(&o.tensors.iter().cloned().collect())?;
        }
        state = ck.trainer_state;
        // The run's length is the config's now (a resumed run may be given more steps).
        state.max_steps = Some(total);
        pos = state.rlft.data_position;
        eprintln!(
            "resumed from {} (step {})",
            dir.display(),
            state.global_step
        );
    }
    let config_path = out_dir.join("config.toml");
    std::fs::write(&config_path, toml::to_string(cfg).unwrap_or_default())
        .map_err(TrainerError::io(&config_path))?;
    let resumed_at = resume_from.as_ref().map(|_| state.global_step);
    let metrics = match resumed_at {
        Some(step) => MetricsLogger::resume(out_dir, step, args.tensorboard())?,
        None => MetricsLogger::create(out_dir, args.tensorboard())?,
    };
    algo.open_logs(out_dir, resumed_at)?;
    let progress = if opts.progress {
        Progress::new(total, state.global_step)
    } else {
        Progress::hidden(total, state.global_step)
    };
    let mut run = Run {
        out_dir,
        vars,
        manager: CheckpointManager::new(out_dir)
            .keep_last((args.save_total_limit > 0).then_some(args.save_total_limit)),
        opt,
        sched: optim::scheduler(args)?,
        data: DataCursor::new(algo.data_len(), args.seed, pos),
        state,
        metrics,
        progress,
        summary: RunSummary::default(),
    };
    if resumed_at.is_none() {
        run.summary.eval_initial = run.eval(algo, policy)?;
        if let Some(m) = &run.summary.eval_initial {
            eprintln!("eval before training: {}", line(m, A::CONSOLE.eval));
        }
    }
    train_loop(cfg, algo, policy, opts, &mut run)?;
    finish(cfg, algo, policy, run, start)
}

/// Units until the run's steps are done, Ctrl-C or `stop_after`.
fn train_loop<C: TrainerConfig, A: Algorithm>(
    cfg: &C,
    algo: &mut A,
    policy: &mut Policy,
    opts: &RunOptions,
    run: &mut Run<'_>,
) -> Result<()> {
    let args = cfg.args();
    let total = algo.total_steps();
    let device = policy.model.device().clone();
    let (mut ran, mut save_due) = (0u64, false);
    while run.state.global_step < total {
        if opts
            .shutdown
            .as_ref()
            .is_some_and(ShutdownFlag::is_requested)
        {
            run.summary.interrupted = true;
            break;
        }
        if opts.stop_after.is_some_and(|s| ran >= s) {
            break;
        }
        let mut unit_times = Metrics::new();
        let at = run.at();
        let data = &mut run.data;
        let times = &mut unit_times;
        let unit = algo.next_unit(UnitContext {
            policy,
            data,
            at,
            times,
        })?;
        for (i, step) in algo.steps(&unit).iter().enumerate() {
            if run.state.global_step >= total {
                break;
            }
            let (opt, state, vars) = (&mut run.opt, &mut run.state, &run.vars);
            let sched = &run.sched;
            let out = rlft_kernels::pool::on_pool_for(&device, || {
                optim::step(
                    &mut *algo, policy, vars, &unit, step, opt, sched, state, args,
                )
            })?;
            run.state.global_step += 1;
            run.state.num_input_tokens_seen += algo.tokens_seen(&unit, step, &out);
            run.state.epoch = run.data.epoch();
            ran += 1;
            let m = algo.step_metrics(&unit, &out, i == 0, &unit_times);
            let step = StepLog {
                metrics: m,
                applied: out.applied,
                first_of_unit: i == 0,
            };
            save_due |= run.after_step(algo, policy, &unit, step, args)?;
        }
        if save_due && run.state.global_step < total {
            let t = Instant::now();
            run.save(policy, args.seed)?;
            save_due = false;
            let secs = t.elapsed().as_secs_f64();
            let at = run.at();
            log(&mut run.metrics, at, &vec![("time/save".into(), secs)])?;
        }
    }
    Ok(())
}

/// The final save, eval and export, and the summary.
fn finish<C: TrainerConfig, A: Algorithm>(
    cfg: &C,
    algo: &mut A,
    policy: &mut Policy,
    mut run: Run<'_>,
    start: Instant,
) -> Result<RunSummary> {
    let args = cfg.args();
    run.summary.global_step = run.state.global_step;
    // Save where we stopped (end, Ctrl-C or stop_after) so the run can resume.
    run.save(policy, args.seed)?;
    let finished = run.state.global_step >= algo.total_steps();
    if finished {
        run.summary.eval_final = run.eval(algo, policy)?;
        if let Some(m) = &run.summary.eval_final {
            eprintln!("eval after training: {}", line(m, A::CONSOLE.eval));
        }
        run.summary.final_dir = Some(algo.export(run.out_dir, &args.model, policy)?);
    }
    run.summary.wall_time_s = start.elapsed().as_secs_f64();
    run.progress.finish(&format!(
        "{} steps in {:.1}s",
        run.summary.global_step, run.summary.wall_time_s
    ));
    summary::write_run_summary(cfg, &run.summary, finished)?;
    Ok(run.summary)
}
