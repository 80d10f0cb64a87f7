//! Online DPO on the run core (TRL 1.16's experimental `OnlineDPOTrainer`,
//! `trl/experimental/online_dpo/online_dpo_trainer.py:1141-1295`). A unit is one rollout:
//!
//! generate (two completions per prompt) -> reward -> rank each pair (the higher total reward
//! is chosen, the first on a tie, as TRL's `first_half >= second_half`) -> ref_logprobs;
//! then one optimiser step whose micro-batches take whole pairs: the policy's summed
//! completion log-probs (temperature 1) against the reference's in [`dpo_loss`].
//!
//! Sampling, scoring, the reference (the base with adapters off under LoRA), eval and the
//! sample log are the online trainers' (`grpo::`); this file is the pairing and the loss.

use std::path::Path;

use candle_core::{Device, Tensor};
use rlft_model::CausalLm;
use rlft_rewards::{RewardSet, Scores};

use crate::algo::advantage::mean;
use crate::algo::compute_advantages;
use crate::algo::dpo_loss::{dpo_loss, sequence_logps, DpoLogps, DpoLossConfig, DpoStats};
use crate::config::online::{BatchPlan, OnlineConfig};
use crate::config::online_dpo::OnlineDpoConfig;
use crate::data::prompts::PromptItem;
use crate::error::{Result, TrainerError};
use crate::online::advantages::shaped_rewards;
use crate::online::setup::rollout_settings;
use crate::online::Prepared;
use crate::rollout::logs::OnlineLogs;
use crate::rollout::stats::rollout_metrics;
use crate::rollout::{
    generate_and_score, no_grad_passes, policy_pass, MicroRows, NoGradPasses, Sample, Sampler,
    ScoreOptions,
};
use crate::run::optim::mix;
use crate::run::{
    Algorithm, Console, Metrics, MicroContext, Policy, Position, RunOptions, RunSummary, Shown,
    StepOutcome, UnitContext, GRAD_NORM, LOSS,
};

/// A rollout of pairs: samples `2k` and `2k + 1` are prompt `k`'s two completions.
pub struct PairRollout {
    samples: Vec<Sample>,
    /// Per pair: whether its first completion is the chosen one.
    first_chosen: Vec<bool>,
    /// `[2k][len]` reference log-probs of every sample.
    reference: Vec<Vec<f32>>,
    /// The shaped rewards the ranking used (weighted total minus the missing-EOS penalty).
    rewards: Vec<f64>,
    /// The loss settings at this rollout's epoch (`beta` may change per epoch).
    loss: DpoLossConfig,
    scores: Scores,
    metrics: Metrics,
}

/// Loads the policy, prompts and rewards as the online trainers do; LoRA dropout off with
/// `disable_dropout`.
pub fn prepare(cfg: &OnlineDpoConfig, model_path: &Path, device: &Device) -> Result<Prepared> {
    let mut p = crate::online::prepare(&cfg.online(), model_path, device)?;
    if cfg.disable_dropout {
        crate::run::setup::disable_lora_dropout(&mut p.policy.model);
    }
    Ok(p)
}

/// Per pair of `rewards` (`[2k]`): whether the first is chosen (`>=`: the first on a tie).
pub fn rank_pairs(rewards: &[f64]) -> Vec<bool> {
    rewards.chunks_exact(2).map(|p| p[0] >= p[1]).collect()
}

struct OnlineDpo<'a> {
    cfg: &'a OnlineDpoConfig,
    online: OnlineConfig,
    reference: Option<&'a CausalLm>,
    train: &'a [PromptItem],
    eval: &'a [PromptItem],
    rewards: &'a mut RewardSet,
    plan: BatchPlan,
    logs: OnlineLogs,
}

impl OnlineDpo<'_> {
    /// The pair metrics TRL logs at rollout time (`objective/scores`, `scores_margin`,
    /// `val/contain_eos_token`).
    fn pair_metrics(rewards: &[f64], first_chosen: &[bool], samples: &[Sample]) -> Metrics {
        let margins: Vec<f64> = rewards
            .chunks_exact(2)
            .zip(first_chosen)
            .map(|(p, &f)| if f { p[0] - p[1] } else { p[1] - p[0] })
            .collect();
        let eos = samples.iter().filter(|s| !s.truncated).count() as f64;
        vec![
            ("objective/scores".into(), mean(rewards)),
            ("objective/scores_margin".into(), mean(&margins)),
            (
                "val/contain_eos_token".into(),
                eos / samples.len().max(1) as f64,
            ),
        ]
    }
}

