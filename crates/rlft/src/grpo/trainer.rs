//! The GRPO loop. One rollout reads top to bottom as named, timed phases:
//!
//! generate -> reward -> advantages -> old_logprobs (when a rollout feeds more than one
//! optimiser step) -> ref_logprobs (when `beta > 0`) -> for each of its optimiser steps:
//! update (forward + loss + backward per micro-batch, clip, AdamW, schedule) -> log, eval, save.
//!
//! Checkpoints are taken at rollout boundaries (a save that falls inside a rollout happens when
//! it ends), so a resumed run regenerates nothing it already trained on and continues exactly:
//! the rollout seed, LoRA dropout and data order are functions of (seed, step).

use std::collections::BTreeMap;
use std::time::Instant;

use candle_core::{Tensor, Var};
use rlft_model::checkpoint::Checkpointing;
use rlft_model::sampling::SamplingParams;
use rlft_train::checkpoint::{
    latest_checkpoint, load_checkpoint, Checkpoint, CheckpointManager, DataPosition, RlftState,
    TrainerState,
};
use rlft_train::metrics::MetricsLogger;
use rlft_train::progress::Progress;
use rlft_train::{clip_grad_norm, AdamW, GradAccumulator, LrScheduler};
use serde_json::json;

use super::algo::{
    compute_advantages, grpo_loss, AdvantageConfig, LossConfig, LossInputs, LossNormalizer,
};
use super::eval::{evaluate, sample_reward_parts, score_samples, EvalSettings};
use super::rollout::{
    logprobs_no_grad, pad_rows, rollout_model, sample_completions, score_batch, RolloutSettings,
    Sample, ScoreOptions,
};
use super::samples::{LoggedSample, SampleLog};
use super::setup::{optim_settings, Prepared};
use super::stats::{length_metrics, reward_metrics, HealthMonitor, Metrics};
use super::{GrpoError, Result};
use crate::config::grpo::GrpoConfig;
use crate::sft::RunOptions;
use crate::train_setup::{self, DataCursor};

/// What a finished (or interrupted) run reports.
#[derive(Debug, Clone, Default)]
pub struct GrpoSummary {
    /// Optimiser steps taken in total.
    pub global_step: u64,
    /// Eval metrics before training (None without eval prompts or when resuming).
    pub eval_initial: Option<Metrics>,
    /// Eval metrics at the end.
    pub eval_final: Option<Metrics>,
    /// Metrics of every step run in this process.
    pub steps: Vec<Metrics>,
    /// Steps skipped for a non-finite loss or gradient norm.
    pub skipped_steps: u64,
    /// Whether Ctrl-C stopped the run early.
    pub interrupted: bool,
    /// Where the final model (merged, with LoRA) was written.
    pub final_dir: Option<std::path::PathBuf>,
    /// Wall seconds of this process's training.
    pub wall_time_s: f64,
}

/// A rollout with everything its optimiser steps need.
struct RolloutData {
    samples: Vec<Sample>,
    advantages: Vec<f64>,
    old: Option<Vec<Vec<f32>>>,
    reference: Option<Vec<Vec<f32>>>,
    metrics: Metrics,
    logged: Vec<Logged>,
}

/// A completion picked for samples.jsonl: its index, reward parts and total.
struct Logged {
    index: usize,
    parts: Vec<(String, f64)>,
    total: f64,
}

struct Loop<'a> {
    cfg: &'a GrpoConfig,
    p: &'a mut Prepared,
    opt: AdamW,
    sched: LrScheduler,
    data: DataCursor,
    state: TrainerState,
    names: Vec<String>,
}

