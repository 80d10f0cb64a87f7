//! GRPO on the run core. A unit is one rollout, read top to bottom as named, timed phases:
//!
//! generate -> reward -> advantages -> old_logprobs (when a rollout feeds more than one
//! optimiser step) -> ref_logprobs (when `beta > 0`); the core then takes the rollout's
//! optimiser steps (`num_iterations` passes over its train batches), each micro-batch's loss
//! being [`grpo_loss`] over the shared prompt pass.
//!
//! The rollout seed is `mix(seed, global_step)`, so a resumed run samples what it would have.

use candle_core::Tensor;
use rlft_model::sampling::SamplingParams;
use rlft_model::CausalLm;
use rlft_rewards::RewardSet;

use super::Prepared;
use crate::algo::{
    compute_advantages, grpo_loss, AdvantageConfig, LossConfig, LossInputs, LossNormalizer,
};
use crate::config::grpo::{BatchPlan, EvalDecoding, GrpoConfig};
use crate::data::prompts::PromptItem;
use crate::data::DataCursor;
use crate::error::Result;
use crate::error::TrainerError;
use crate::rollout::eval::{evaluate, sample_reward_parts, EvalSettings};
use crate::rollout::samples::{LoggedSample, SampleLog};
use crate::rollout::stats::{length_metrics, reward_metrics, HealthMonitor};
use crate::rollout::{
    generate_and_score, no_grad_passes, pad_rows, score_batch, timed, NoGradPasses,
    RolloutSettings, Sample, ScoreOptions,
};
use crate::run::optim::mix;
use crate::run::{
    Algorithm, Metrics, Policy, Position, RunOptions, RunSummary, StepOutcome, StepStats,
};

/// What a finished (or interrupted) GRPO run reports.
pub type GrpoSummary = RunSummary;

/// Prompts an eval pass generates at once (also what `rlft plan` sizes its KV caches for).
pub const EVAL_BATCH: usize = 16;

/// A rollout with everything its optimiser steps need.
pub struct Rollout {
    samples: Vec<Sample>,
    advantages: Vec<f64>,
    old: Option<Vec<Vec<f32>>>,
    reference: Option<Vec<Vec<f32>>>,
    metrics: Metrics,
    /// Completions picked for samples.jsonl: index, reward parts, total.
    logged: Vec<(usize, Vec<(String, f64)>, f64)>,
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
        greedy: cfg.eval_decoding == EvalDecoding::Greedy,
        sampling: sampling(cfg),
        max_new_tokens: cfg.max_completion_length,
        seed: mix(cfg.args.seed, u64::MAX),
        eos_token_ids: eos_token_ids.to_vec(),
        pad_token_id,
        batch_size: EVAL_BATCH,
    }
}

/// GRPO as an [`Algorithm`].
struct Grpo<'a> {
    cfg: &'a GrpoConfig,
    reference: Option<&'a CausalLm>,
    train: &'a [PromptItem],
    eval: &'a [PromptItem],
    rewards: &'a mut RewardSet,
    plan: BatchPlan,
    names: Vec<String>,
    health: HealthMonitor,
    samples: Option<SampleLog>,
}

impl Grpo<'_> {
    fn write_samples(&mut self, step: u64, logged: &[LoggedSample<'_>]) -> Result<()> {
        if let Some(log) = &mut self.samples {
            log.write(step, logged)
                .map_err(|e| TrainerError::Other(format!("samples.jsonl: {e}")))?;
        }
        Ok(())
    }
}