impl Algorithm for OnlineDpo<'_> {
    type Unit = PairRollout;

    const CONSOLE: Console = Console {
        step: &[
            LOSS,
            Shown::new("reward", "reward"),
            Shown::new("objective/scores_margin", "margin"),
            Shown::new("rewards/accuracies", "acc"),
            Shown::new("objective/kl", "kl"),
            GRAD_NORM,
        ],
        progress: &[
            Shown::new("reward", "reward"),
            Shown::new("objective/kl", "kl"),
        ],
        eval: &[Shown::new("eval/reward", "reward")],
    };

    fn data_len(&self) -> usize {
        self.train.len()
    }

    fn total_steps(&self) -> u64 {
        self.plan.total_steps as u64
    }

    fn open_logs(&mut self, out_dir: &Path, resumed_at: Option<u64>) -> Result<()> {
        self.logs.open(out_dir, resumed_at)
    }

    fn next_unit(&mut self, cx: UnitContext<'_>) -> Result<PairRollout> {
        let (o, policy, at, times) = (&self.online, cx.policy, cx.at, cx.times);
        let prompts = cx.data.take(self.plan.rollout_prompts);
        let settings = rollout_settings(o, policy, mix(o.args.seed, at.global_step));
        self.rewards.set_trainer_state(at.into());
        let (samples, scores) = generate_and_score(
            Sampler::Policy(&policy.model, None),
            &policy.text,
            self.train,
            &prompts,
            &settings,
            self.rewards,
            times,
        )?;
        let rewards = shaped_rewards(o, &samples, &scores.total);
        let first_chosen = rank_pairs(&rewards);
        let passes = NoGradPasses {
            policy: &policy.model,
            reference: self.reference,
            old: false,
            with_reference: true,
            batch: o.args.per_device_train_batch_size,
            pad_id: policy.pad_id,
            temperature: 1.0,
            share_prompts: true,
        };
        let (_, reference) = no_grad_passes(&passes, self.train, &samples, times)?;
        let reference = reference.expect("the reference pass was asked for");
        let pairs = compute_advantages(&rewards, 2, &o.advantage_config());
        let mut metrics = rollout_metrics(
            &self.logs.names,
            &scores,
            &pairs.group_std,
            pairs.frac_zero_std,
            &samples,
        );
        metrics.extend(Self::pair_metrics(&rewards, &first_chosen, &samples));
        let loss = self.cfg.loss(at.epoch);
        metrics.push(("beta".into(), loss.beta));
        Ok(PairRollout {
            samples,
            first_chosen,
            reference,
            rewards,
            loss,
            scores,
            metrics,
        })
    }

    fn steps(&self, r: &PairRollout) -> Vec<Vec<Vec<usize>>> {
        // One optimiser step; micro-batches of `per_device_train_batch_size` whole pairs.
        let micro = self.online.args.per_device_train_batch_size;
        let idx: Vec<usize> = (0..r.samples.len()).collect();
        vec![idx.chunks(micro).map(<[usize]>::to_vec).collect()]
    }

    fn micro_loss(&self, cx: MicroContext<'_, PairRollout>) -> Result<Option<Tensor>> {
        let (policy, r, mb, stats) = (cx.policy, cx.unit, cx.micro, cx.stats);
        if !mb.len().is_multiple_of(2)
            || mb
                .chunks_exact(2)
                .any(|p| !p[0].is_multiple_of(2) || p[1] != p[0] + 1)
        {
            return Err(TrainerError::Other(format!(
                "online DPO: micro-batch {mb:?} splits a pair"
            )));
        }
        let keep = vec![true; mb.len()];
        let rows = MicroRows {
            samples: &r.samples,
            rows: mb,
            keep: &keep,
            old: None,
            reference: Some(&r.reference),
        };
        let o = ScoreOptions {
            pad_id: policy.pad_id,
            grad: true,
            entropy: false,
            temperature: 1.0,
            share_prompts: true,
        };
        let pass = policy_pass(&policy.model, self.train, &rows, o)?;
        let reference = pass.reference.as_ref().expect("reference rows were given");
        let seq = sequence_logps(&pass.logp, &pass.mask)?;
        let ref_seq = sequence_logps(reference, &pass.mask)?;
        // Positions in the micro-batch of each pair's chosen and rejected completion.
        let (mut ci, mut ri) = (Vec::new(), Vec::new());
        for k in 0..mb.len() / 2 {
            let first = r.first_chosen[mb[2 * k] / 2];
            let (c, rj) = if first {
                (2 * k, 2 * k + 1)
            } else {
                (2 * k + 1, 2 * k)
            };
            ci.push(c as u32);
            ri.push(rj as u32);
        }
        let device = seq.device();
        let pick = |t: &Tensor, i: &[u32]| -> Result<Tensor> {
            Ok(t.index_select(&Tensor::new(i, device)?, 0)?)
        };
        let (pc, pr) = (pick(&seq, &ci)?, pick(&seq, &ri)?);
        let (rc, rr) = (pick(&ref_seq, &ci)?, pick(&ref_seq, &ri)?);
        let out = dpo_loss(&DpoLogps::sums((&pc, &pr), (&rc, &rr)), &r.loss)?;
        let accumulation = self.cfg.args.gradient_accumulation_steps as f64;
        let loss = (out.losses.mean(0)? / accumulation)?;
        let pairs = ci.len() as f64;
        let v = |t: &Tensor| -> Result<Vec<f64>> {
            Ok(t.to_dtype(candle_core::DType::F64)?.to_vec1::<f64>()?)
        };
        let (chosen, rejected) = (v(&out.chosen_rewards)?, v(&out.rejected_rewards)?);
        let d = DpoStats::of(&chosen, &rejected, (&v(&pc.detach())?, &v(&pr.detach())?));
        stats.add("rewards/chosen", d.rewards_chosen, pairs);
        stats.add("rewards/rejected", d.rewards_rejected, pairs);
        stats.add("rewards/accuracies", d.rewards_accuracies, pairs);
        stats.add("rewards/margins", d.rewards_margins, pairs);
        stats.add("logps/chosen", d.logps_chosen, pairs);
        stats.add("logps/rejected", d.logps_rejected, pairs);
        // Per completion: KL sum to the reference, and TRL's entropy estimate -sum log p.
        let (s, rs) = (v(&seq.detach())?, v(&ref_seq)?);
        let n = s.len() as f64;
        let kl: Vec<f64> = s.iter().zip(&rs).map(|(a, b)| a - b).collect();
        let beta = r.loss.beta;
        let rewards: Vec<f64> = mb.iter().map(|&i| r.rewards[i]).collect();
        stats.add("objective/kl", mean(&kl), n);
        stats.add("objective/entropy", -mean(&s), n);
        stats.add("objective/non_score_reward", -beta * mean(&kl), n);
        let rlhf: Vec<f64> = rewards.iter().zip(&kl).map(|(r, k)| r - beta * k).collect();
        stats.add("objective/rlhf_reward", mean(&rlhf), n);
        stats.tokens += pass.num_tokens;
        Ok(Some(loss))
    }

    fn step_metrics(
        &self,
        r: &PairRollout,
        out: &StepOutcome,
        first: bool,
        times: &Metrics,
    ) -> Metrics {
        crate::rollout::logs::online_step_metrics(&r.metrics, out, first, times)
    }

    fn on_logged(&mut self, r: &PairRollout, step: u64, first_of_unit: bool) -> Result<()> {
        if !first_of_unit {
            return Ok(());
        }
        // Both completions of the first few pairs.
        let n = 2 * self.cfg.rollout.num_completions_to_log;
        self.logs
            .log_train(step, self.train, &r.samples, &r.scores, None, 0..n)
    }

    fn evaluate(&mut self, policy: &Policy, at: Position) -> Result<Option<Metrics>> {
        self.logs
            .evaluate(&self.online, policy, self.eval, self.rewards, None, at)
    }
}

/// Runs Online DPO as configured: progress, metrics, samples, checkpoints, the final model and
/// `run_summary.json` under `output_dir`.
pub fn train(cfg: &OnlineDpoConfig, p: &mut Prepared, opts: &RunOptions) -> Result<RunSummary> {
    let mut algo = OnlineDpo {
        cfg,
        online: cfg.online(),
        reference: p.reference.as_ref(),
        train: &p.train,
        eval: &p.eval,
        logs: OnlineLogs::new(p.rewards.names(), cfg.rollout.num_completions_to_log),
        rewards: &mut p.rewards,
        plan: p.plan,
    };
    crate::run::run(cfg, &mut algo, &mut p.policy, opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_rank_by_reward_first_on_ties() {
        assert_eq!(
            rank_pairs(&[1.0, 0.0, 0.0, 1.0, 0.5, 0.5]),
            vec![true, false, true]
        );
    }
}
