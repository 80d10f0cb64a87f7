//! GRPO on the run core. A unit is one rollout, read top to bottom as named, timed phases:
//!
//! generate -> reward -> advantages -> old_logprobs (when a rollout feeds more than one
//! optimiser step) -> ref_logprobs (when `beta > 0`); the core then takes the rollout's
//! optimiser steps (`num_iterations` passes over its train batches), each micro-batch's loss
//! being [`grpo_loss`] over the shared prompt pass. Rows whose advantage is exactly 0 are left
//! out of that pass where this changes nothing ([`super::skip`]).
//!
//! The rollout seed is `mix(seed, global_step)`, so a resumed run samples what it would have.

use candle_core::Tensor;
use rlft_model::CausalLm;
use rlft_rewards::{RewardSet, Scores};

use super::advantages::{estimate_rollout, shaped_rewards, Advantage};
use super::dynamic::{Filter, GenBatch};
use super::setup::rollout_settings;
use super::skip::{skip_is_exact, split_micro_batch};
use super::Prepared;
use crate::algo::LossNormalizer;
use crate::config::online::{BatchPlan, OnlineConfig};
use crate::data::prompts::PromptItem;
use crate::data::DataCursor;
use crate::error::Result;
use crate::online::critic::Critic;
use crate::rollout::logs::{online_step_metrics, OnlineLogs};
use crate::rollout::remote::ServerPool;
use crate::rollout::stats::{rollout_metrics, turn_metrics, HealthMonitor};
use crate::rollout::{
    generate_and_score, no_grad_passes, policy_pass, timed, MicroRows, NoGradPasses, Sample,
    Sampler, ScoreOptions, Turns,
};
use crate::run::optim::mix;
use crate::run::{
    Algorithm, Console, Metrics, MicroContext, Policy, Position, RunOptions, RunSummary, Shown,
    StepOutcome, UnitContext, GRAD_NORM, LOSS,
};

mod loss;

use loss::{CriticPart, SamplerCorrection};

/// What a finished (or interrupted) online run reports.
pub type OnlineSummary = RunSummary;

/// A rollout with everything its optimiser steps need.
pub struct Rollout {
    samples: Vec<Sample>,
    advantages: Advantage,
    /// One advantage per completion, for the sample log.
    logged_advantages: Vec<f64>,
    old: Option<Vec<Vec<f32>>>,
    reference: Option<Vec<Vec<f32>>>,
    /// PPO: the critic's old values and returns.
    critic: Option<CriticPart>,
    /// Server rollouts: the sampler correction.
    correction: Option<SamplerCorrection>,
    /// `[N]` the rows left out of the training pass (advantage exactly 0), when leaving them
    /// out is exact ([`skip_is_exact`]); `None`: every row is scored.
    zero_adv: Option<Vec<bool>>,
    scores: Scores,
    metrics: Metrics,
}

/// The online family as an [`Algorithm`].
struct Online<'a> {
    cfg: &'a OnlineConfig,
    reference: Option<&'a CausalLm>,
    critic: Option<&'a Critic>,
    turns: Option<&'a Turns>,
    train: &'a [PromptItem],
    eval: &'a [PromptItem],
    rewards: &'a mut RewardSet,
    plan: BatchPlan,
    health: HealthMonitor,
    logs: OnlineLogs,
    /// Rollouts on servers (`rollout_servers`).
    servers: Option<ServerPool>,
    /// Leave zero-advantage rows out of the training pass where that is exact; false only in
    /// [`train_scoring_every_row`], the tests' reference.
    skip_zero_advantage: bool,
}

