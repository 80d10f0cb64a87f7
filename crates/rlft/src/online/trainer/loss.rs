//! The named pieces of an online micro-batch's loss: the policy loss (RLOO's or GRPO's family),
//! PPO's value loss, and the share of the ratio metrics of the rows left out.

use candle_core::Tensor;

use super::{Online, Rollout};
use crate::algo::rloo_loss::{rloo_loss, RlooLossInputs};
use crate::algo::value_loss::{value_loss, ValueLossInputs};
use crate::algo::{
    grpo_loss, Estimator, ImportanceSamplingLevel, LossInputs, LossNormalizer, LossType,
};
use crate::error::Result;
use crate::online::advantages::Advantage;
use crate::online::critic::Critic;
use crate::online::skip::MicroSplit;
use crate::rollout::{pad_rows, PolicyPass, Sample};
use crate::run::StepStats;

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
        let rloo = cfg.estimator.advantage_estimator == Estimator::Rloo;
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
        if cfg.estimator.advantage_estimator == Estimator::Rloo {
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
        let is_weight = match &r.is_weights {
            Some(w) => {
                let w: Vec<&[f32]> = rows.iter().map(|&i| &w[i][..]).collect();
                Some(pad_rows(&w, tc, device)?)
            }
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

    /// PPO's clipped value loss of micro-batch `mb`: `(value, clipfrac, loss tensor)`.
    pub(super) fn value_loss(
        &self,
        critic: &Critic,
        r: &Rollout,
        mb: &[usize],
        mask: &Tensor,
        old: &[Vec<f32>],
        returns: &[Vec<f64>],
    ) -> Result<(f64, f64, Tensor)> {
        let refs: Vec<&Sample> = mb.iter().map(|&i| &r.samples[i]).collect();
        let values = critic.values(self.train, &refs, true)?;
        let (tc, device) = (mask.dim(1)?, mask.device());
        let old: Vec<&[f32]> = mb.iter().map(|&i| &old[i][..]).collect();
        let ret: Vec<Vec<f32>> = mb
            .iter()
            .map(|&i| returns[i].iter().map(|&x| x as f32).collect())
            .collect();
        let ret: Vec<&[f32]> = ret.iter().map(|x| &x[..]).collect();
        let out = value_loss(&ValueLossInputs {
            values: &values,
            old_values: &pad_rows(&old, tc, device)?,
            returns: &pad_rows(&ret, tc, device)?,
            mask,
            clip: Some(self.cfg.estimator.cliprange_value),
            accumulation_steps: self.cfg.args.gradient_accumulation_steps,
        })?;
        let v = out
            .loss
            .to_dtype(candle_core::DType::F64)?
            .to_scalar::<f64>()?;
        Ok((v, out.clipfrac, out.loss))
    }
}
