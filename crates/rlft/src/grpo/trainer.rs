//! GRPO on the run core. A unit is one rollout, read top to bottom as named, timed phases:
//!
//! generate -> reward -> advantages -> old_logprobs (when a rollout feeds more than one
//! optimiser step) -> ref_logprobs (when `beta > 0`); the core then takes the rollout's
//! optimiser steps (`num_iterations` passes over its train batches), each micro-batch's loss
//! being [`grpo_loss`] over the shared prompt pass.
//!
//! The rollout seed is `mix(seed, global_step)`, so a resumed run samples what it would have.

use candle_core::Tensor;
use rlft_model::CausalLm;
use rlft_rewards::{RewardSet, Scores};

use super::setup::{eval_settings, rollout_settings};
use super::Prepared;
use crate::algo::{grpo_loss, multi_reward_advantages, LossInputs, LossNormalizer};
use crate::config::grpo::{BatchPlan, GrpoConfig};
use crate::data::prompts::PromptItem;
use crate::data::DataCursor;
use crate::error::Result;
use crate::error::TrainerError;
use crate::rollout::eval::evaluate;
use crate::rollout::samples::{pick, LoggedSample, SampleLog};
use crate::rollout::stats::{rollout_metrics, HealthMonitor};
use crate::rollout::{
    generate_and_score, no_grad_passes, policy_pass, timed, MicroRows, NoGradPasses, Sample,
    ScoreOptions,
};
use crate::run::optim::mix;
use crate::run::{
    Algorithm, Metrics, Policy, Position, RunOptions, RunSummary, StepOutcome, StepStats,
};

/// What a finished (or interrupted) GRPO run reports.
pub type GrpoSummary = RunSummary;

/// A rollout with everything its optimiser steps need.
pub struct Rollout {
    samples: Vec<Sample>,
    advantages: Vec<f64>,
    old: Option<Vec<Vec<f32>>>,
    reference: Option<Vec<Vec<f32>>>,
    scores: Scores,
    metrics: Metrics,
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
        let settings = rollout_settings(cfg, policy, mix(cfg.args.seed, at.global_step));
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
            let per_function: Vec<&[Option<f64>]> =
                scores.per_function.iter().map(|f| &f.scores[..]).collect();
            Ok(multi_reward_advantages(
                &per_function,
                self.rewards.weights(),
                cfg.num_generations,
                cfg.multi_objective_aggregation,
                &cfg.advantage_config(),
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
        let metrics = rollout_metrics(
            &self.names,
            &scores,
            &adv.group_std,
            adv.frac_zero_std,
            &samples,
        );
        Ok(Rollout {
            samples,
            advantages: adv.values,
            old,
            reference,
            scores,
            metrics,
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
        let keep: Vec<bool> = mb.iter().map(|&i| keep(i)).collect();
        let rows = MicroRows {
            samples: &r.samples,
            rows: mb,
            keep: &keep,
            old: r.old.as_deref(),
            reference: r.reference.as_deref(),
        };
        let o = ScoreOptions {
            pad_id: policy.pad_id,
            grad: true,
            entropy: true,
            temperature: cfg.temperature,
            share_prompts: cfg.share_prompts,
        };
        let pass = policy_pass(&policy.model, self.train, &rows, o)?;
        let device = policy.model.device();
        let adv: Vec<f32> = mb.iter().map(|&i| r.advantages[i] as f32).collect();
        let adv = Tensor::from_vec(adv, mb.len(), device)?;
        let out = grpo_loss(
            &LossInputs {
                logp: &pass.logp,
                old_logp: pass.old.as_ref(),
                ref_logp: pass.reference.as_ref(),
                advantages: &adv,
                mask: &pass.mask,
                entropies: pass.entropies.as_ref(),
                normalizer: LossNormalizer {
                    accumulation_steps: cfg.args.gradient_accumulation_steps,
                    num_items_in_batch: num_items.max(1) as f64,
                },
            },
            &cfg.loss_config(),
        )?;
        let (ntok, nratio) = (out.stats.tokens, out.stats.ratio_count);
        if let Some(c) = out.stats.clip {
            stats.add("clip_ratio/low_mean", c.low, nratio);
            stats.add("clip_ratio/high_mean", c.high, nratio);
            stats.add("clip_ratio/region_mean", c.region, nratio);
        }
        if let Some(c) = out.stats.cispo_clip_ratio {
            stats.add("cispo_clip_ratio", c, nratio);
        }
        if let Some(kl) = out.stats.kl {
            stats.add("kl", kl, ntok);
        }
        if let Some(e) = pass.entropy {
            stats.add("entropy", e, ntok);
        }
        stats.tokens += pass.num_tokens;
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
        // The first completion of the first few groups.
        let firsts = (0..r.samples.len()).step_by(self.cfg.num_generations);
        let picks = firsts.take(self.cfg.num_completions_to_log);
        let scored = (&self.names[..], &r.scores);
        let logged = pick(
            "train",
            self.train,
            &r.samples,
            scored,
            Some(&r.advantages),
            picks,
        );
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
        let scored = (&self.names[..], &r.scores);
        let logged = pick("eval", self.eval, &r.samples, scored, None, 0..keep);
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
