//! The named pieces of an online micro-batch's loss: the policy loss (RLOO's or GRPO's family),
//! the critic's part (PPO: old values, returns and the value loss), the sampler correction
//! (server rollouts' importance-sampling weights), and the share of the ratio metrics of the
//! rows left out.

use candle_core::{DType, Device, Tensor};

use super::{Online, Rollout};
use crate::algo::is_correction::is_weights;
use crate::algo::rloo_loss::{rloo_loss, RlooLossInputs};
use crate::algo::value_loss::{value_loss, ValueLossInputs};
use crate::algo::{grpo_loss, ImportanceSamplingLevel, LossInputs, LossNormalizer, LossType};
use crate::config::online::OnlineConfig;
use crate::data::prompts::PromptItem;
use crate::error::Result;
use crate::online::advantages::Advantage;
use crate::online::critic::Critic;
use crate::online::skip::MicroSplit;
use crate::rollout::{pad_rows, PolicyPass, Sample};
use crate::run::{Metrics, StepStats};

/// The clip fractions the clipped losses and RLOO's report (TRL's names).
const CLIP_KEYS: [&str; 3] = [
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
];

impl Online<'_> {
    /// Logs the rows of a micro-batch left out (`split`) and gives them their share of the
    /// ratio metrics: 0, since with `A = 0` no ratio counts as clipped or capped, weighted by
    /// their rows or tokens as the loss weighs its own, so those metrics stay fractions of all
    /// the step's rows or tokens. (`entropy` is of the scored rows only.)
    pub(super) fn skipped_stats(&self, r: &Rollout, split: &MicroSplit, stats: &mut StepStats) {
        let cfg = self.cfg;
        stats.count("skipped_zero_adv_rows", split.skipped_rows as f64);
        let vanished = f64::from(u8::from(split.scored.is_empty()));
        stats.count("skipped_zero_adv_micro_batches", vanished);
        let rloo = cfg.loss_type == LossType::Rloo;
        let per_row = rloo
            || (cfg.importance_sampling_level == ImportanceSamplingLevel::Sequence
                && matches!(r.advantages, Advantage::PerSequence(_)));
        let w = if per_row {
            split.skipped_rows as f64
        } else {
            split.skipped_tokens
        };
        if rloo || cfg.loss_type.is_clipped_surrogate() {
            for key in CLIP_KEYS {
                stats.add(key, 0.0, w);
            }
        } else if cfg.loss_type == LossType::Cispo {
            stats.add("cispo_clip_ratio", 0.0, w);
        }
    }

    /// The policy loss of the scored rows of a micro-batch (RLOO's or [`grpo_loss`]), its
    /// ratio metrics to `stats`; `norm` says what the whole micro-batch and step hold.
    pub(super) fn policy_loss(
        &self,
        r: &Rollout,
        rows: &[usize],
        pass: &PolicyPass,
        norm: LossNormalizer,
        stats: &mut StepStats,
    ) -> Result<Tensor> {
        let cfg = self.cfg;
        let (tc, device) = (pass.mask.dim(1)?, pass.mask.device());
        let adv = r.advantages.tensor(rows, tc, device)?;
        if cfg.loss_type == LossType::Rloo {
            // TRL's RLOOTrainer has no sampler correction; the weights go to the GRPO loss only.
            let out = rloo_loss(&RlooLossInputs {
                logp: &pass.logp,
                old_logp: pass.old.as_ref(),
                advantages: &adv,
                mask: &pass.mask,
                epsilon_low: cfg.epsilon,
                epsilon_high: cfg.epsilon_high(),
                accumulation_steps: norm.accumulation_steps,
                micro_batch_rows: norm.micro_batch.map(|m| m.rows),
            })?;
            let n = rows.len() as f64;
            stats.add(CLIP_KEYS[0], out.clip_low, n);
            stats.add(CLIP_KEYS[1], out.clip_high, n);
            stats.add(CLIP_KEYS[2], out.clip_low + out.clip_high, n);
            return Ok(out.loss);
        }
        let is_weight = match &r.correction {
            Some(c) => Some(c.rows(rows, tc, device)?),
            None => None,
        };
        let inputs = LossInputs {
            logp: &pass.logp,
            old_logp: pass.old.as_ref(),
            ref_logp: pass.reference.as_ref(),
            advantages: &adv,
            mask: &pass.mask,
            entropies: pass.entropies.as_ref(),
            is_weight: is_weight.as_ref(),
            normalizer: norm,
        };
        let out = grpo_loss(&inputs, &cfg.loss_config())?;
        let (ntok, nratio) = (out.stats.tokens, out.stats.ratio_count);
        if let Some(c) = out.stats.clip {
            stats.add(CLIP_KEYS[0], c.low, nratio);
            stats.add(CLIP_KEYS[1], c.high, nratio);
            stats.add(CLIP_KEYS[2], c.region, nratio);
        }
        if let Some(c) = out.stats.cispo_clip_ratio {
            stats.add("cispo_clip_ratio", c, nratio);
        }
        if let Some(kl) = out.stats.kl {
            stats.add("kl", kl, ntok);
        }
        Ok(out.loss)
    }
}