/// A seed mixing the run seed with a counter (splitmix64 finaliser).
fn mix(seed: u64, k: u64) -> u64 {
    let mut z = seed ^ k.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn sampling(cfg: &GrpoConfig) -> SamplingParams {
    SamplingParams {
        temperature: cfg.temperature as f32,
        top_k: cfg.top_k,
        top_p: cfg.top_p as f32,
        min_p: cfg.min_p as f32,
        repetition_penalty: cfg.repetition_penalty as f32,
    }
}

/// Eval settings of a config.
pub fn eval_settings(cfg: &GrpoConfig, eos_token_ids: &[u32], pad_token_id: u32) -> EvalSettings {
    EvalSettings {
        greedy: cfg.eval_decoding == "greedy",
        sampling: sampling(cfg),
        max_new_tokens: cfg.max_completion_length,
        seed: mix(cfg.seed, u64::MAX),
        eos_token_ids: eos_token_ids.to_vec(),
        pad_token_id,
        batch_size: 16,
    }
}

fn timed<T>(times: &mut Metrics, phase: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let t = Instant::now();
    let out = f()?;
    times.push((format!("time/{phase}"), t.elapsed().as_secs_f64()));
    Ok(out)
}

impl Loop<'_> {
    /// Generates, scores and prepares one rollout. Generation and the log-prob passes run on
    /// the thread pool with its workers spinning ([`rlft_kernels::pool::on_pool`]); the
    /// rewards do not (an external reward command would share the cores with the spinners).
    fn rollout(&mut self, times: &mut Metrics) -> Result<RolloutData> {
        let cfg = self.cfg;
        let plan = self.p.plan;
        let prompts = self.data.take(plan.rollout_prompts);
        let settings = RolloutSettings {
            num_generations: cfg.num_generations,
            max_new_tokens: cfg.max_completion_length,
            sampling: sampling(cfg),
            seed: mix(cfg.seed, self.state.global_step),
            eos_token_ids: self.p.generation.eos_token_ids.clone(),
            pad_token_id: self.p.pad_id,
        };
        let samples = timed(times, "generate", || {
            let m = rollout_model(&self.p.model)?;
            sample_completions(&m, &self.p.text, &self.p.train, &prompts, &settings)
        })?;
        let scores = timed(times, "reward", || {
            score_samples(&mut self.p.rewards, &self.p.train, &samples)
        })?;
        let adv = timed(times, "advantages", || {
            Ok(compute_advantages(
                &scores.total,
                cfg.num_generations,
                &AdvantageConfig {
                    scale: cfg.scale_rewards,
                    epsilon: cfg.advantage_epsilon,
                    clamp: (cfg.advantage_clip > 0.0).then_some(cfg.advantage_clip),
                },
            ))
        })?;
        // The no-grad log-probs of the samples under `m` (old policy, reference).
        let (device, train) = (self.p.model.device(), &self.p.train);
        let (batch, pad_id) = (cfg.per_device_train_batch_size, self.p.pad_id);
        let no_grad_pass = |m: &rlft_model::CausalLm| {
            rlft_kernels::pool::on_pool_for(device, || {
                logprobs_no_grad(
                    m,
                    train,
                    &samples,
                    batch,
                    pad_id,
                    cfg.temperature,
                    cfg.share_prompts,
                )
            })
        };
        let old = if plan.steps_per_rollout > 1 {
            Some(timed(times, "old_logprobs", || {
                no_grad_pass(&rlft_model::trainable::detached(&self.p.model))
            })?)
        } else {
            None
        };
        let reference = if cfg.beta > 0.0 {
            Some(timed(times, "ref_logprobs", || {
                let m = match &self.p.reference {
                    Some(r) => r.clone(),
                    None => rlft_model::trainable::detached(&self.p.model).adapters_disabled(),
                };
                no_grad_pass(&m)
            })?)
        } else {
            None
        };
        let mut metrics = reward_metrics("", &self.names, &scores, &adv.group_std);
        metrics.push(("frac_reward_zero_std".into(), adv.frac_zero_std));
        let lens: Vec<usize> = samples.iter().map(|s| s.completion_ids.len()).collect();
        let trunc: Vec<bool> = samples.iter().map(|s| s.truncated).collect();
        metrics.extend(length_metrics("", &lens, &trunc));
        // Samples to log: the first completion of the first few groups.
        let logged = (0..samples.len())
            .step_by(cfg.num_generations)
            .take(cfg.num_completions_to_log)
            .map(|i| Logged {
                index: i,
                parts: sample_reward_parts(&self.names, &scores, i),
                total: scores.total[i],
            })
            .collect();
        Ok(RolloutData {
            samples,
            advantages: adv.values,
            old,
            reference,
            metrics,
            logged,
        })
    }

    /// One optimiser step over `idx` (indices into the rollout's samples).
    fn step(&mut self, r: &RolloutData, idx: &[usize], times: &mut Metrics) -> Result<Metrics> {
        let t0 = Instant::now();
        let cfg = self.cfg;
        if self.p.lora.is_some() {
            let seed = mix(cfg.seed ^ 0x5EED, self.state.global_step);
            rlft_model::lora::set_dropout_seed(&mut self.p.model, Some(seed));
        }
        let keep = |i: usize| !(cfg.mask_truncated_completions && r.samples[i].truncated);
        let num_items: usize = idx
            .iter()
            .filter(|&&i| keep(i))
            .map(|&i| r.samples[i].completion_ids.len())
            .sum();
        let vars: Vec<Var> = self.p.vars.iter().map(|(_, v)| v.clone()).collect();
        let mut acc = GradAccumulator::new(vars.clone());
        let (mut loss_sum, mut tokens) = (0f64, 0usize);
        let mut weighted: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        let device = self.p.model.device().clone();
        for mb in idx.chunks(cfg.per_device_train_batch_size) {
            let refs: Vec<&Sample> = mb.iter().map(|&i| &r.samples[i]).collect();
            let o = ScoreOptions {
                pad_id: self.p.pad_id,
                grad: true,
                entropy: true,
                temperature: cfg.temperature,
                share_prompts: cfg.share_prompts,
            };
            let session = cfg
                .gradient_checkpointing
                .then(|| Checkpointing::begin(&self.p.model))
                .transpose()?;
            let sb = score_batch(&self.p.model, &self.p.train, &refs, o)?;
            let tc = sb.mask.dim(1)?;
            let row_keep: Vec<f32> = mb.iter().map(|&i| f32::from(u8::from(keep(i)))).collect();
            let mask =
                sb.mask
                    .broadcast_mul(&Tensor::from_vec(row_keep, (mb.len(), 1), &device)?)?;
            let (logp, ent) = (sb.logprobs, sb.entropy);
            let rows = |v: &Option<Vec<Vec<f32>>>| -> Result<Option<Tensor>> {
                match v {
                    Some(v) => {
                        let r: Vec<&[f32]> = mb.iter().map(|&i| &v[i][..]).collect();
                        Ok(Some(pad_rows(&r, tc, &device)?))
                    }
                    None => Ok(None),
                }
            };
            let old = rows(&r.old)?;
            let reference = rows(&r.reference)?;
            let adv: Vec<f32> = mb.iter().map(|&i| r.advantages[i] as f32).collect();
            let adv = Tensor::from_vec(adv, mb.len(), &device)?;
            let out = grpo_loss(
                &LossInputs {
                    logp: &logp,
                    old_logp: old.as_ref(),
                    ref_logp: reference.as_ref(),
                    advantages: &adv,
                    mask: &mask,
                    normalizer: LossNormalizer {
                        accumulation_steps: cfg.gradient_accumulation_steps,
                        num_items_in_batch: num_items.max(1) as f64,
                    },
                },
                &LossConfig {
                    loss_type: cfg.loss_type,
                    epsilon_low: cfg.epsilon,
                    epsilon_high: cfg.epsilon_high(),
                    beta: cfg.beta,
                    max_completion_length: cfg.max_completion_length,
                },
            )?;
            loss_sum += out
                .loss
                .to_dtype(candle_core::DType::F64)?
                .to_scalar::<f64>()?;
            let ntok = out.stats.tokens;
            let mut add = |k: &'static str, v: f64| {
                let e = weighted.entry(k).or_insert((0.0, 0.0));
                e.0 += v * ntok;
                e.1 += ntok;
            };
            add("clip_ratio/low_mean", out.stats.clip_low);
            add("clip_ratio/high_mean", out.stats.clip_high);
            add("clip_ratio/region_mean", out.stats.clip_region);
            if let Some(kl) = out.stats.kl {
                add("kl", kl);
            }
            if let Some(e) = ent {
                let m = mask.to_dtype(e.dtype())?;
                let s = (e * &m)?.sum_all()?.to_scalar::<f32>()? as f64;
                let c = m.sum_all()?.to_scalar::<f32>()? as f64;
                if c > 0.0 {
                    add("entropy", s / c);
                }
            }
            tokens += sb.num_tokens;
            let grads = match session {
                Some(s) => s.backward(&out.loss, &self.p.vars)?,
                None => rlft_model::trainable::backward(&out.loss, &self.p.vars)?,
            };
            acc.add_owned(grads, 1.0)?;
        }
        let mut grads = acc.finish();
        let lr = self.sched.lr_at(
            self.state.rlft.scheduler_step as usize,
            self.p.plan.total_steps,
        );
        let norm = if cfg.max_grad_norm > 0.0 {
            clip_grad_norm(&mut grads, &vars, cfg.max_grad_norm)?.total_norm
        } else {
            rlft_train::global_grad_norm(&grads, &vars)?
        };
        let ok = norm.is_finite() && loss_sum.is_finite();
        if ok {
            self.opt.set_lr(lr);
            self.opt.step(&grads)?;
            self.state.rlft.scheduler_step += 1;
        }
        let dt = t0.elapsed().as_secs_f64();
        times.push(("time/update".into(), dt));
        let mut m: Metrics = vec![
            ("loss".into(), loss_sum),
            ("grad_norm".into(), norm),
            ("learning_rate".into(), lr),
        ];
        for (k, (s, c)) in weighted {
            if c > 0.0 {
                m.push((k.to_string(), s / c));
            }
        }
        m.push(("tokens_per_s".into(), tokens as f64 / dt.max(1e-9)));
        if !ok {
            m.push(("skipped".into(), 1.0));
        }
        Ok(m)
    }

    fn checkpoint(&self) -> Result<Checkpoint> {
        Ok(train_setup::checkpoint(
            &self.p.vars,
            self.p.adapter_config.as_ref(),
            &self.opt,
            &self.state,
            &self.data,
            json!({"seed": self.cfg.seed, "scheme": "mix(seed, global_step)"}),
        )?)
    }
}

fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
}

fn short(metrics: &[(String, f64)], keys: &[(&str, &str)]) -> String {
    keys.iter()
        .filter_map(|(k, label)| {
            metrics
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| format!("{label} {v:.3}"))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs GRPO as configured: prints progress, writes metrics, samples, checkpoints, the final
/// model and `run_summary.json` under `output_dir`.
pub fn train(cfg: &GrpoConfig, p: &mut Prepared, opts: &RunOptions) -> Result<GrpoSummary> {
    let start = Instant::now();
    let out_dir = cfg.output_dir.clone();
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| GrpoError::Other(format!("{}: {e}", out_dir.display())))?;
    let manager = CheckpointManager::new(&out_dir)
        .keep_last((cfg.save_total_limit > 0).then_some(cfg.save_total_limit));
    let resume_from = if opts.resume {
        latest_checkpoint(&out_dir)?
    } else {
        None
    };
    if opts.resume && resume_from.is_none() {
        eprintln!(
            "no checkpoint in {} to resume from; starting from scratch",
            out_dir.display()
        );
    }
    let settings = optim_settings(cfg);
    let mut opt = train_setup::optimizer(&settings, &p.vars)?;
    let total = p.plan.total_steps as u64;
    let mut state = TrainerState {
        max_steps: Some(total),
        num_train_epochs: Some(cfg.num_train_epochs),
        logging_steps: Some(cfg.logging_steps as u64),
        eval_steps: Some(cfg.eval_steps as u64),
        save_steps: Some(cfg.save_steps as u64),
        train_batch_size: Some(cfg.per_device_train_batch_size as u64),
        rlft: RlftState::default(),
        ..Default::default()
    };
    let mut pos = DataPosition::default();
    if let Some(dir) = &resume_from {
        let ck = load_checkpoint(dir, p.model.device())?;
        train_setup::restore_weights(&p.vars, &ck.weights.tensors).map_err(GrpoError::Other)?;
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
    }
    let config_text = toml::to_string(cfg).unwrap_or_default();
    std::fs::write(out_dir.join("config.toml"), config_text)
        .map_err(|e| GrpoError::Other(format!("{}: {e}", out_dir.display())))?;
    let tensorboard = cfg.report_to.iter().any(|r| r == "tensorboard");
    let mut metrics = if resume_from.is_some() {
        MetricsLogger::resume(&out_dir, state.global_step, tensorboard)?
    } else {
        MetricsLogger::create(&out_dir, tensorboard)?
    };
    let mut samples_log =
        SampleLog::open(&out_dir, resume_from.as_ref().map(|_| state.global_step))
            .map_err(|e| GrpoError::Other(format!("{}: {e}", out_dir.display())))?;
    let names = p.rewards.names();
    let eval_cfg = eval_settings(cfg, &p.generation.eos_token_ids, p.pad_id);
    let mut summary = GrpoSummary::default();
    let run_eval = |p: &mut Prepared,
                    step: u64,
                    epoch: f64,
                    metrics: &mut MetricsLogger,
                    log: &mut SampleLog|
     -> Result<Option<Metrics>> {
        if p.eval.is_empty() {
            return Ok(None);
        }
        let t = Instant::now();
        let r = evaluate(&p.model, &p.text, &p.eval, &mut p.rewards, &eval_cfg)?;
        let mut m = r.metrics;
        m.push(("time/eval".into(), t.elapsed().as_secs_f64()));
        let refs: Vec<(&str, f64)> = m.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        metrics.log(step, epoch, &refs)?;
        let logged: Vec<LoggedSample<'_>> = r
            .samples
            .iter()
            .enumerate()
            .take(cfg.num_completions_to_log.max(1) * 2)
            .map(|(i, s)| LoggedSample {
                split: "eval",
                prompt: &p.eval[s.prompt].text,
                completion: &s.text,
                reward: r.scores.total[i],
                rewards: sample_reward_parts(&names, &r.scores, i),
                advantage: None,
                completion_tokens: s.completion_ids.len(),
                truncated: s.truncated,
            })
            .collect();
        log.write(step, &logged)
            .map_err(|e| GrpoError::Other(format!("samples.jsonl: {e}")))?;
        Ok(Some(m))
    };
    if resume_from.is_none() {
        summary.eval_initial = run_eval(p, 0, 0.0, &mut metrics, &mut samples_log)?;
        if let Some(m) = &summary.eval_initial {
            eprintln!(
                "eval before training: {}",
                short(m, &[("eval/reward", "reward")])
            );
        }
    }
    let sched = train_setup::scheduler(&settings)?;
    let data = DataCursor::new(p.train.len(), cfg.seed, pos);
    let mut lp = Loop {
        cfg,
        p,
        opt,
        sched,
        data,
        state,
        names: names.clone(),
    };
    let mut progress = if opts.progress {
        Progress::new(total, lp.state.global_step)
    } else {
        Progress::hidden(total, lp.state.global_step)
    };
    let mut health = HealthMonitor::new(cfg.kl_warning_threshold, cfg.zero_std_warning_steps);
    let mut ran = 0u64;
    let train_batch = lp.p.plan.train_batch;
    let mut save_due = false;
    let device = lp.p.model.device().clone();
    while lp.state.global_step < total {
        if opts.shutdown.as_ref().is_some_and(|s| s.is_requested()) {
            summary.interrupted = true;
            break;
        }
        if opts.stop_after.is_some_and(|s| ran >= s) {
            break;
        }
        let mut times = Metrics::new();
        let r = lp.rollout(&mut times)?;
        let rollout_times = times.clone();
        let n = r.samples.len();
        let mut first_step_of_rollout = true;
        'iters: for _ in 0..cfg.num_iterations {
            for chunk_start in (0..n).step_by(train_batch) {
                if lp.state.global_step >= total {
                    break 'iters;
                }
                let idx: Vec<usize> = (chunk_start..(chunk_start + train_batch).min(n)).collect();
                let mut step_times = Metrics::new();
                // On the pool, its workers spinning (`on_pool`).
                let step_m = rlft_kernels::pool::on_pool_for(&device, || {
                    lp.step(&r, &idx, &mut step_times)
                })?;
                lp.state.global_step += 1;
                lp.state.num_input_tokens_seen += idx
                    .iter()
                    .map(|&i| r.samples[i].completion_ids.len() as u64)
                    .sum::<u64>();
                lp.state.epoch = lp.data.epoch();
                ran += 1;
                let step = lp.state.global_step;
                let mut m = r.metrics.clone();
                m.extend(step_m);
                if first_step_of_rollout {
                    m.extend(rollout_times.iter().cloned());
                }
                m.extend(step_times);
                if m.iter().any(|(k, _)| k == "skipped") {
                    summary.skipped_steps += 1;
                }
                m.retain(|(k, _)| k != "skipped");
                m.push(("skipped_steps".into(), summary.skipped_steps as f64));
                for w in health.observe(step, &m) {
                    progress.println(&format!("warning [{}]: {}", w.kind, w.message));
                }
                let log_now = step.is_multiple_of(cfg.logging_steps as u64) || step == total;
                if log_now {
                    let refs: Vec<(&str, f64)> = m.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                    metrics.log(step, lp.state.epoch, &refs)?;
                    let mut entry = serde_json::Map::new();
                    for (k, v) in &m {
                        entry.insert(k.clone(), json!(v));
                    }
                    entry.insert("step".into(), json!(step));
                    lp.state.log_history.push(entry);
                    progress.println(&format!(
                        "step {step}/{total} {}",
                        short(
                            &m,
                            &[
                                ("loss", "loss"),
                                ("reward", "reward"),
                                ("reward_std", "std"),
                                ("kl", "kl"),
                                ("completions/mean_length", "len"),
                                ("grad_norm", "gnorm"),
                            ]
                        )
                    ));
                }
                if log_now && first_step_of_rollout {
                    let logged: Vec<LoggedSample<'_>> = r
                        .logged
                        .iter()
                        .map(|l| {
                            let (i, parts, total) = (&l.index, &l.parts, &l.total);
                            let s = &r.samples[*i];
                            LoggedSample {
                                split: "train",
                                prompt: &lp.p.train[s.prompt].text,
                                completion: &s.text,
                                reward: *total,
                                rewards: parts.clone(),
                                advantage: Some(r.advantages[*i]),
                                completion_tokens: s.completion_ids.len(),
                                truncated: s.truncated,
                            }
                        })
                        .collect();
                    samples_log
                        .write(step, &logged)
                        .map_err(|e| GrpoError::Other(format!("samples.jsonl: {e}")))?;
                }
                first_step_of_rollout = false;
                if cfg.eval_steps > 0 && step.is_multiple_of(cfg.eval_steps as u64) && step < total
                {
                    if let Some(em) =
                        run_eval(lp.p, step, lp.state.epoch, &mut metrics, &mut samples_log)?
                    {
                        progress.println(&format!(
                            "eval at step {step}: {}",
                            short(&em, &[("eval/reward", "reward")])
                        ));
                    }
                }
                if cfg.save_steps > 0 && step.is_multiple_of(cfg.save_steps as u64) {
                    save_due = true;
                }
                progress.update(step, &short(&m, &[("reward", "reward"), ("kl", "kl")]));
                summary.steps.push(m);
            }
        }
        if save_due && lp.state.global_step < total {
            let t = Instant::now();
            manager.save(&lp.checkpoint()?)?;
            save_due = false;
            metrics.log(
                lp.state.global_step,
                lp.state.epoch,
                &[("time/save", t.elapsed().as_secs_f64())],
            )?;
        }
    }
    summary.global_step = lp.state.global_step;
    // Save where we stopped (end, Ctrl-C or stop_after) so the run can resume.
    manager.save(&lp.checkpoint()?)?;
    let finished = lp.state.global_step >= total;
    if finished {
        summary.eval_final = run_eval(
            lp.p,
            lp.state.global_step,
            lp.state.epoch,
            &mut metrics,
            &mut samples_log,
        )?;
        if let Some(m) = &summary.eval_final {
            eprintln!(
                "eval after training: {}",
                short(m, &[("eval/reward", "reward")])
            );
        }
        summary.final_dir = Some(train_setup::export_final(
            &out_dir,
            &cfg.model,
            &lp.p.model,
            lp.p.lora.as_ref(),
            &lp.p.text,
            &lp.p.generation,
        )?);
    }
    summary.wall_time_s = start.elapsed().as_secs_f64();
    progress.finish(&format!(
        "{} steps in {:.1}s",
        summary.global_step, summary.wall_time_s
    ));
    write_run_summary(cfg, &summary, finished)?;
    Ok(summary)
}

fn metrics_json(m: &Option<Metrics>) -> serde_json::Value {
    match m {
        Some(m) => {
            let mut o = serde_json::Map::new();
            for (k, v) in m {
                o.insert(k.clone(), json!(v));
            }
            serde_json::Value::Object(o)
        }
        None => serde_json::Value::Null,
    }
}

/// `run_summary.json`: config, wall time, peak memory, eval before/after, status.
fn write_run_summary(cfg: &GrpoConfig, s: &GrpoSummary, finished: bool) -> Result<()> {
    let v = json!({
        "config": serde_json::to_value(cfg).unwrap_or_default(),
        "model": cfg.model,
        "wall_time_s": s.wall_time_s,
        "peak_rss_mib": peak_rss_mib(),
        "global_step": s.global_step,
        "skipped_steps": s.skipped_steps,
        "eval_initial": metrics_json(&s.eval_initial),
        "eval_final": metrics_json(&s.eval_final),
        "status": if finished { "finished" } else { "interrupted" },
        "final_dir": s.final_dir,
    });
    let path = cfg.output_dir.join("run_summary.json");
    let tmp = cfg.output_dir.join(".run_summary.json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&v).unwrap_or_default())
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(|e| GrpoError::Other(format!("{}: {e}", path.display())))
}