impl Online<'_> {
    /// The rollout's samples and scores: one generation batch, or with dynamic sampling as
    /// many as it takes (at most `max_num_gen_batches`) to fill the rollout with groups whose
    /// rewards differ.
    fn sample(
        &mut self,
        policy: &Policy,
        data: &mut DataCursor,
        at: Position,
        times: &mut Metrics,
    ) -> Result<(Vec<Sample>, Scores, Metrics)> {
        let cfg = self.cfg;
        let want = self.plan.rollout_prompts;
        let seed = mix(cfg.args.seed, at.global_step);
        self.rewards.set_trainer_state(at.into());
        // Servers sample from the adapter of this step: push it first (once per step).
        let served = match &mut self.servers {
            Some(pool) => Some(timed(times, "push_adapter", || {
                pool.push_adapter(policy, at.global_step, &cfg.args.model)
            })?),
            None => None,
        };
        let sampler = match self.servers.as_ref().zip(served.as_deref()) {
            Some((pool, model)) => Sampler::Servers { pool, model },
            None => Sampler::Policy(&policy.model, self.turns),
        };
        let mut generate = |data: &mut DataCursor, seed: u64, times: &mut Metrics| {
            let prompts = data.take(want);
            let settings = rollout_settings(cfg, policy, seed);
            let (t, train) = (&policy.text, self.train);
            generate_and_score(sampler, t, train, &prompts, &settings, self.rewards, times)
        };
        if !cfg.estimator.dynamic_sampling {
            let (samples, scores) = generate(data, seed, times)?;
            return Ok((samples, scores, Metrics::new()));
        }
        let mut filter = Filter::new(want, cfg.num_generations);
        for b in 0..cfg.estimator.max_num_gen_batches as u64 {
            let mut t = Metrics::new();
            let (samples, scores) =
                generate(data, if b == 0 { seed } else { mix(seed, b) }, &mut t)?;
            for (k, v) in t {
                match times.iter_mut().find(|(k2, _)| *k2 == k) {
                    Some((_, acc)) => *acc += v,
                    None => times.push((k, v)),
                }
            }
            let rewards = shaped_rewards(cfg, &samples, &scores.total);
            if filter.add(GenBatch {
                samples,
                scores,
                rewards,
            }) {
                break;
            }
        }
        Ok(filter.finish())
    }

    /// `[N]` the rows of a rollout with `advantages` to leave out of the training pass: those
    /// whose advantage is exactly 0, when leaving them out is exact; `None` otherwise.
    fn rows_to_skip(&self, policy: &Policy, advantages: &Advantage) -> Option<Vec<bool>> {
        let dropout = policy.lora.as_ref().is_some_and(|l| l.lora_dropout > 0.0);
        let exact = skip_is_exact(self.cfg, self.critic.is_some(), dropout);
        (self.skip_zero_advantage && exact).then(|| advantages.zero_rows())
    }
}