/// PPO's part of a rollout: the critic's values at rollout time and the returns it regresses
/// on; its loss is the clipped value loss (TRL `PPOTrainer`: `pg_loss + vf_coef * vf_loss`).
pub(super) struct CriticPart {
    /// `[N][T_i]` the critic's values when the rollout was made.
    pub old_values: Vec<Vec<f32>>,
    /// `[N][T_i]` the returns (GAE advantages plus the old values).
    pub returns: Vec<Vec<f64>>,
}

impl CriticPart {
    /// `vf_coef` times the clipped value loss of the scored `rows` (`mask`: the policy pass's
    /// `[rows, Tc]` completion mask, `ntok` its tokens); the loss before the accumulation
    /// scaling and the clip fraction go to `stats` (`value_loss`, `vf_clipfrac`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn loss(
        &self,
        critic: &Critic,
        cfg: &OnlineConfig,
        train: &[PromptItem],
        samples: &[Sample],
        rows: &[usize],
        mask: &Tensor,
        ntok: f64,
        stats: &mut StepStats,
    ) -> Result<Tensor> {
        let refs: Vec<&Sample> = rows.iter().map(|&i| &samples[i]).collect();
        let values = critic.values(train, &refs, true)?;
        let (tc, device) = (mask.dim(1)?, mask.device());
        let old: Vec<&[f32]> = rows.iter().map(|&i| &self.old_values[i][..]).collect();
        let ret: Vec<Vec<f32>> = rows
            .iter()
            .map(|&i| self.returns[i].iter().map(|&x| x as f32).collect())
            .collect();
        let ret: Vec<&[f32]> = ret.iter().map(|x| &x[..]).collect();
        let k = cfg.args.gradient_accumulation_steps;
        let out = value_loss(&ValueLossInputs {
            values: &values,
            old_values: &pad_rows(&old, tc, device)?,
            returns: &pad_rows(&ret, tc, device)?,
            mask,
            clip: Some(cfg.estimator.cliprange_value),
            accumulation_steps: k,
        })?;
        let v = out.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        // Logged per micro-batch, before the accumulation scaling.
        stats.add("value_loss", v * k as f64, ntok);
        stats.add("vf_clipfrac", out.clipfrac, ntok);
        Ok(out.loss.affine(cfg.estimator.vf_coef, 0.0)?)
    }
}

/// Server rollouts' sampler correction (`rollout_is`): the importance-sampling weights of every
/// sample's tokens, the trainer's log-probs over the servers' (verl's rollout correction, TRL's
/// `vllm_importance_sampling_correction`).
pub(super) struct SamplerCorrection {
    /// `[N][T_i]` the weights.
    weights: Vec<Vec<f32>>,
}

impl SamplerCorrection {
    /// The correction of a rollout whose samples came from servers with it on (`old`: the
    /// trainer's own log-probs of them), and its metrics; `None` when it is off.
    pub(super) fn of(
        cfg: &OnlineConfig,
        samples: &[Sample],
        old: Option<&[Vec<f32>]>,
    ) -> (Option<Self>, Metrics) {
        let (Some(c), Some(old)) = (cfg.servers.correction(), old) else {
            return (None, Metrics::new());
        };
        let keep: Vec<bool> = samples.iter().map(|s| cfg.in_loss(s.truncated)).collect();
        // A sample without the sampler's log-probs (cannot happen on servers): NaN, no correction.
        let sampler: Vec<Vec<f32>> = samples
            .iter()
            .map(|s| {
                s.sampler_logprobs
                    .clone()
                    .unwrap_or_else(|| vec![f32::NAN; s.completion_ids.len()])
            })
            .collect();
        let (weights, stats) = is_weights(old, &sampler, &keep, &c);
        (Some(SamplerCorrection { weights }), stats.metrics())
    }

    /// `[rows, tc]` the weights of `rows`, zero-padded.
    pub(super) fn rows(&self, rows: &[usize], tc: usize, device: &Device) -> Result<Tensor> {
        let w: Vec<&[f32]> = rows.iter().map(|&i| &self.weights[i][..]).collect();
        pad_rows(&w, tc, device)
    }
}