impl Algorithm for Grpo<'_> {
    type Unit = Rollout;

    const STEP_LINE: &'static [(&'static str, &'static str)] = &[
        ("loss", "loss"),
        ("reward", "reward"),
        ("reward_std", "std"),
        ("kl", "kl"),
        ("completions/mean_length", "len"),
        ("grad_norm", "gnorm"),
    ];
    const PROGRESS_LINE: &'static [(&'static str, &'static str)] =
        &[("reward", "reward"), ("kl", "kl")];
    const EVAL_LINE: &'static [(&'static str, &'static str)] = &[("eval/reward", "reward")];

    fn data_len(&self) -> usize {
        self.train.len()
    }

    fn total_steps(&self) -> u64 {
        self.plan.total_steps as u64
    }

    fn open_logs(&mut self, out_dir: &std::path::Path, resumed_at: Option<u64>) -> Result<()> {
        self.samples =
            Some(SampleLog::open(out_dir, resumed_at).map_err(TrainerError::io(out_dir))?);
        Ok(())
    }

    fn next_unit(
        &mut self,
        policy: &Policy,
        data: &mut DataCursor,
        at: Position,
        times: &mut Metrics,
    ) -> Result<Rollout> {
        let cfg = self.cfg;
        let prompts = data.take(self.plan.rollout_prompts);
        let settings = RolloutSettings {
            num_generations: cfg.num_generations,
            max_new_tokens: cfg.max_completion_length,
            sampling: sampling(cfg),
            seed: mix(cfg.args.seed, at.global_step),
            eos_token_ids: policy.generation.eos_token_ids.clone(),
            pad_token_id: policy.pad_id,
        };
        let (samples, scores) = generate_and_score(
            &policy.model,
            &policy.text,
            self.train,
            &prompts,
            &settings,
            self.rewards,
            times,
        )?;
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
        let needs = super::setup::passes(cfg, &self.plan);
        let passes = NoGradPasses {
            policy: &policy.model,
            reference: self.reference,
            old: needs.old,
            with_reference: needs.reference,
            batch: cfg.args.per_device_train_batch_size,
            pad_id: policy.pad_id,
            temperature: cfg.temperature,
            share_prompts: cfg.share_prompts,
        };
        let (old, reference) = no_grad_passes(&passes, self.train, &samples, times)?;
        let mut metrics = reward_metrics("", &self.names, &scores, &adv.group_std);
        metrics.push(("frac_reward_zero_std".into(), adv.frac_zero_std));
        let lens: Vec<usize> = samples.iter().map(|s| s.completion_ids.len()).collect();
        let trunc: Vec<bool> = samples.iter().map(|s| s.truncated).collect();
        metrics.extend(length_metrics("", &lens, &trunc));
        // Samples to log: the first completion of the first few groups.
        let logged = (0..samples.len())
            .step_by(cfg.num_generations)
            .take(cfg.num_completions_to_log)
            .map(|i| {
                (
                    i,
                    sample_reward_parts(&self.names, &scores, i),
                    scores.total[i],
                )
            })
            .collect();
        Ok(Rollout {
            samples,
            advantages: adv.values,
            old,
            reference,
            metrics,
            logged,
        })
    }

    fn steps(&self, r: &Rollout) -> Vec<Vec<Vec<usize>>> {
        let (n, batch) = (r.samples.len(), self.plan.train_batch);
        let micro = self.cfg.args.per_device_train_batch_size;
        let one_pass = (0..n).step_by(batch).map(|start| {
            let idx: Vec<usize> = (start..(start + batch).min(n)).collect();
            idx.chunks(micro).map(<[usize]>::to_vec).collect::<Vec<_>>()
        });
        let one_pass: Vec<_> = one_pass.collect();
        (0..self.cfg.num_iterations)
            .flat_map(|_| one_pass.iter().cloned())
            .collect()
    }

    fn micro_loss(
        &self,
        policy: &Policy,
        r: &Rollout,
        step: &[Vec<usize>],
        mb: &[usize],
        stats: &mut StepStats,
    ) -> Result<Tensor> {
        let cfg = self.cfg;
        let keep = |i: usize| !(cfg.mask_truncated_completions && r.samples[i].truncated);
        let num_items: usize = step
            .iter()
            .flatten()
            .filter(|&&i| keep(i))
            .map(|&i| r.samples[i].completion_ids.len())
            .sum();
        let device = policy.model.device();
        let refs: Vec<&Sample> = mb.iter().map(|&i| &r.samples[i]).collect();
        let o = ScoreOptions {
            pad_id: policy.pad_id,
            grad: true,
            entropy: true,
            temperature: cfg.temperature,
            share_prompts: cfg.share_prompts,
        };
        let sb = score_batch(&policy.model, self.train, &refs, o)?;
        let tc = sb.mask.dim(1)?;
        let row_keep: Vec<f32> = mb.iter().map(|&i| f32::from(u8::from(keep(i)))).collect();
        let mask = sb
            .mask
            .broadcast_mul(&Tensor::from_vec(row_keep, (mb.len(), 1), device)?)?;
        let rows = |v: &Option<Vec<Vec<f32>>>| -> Result<Option<Tensor>> {
            v.as_ref()
                .map(|v| {
                    pad_rows(
                        &mb.iter().map(|&i| &v[i][..]).collect::<Vec<_>>(),
                        tc,
                        device,
                    )
                })
                .transpose()
        };
        let (old, reference) = (rows(&r.old)?, rows(&r.reference)?);
        let adv: Vec<f32> = mb.iter().map(|&i| r.advantages[i] as f32).collect();
        let adv = Tensor::from_vec(adv, mb.len(), device)?;
        let out = grpo_loss(
            &LossInputs {
                logp: &sb.logprobs,
                old_logp: old.as_ref(),
                ref_logp: reference.as_ref(),
                advantages: &adv,
                mask: &mask,
                normalizer: LossNormalizer {
                    accumulation_steps: cfg.args.gradient_accumulation_steps,
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
        let ntok = out.stats.tokens;
        stats.add("clip_ratio/low_mean", out.stats.clip_low, ntok);
        stats.add("clip_ratio/high_mean", out.stats.clip_high, ntok);
        stats.add("clip_ratio/region_mean", out.stats.clip_region, ntok);
        if let Some(kl) = out.stats.kl {
            stats.add("kl", kl, ntok);
        }
        if let Some(e) = sb.entropy {
            let m = mask.to_dtype(e.dtype())?;
            let s = (e * &m)?.sum_all()?.to_scalar::<f32>()? as f64;
            let c = m.sum_all()?.to_scalar::<f32>()? as f64;
            if c > 0.0 {
                stats.add("entropy", s / c, ntok);
            }
        }
        stats.tokens += sb.num_tokens;
        Ok(out.loss)
    }

    fn step_metrics(
        &self,
        r: &Rollout,
        out: &StepOutcome,
        first: bool,
        times: &Metrics,
    ) -> Metrics {
        let mut m = r.metrics.clone();
        m.push(("loss".into(), out.loss));
        m.push(("grad_norm".into(), out.grad_norm));
        m.push(("learning_rate".into(), out.lr));
        m.extend(out.stats.means().map(|(k, v)| (k.to_string(), v)));
        m.push((
            "tokens_per_s".into(),
            out.tokens as f64 / out.seconds.max(1e-9),
        ));
        if first {
            m.extend(times.iter().cloned());
        }
        m.push(("time/update".into(), out.seconds));
        m
    }

    fn tokens_seen(&self, r: &Rollout, step: &[Vec<usize>], _: &StepOutcome) -> u64 {
        let lens = step
            .iter()
            .flatten()
            .map(|&i| r.samples[i].completion_ids.len());
        lens.sum::<usize>() as u64
    }

    fn observe(&mut self, step: u64, metrics: &Metrics) -> Vec<String> {
        let warnings = self.health.observe(step, metrics);
        warnings
            .into_iter()
            .map(|w| format!("[{}]: {}", w.kind, w.message))
            .collect()
    }

    fn on_logged(&mut self, r: &Rollout, step: u64, first_of_unit: bool) -> Result<()> {
        if !first_of_unit {
            return Ok(());
        }
        let logged: Vec<LoggedSample<'_>> = r
            .logged
            .iter()
            .map(|(i, parts, total)| {
                let s = &r.samples[*i];
                LoggedSample {
                    split: "train",
                    prompt: &self.train[s.prompt].text,
                    completion: &s.text,
                    reward: *total,
                    rewards: parts.clone(),
                    advantage: Some(r.advantages[*i]),
                    completion_tokens: s.completion_ids.len(),
                    truncated: s.truncated,
                }
            })
            .collect();
        self.write_samples(step, &logged)
    }

    fn evaluate(&mut self, policy: &Policy, at: Position) -> Result<Option<Metrics>> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let settings = eval_settings(self.cfg, &policy.generation.eos_token_ids, policy.pad_id);
        let r = evaluate(
            &policy.model,
            &policy.text,
            self.eval,
            self.rewards,
            &settings,
        )?;
        let keep = self.cfg.num_completions_to_log.max(1) * 2;
        let logged: Vec<LoggedSample<'_>> = r
            .samples
            .iter()
            .enumerate()
            .take(keep)
            .map(|(i, s)| LoggedSample {
                split: "eval",
                prompt: &self.eval[s.prompt].text,
                completion: &s.text,
                reward: r.scores.total[i],
                rewards: sample_reward_parts(&self.names, &r.scores, i),
                advantage: None,
                completion_tokens: s.completion_ids.len(),
                truncated: s.truncated,
            })
            .collect();
        self.write_samples(at.global_step, &logged)?;
        Ok(Some(r.metrics))
    }
}

/// Runs GRPO as configured: prints progress, writes metrics, samples, checkpoints, the final
/// model and `run_summary.json` under `output_dir`.
pub fn train(cfg: &GrpoConfig, p: &mut Prepared, opts: &RunOptions) -> Result<GrpoSummary> {
    let mut algo = Grpo {
        cfg,
        reference: p.reference.as_ref(),
        train: &p.train,
        eval: &p.eval,
        names: p.rewards.names(),
        rewards: &mut p.rewards,
        plan: p.plan,
        health: HealthMonitor::new(cfg.kl_warning_threshold, cfg.zero_std_warning_steps),
        samples: None,
    };
    crate::run::run(cfg, &mut algo, &mut p.policy, opts)
}