impl Algorithm for Online<'_> {
    type Unit = Rollout;

    const CONSOLE: Console = Console {
        step: &[
            LOSS,
            Shown::new("reward", "reward"),
            Shown::new("reward_std", "std"),
            Shown::new("kl", "kl"),
            Shown::new("completions/mean_length", "len"),
            GRAD_NORM,
        ],
        progress: &[Shown::new("reward", "reward"), Shown::new("kl", "kl")],
        eval: &[Shown::new("eval/reward", "reward")],
    };

    fn data_len(&self) -> usize {
        self.train.len()
    }

    fn total_steps(&self) -> u64 {
        self.plan.total_steps as u64
    }

    fn open_logs(&mut self, out_dir: &std::path::Path, resumed_at: Option<u64>) -> Result<()> {
        self.logs.open(out_dir, resumed_at)
    }

    fn next_unit(&mut self, cx: UnitContext<'_>) -> Result<Rollout> {
        let (cfg, policy, times) = (self.cfg, cx.policy, cx.times);
        let (samples, scores, sampling_metrics) = self.sample(policy, cx.data, cx.at, times)?;
        let rewards = shaped_rewards(cfg, &samples, &scores.total);
        let weights = self.rewards.weights().to_vec();
        let needs = super::setup::passes(cfg, &self.plan);
        let passes = NoGradPasses {
            policy: &policy.model,
            reference: self.reference,
            old: needs.old,
            with_reference: needs.reference,
            batch: cfg.args.per_device_train_batch_size,
            pad_id: policy.pad_id,
            temperature: cfg.rollout.temperature,
            share_prompts: cfg.share_prompts,
        };
        let (old, reference) = no_grad_passes(&passes, self.train, &samples, times)?;
        let (correction, is_stats) = SamplerCorrection::of(cfg, &samples, old.as_deref());
        let values = match self.critic {
            Some(c) => Some(timed(times, "values", || {
                let batch = cfg.args.per_device_train_batch_size;
                rlft_kernels::pool::on_pool_for(policy.model.device(), || {
                    c.values_no_grad(self.train, &samples, batch)
                })
            })?),
            None => None,
        };
        let est = timed(times, "advantages", || {
            Ok(estimate_rollout(
                cfg,
                &samples,
                (&scores, &weights[..]),
                &rewards,
                old.as_deref(),
                reference.as_deref(),
                values.as_deref(),
            ))
        })?;
        let mut metrics = rollout_metrics(
            &self.logs.names,
            &scores,
            &est.group_std,
            est.frac_zero_std.unwrap_or(0.0),
            &samples,
        );
        if est.frac_zero_std.is_none() {
            metrics.retain(|(k, _)| k != "frac_reward_zero_std");
        }
        if let Some(turns) = self.turns {
            metrics.extend(turn_metrics("", &samples, turns));
        }
        metrics.extend(est.metrics);
        metrics.extend(sampling_metrics);
        metrics.extend(is_stats);
        Ok(Rollout {
            logged_advantages: est.advantages.per_completion(),
            zero_adv: self.rows_to_skip(policy, &est.advantages),
            samples,
            advantages: est.advantages,
            old: old.filter(|_| needs.old_in_loss),
            reference: reference.filter(|_| !cfg.kl_in_reward()),
            critic: values
                .zip(est.returns)
                .map(|(old_values, returns)| CriticPart {
                    old_values,
                    returns,
                }),
            correction,
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

    fn micro_loss(&self, cx: MicroContext<'_, Rollout>) -> Result<Option<Tensor>> {
        let (cfg, policy, r, mb) = (self.cfg, cx.policy, cx.unit, cx.micro);
        let (step, stats) = (cx.step, cx.stats);
        let keep = |i: usize| cfg.in_loss(r.samples[i].truncated);
        let tokens = |i: usize| usize::from(keep(i)) * r.samples[i].sampled_tokens();
        let num_items: usize = step.iter().flatten().map(|&i| tokens(i)).sum();
        let row_tokens: Vec<usize> = mb.iter().map(|&i| tokens(i)).collect();
        let split = split_micro_batch(mb, r.zero_adv.as_deref(), &row_tokens);
        if r.zero_adv.is_some() {
            self.skipped_stats(r, &split, stats);
        }
        if split.scored.is_empty() {
            return Ok(None);
        }
        let rows = &split.scored[..];
        let keep: Vec<bool> = rows.iter().map(|&i| keep(i)).collect();
        let micro = MicroRows {
            samples: &r.samples,
            rows,
            keep: &keep,
            old: r.old.as_deref(),
            reference: r.reference.as_deref(),
        };
        let o = ScoreOptions {
            pad_id: policy.pad_id,
            grad: true,
            entropy: true,
            temperature: cfg.rollout.temperature,
            share_prompts: cfg.share_prompts,
        };
        let pass = policy_pass(&policy.model, self.train, &micro, o)?;
        let norm = LossNormalizer {
            accumulation_steps: cfg.args.gradient_accumulation_steps,
            num_items_in_batch: num_items.max(1) as f64,
            micro_batch: (split.skipped_rows > 0).then_some(split.whole),
        };
        let loss = self.policy_loss(r, rows, &pass, norm, stats)?;
        let ntok = pass.mask.sum_all()?.to_scalar::<f32>()? as f64;
        if let Some(e) = pass.entropy {
            stats.add("entropy", e, ntok);
        }
        let loss = match (self.critic, &r.critic) {
            (Some(c), Some(part)) => {
                let (train, samples) = (self.train, &r.samples[..]);
                (loss + part.loss(c, cfg, train, samples, rows, &pass.mask, ntok, stats)?)?
            }
            _ => loss,
        };
        stats.tokens += pass.num_tokens;
        Ok(Some(loss))
    }

    fn step_metrics(
        &self,
        r: &Rollout,
        out: &StepOutcome,
        first: bool,
        times: &Metrics,
    ) -> Metrics {
        online_step_metrics(&r.metrics, out, first, times)
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
        let picks = firsts.take(self.cfg.rollout.num_completions_to_log);
        let adv = Some(&r.logged_advantages[..]);
        self.logs
            .log_train(step, self.train, &r.samples, &r.scores, adv, picks)
    }

    fn extra_vars(&self) -> Vec<(String, candle_core::Var)> {
        self.critic.map(|c| c.vars.clone()).unwrap_or_default()
    }

    fn export(
        &self,
        out_dir: &std::path::Path,
        model_name: &str,
        policy: &Policy,
    ) -> Result<std::path::PathBuf> {
        let dir = crate::run::setup::export_final(out_dir, model_name, policy)?;
        if let Some(c) = self.critic {
            c.export(out_dir)?;
        }
        Ok(dir)
    }

    fn evaluate(&mut self, policy: &Policy, at: Position) -> Result<Option<Metrics>> {
        self.logs
            .evaluate(self.cfg, policy, self.eval, self.rewards, self.turns, at)
    }
}

/// The rollout servers of a config that uses them (waits up to `rollout_server_timeout` for each).
fn connect_servers(cfg: &OnlineConfig) -> Result<Option<ServerPool>> {
    if !cfg.servers.on_servers() {
        return Ok(None);
    }
    let timeout = std::time::Duration::from_secs_f64(cfg.servers.rollout_server_timeout);
    let root = cfg.args.output_dir.join("rollout_adapters");
    let key = cfg.servers.api_key()?;
    let pool = ServerPool::connect(&cfg.servers.urls(), timeout, &root, key.as_deref())?;
    eprintln!(
        "rollouts on {} server(s): {}",
        pool.live().len(),
        pool.live().join(", ")
    );
    Ok(Some(pool))
}

/// Runs GRPO as configured: prints progress, writes metrics, samples, checkpoints, the final
/// model and `run_summary.json` under `output_dir`.
pub fn train(cfg: &OnlineConfig, p: &mut Prepared, opts: &RunOptions) -> Result<OnlineSummary> {
    train_with(cfg, p, opts, true)
}

/// [`train`] with every row scored in the training pass, zero-advantage ones too: the reference
/// the tests compare the skipping against (the same result, only slower).
#[doc(hidden)]
pub fn train_scoring_every_row(
    cfg: &OnlineConfig,
    p: &mut Prepared,
    opts: &RunOptions,
) -> Result<OnlineSummary> {
    train_with(cfg, p, opts, false)
}

/// [`train`], leaving zero-advantage rows out of the training pass or not.
fn train_with(
    cfg: &OnlineConfig,
    p: &mut Prepared,
    opts: &RunOptions,
    skip_zero_advantage: bool,
) -> Result<OnlineSummary> {
    let mut algo = Online {
        cfg,
        reference: p.reference.as_ref(),
        critic: p.critic.as_ref(),
        turns: p.turns.as_ref(),
        train: &p.train,
        eval: &p.eval,
        logs: OnlineLogs::new(p.rewards.names(), cfg.rollout.num_completions_to_log),
        rewards: &mut p.rewards,
        plan: p.plan,
        health: HealthMonitor::new(cfg.kl_warning_threshold, cfg.zero_std_warning_steps),
        servers: connect_servers(cfg)?,
        skip_zero_advantage,
    };
    crate::run::run(cfg, &mut algo, &mut p.policy, opts)
}
