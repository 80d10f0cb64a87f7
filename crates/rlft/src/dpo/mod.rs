//! The DPO trainer: `rlft dpo --config dpo.toml`, on the run core ([`crate::run`]), as TRL
//! 1.16's `DPOTrainer`.
//!
//! A step reads its pairs' reference log-probs (precomputed, or a no-grad pass of the
//! reference over the step's pairs in `prepare`, phase `ref_logprobs`), then for each
//! micro-batch scores the chosen and rejected completions with the policy in one pass in which
//! each pair's prompt runs once and both completions attend to its keys and values
//! ([`crate::rollout::score_batch`] with shared prompts, as GRPO's groups; TRL runs the
//! concatenated `[chosen; rejected]` rows, prompt twice), sums each completion's token
//! log-probs ([`crate::algo::dpo_loss::sequence_logps`]) and adds the DPO loss of its pairs
//! ([`crate::algo::dpo_loss::dpo_loss`]). The sum over a micro-batch is divided by the pairs of
//! the whole optimiser step, so batch 8 x accumulation 1 equals 4 x 2 (TRL's mean per
//! micro-batch over equal micro-batches; for the batch-coupled `aot*` and `sft` losses each
//! micro-batch is its own batch, as in TRL).
//!
//! The reference: with LoRA the policy with its adapters off (no second copy); with full
//! fine-tuning a frozen copy of the starting weights; with `precompute_ref_log_probs` neither
//! stays in memory.
//!
//! Metrics (TRL's names): `loss`, `rewards/chosen`, `rewards/rejected`, `rewards/accuracies`,
//! `rewards/margins`, `logps/chosen`, `logps/rejected`, and the same with `eval_` on the eval
//! pairs. Where TRL averages per-micro-batch values over the logging window, rlft logs each
//! step's values over all of its pairs. TRL's `entropy`, `logits/*` and `mean_token_accuracy`
//! are not logged.

mod setup;

use std::collections::HashMap;

use candle_core::{DType, Tensor};
use rlft_model::CausalLm;
use serde_json::Value;

use crate::algo::dpo_loss::{dpo_loss, sequence_logps, DpoLogps, DpoLossConfig, DpoLossOutput};
use crate::config::dpo::DpoConfig;
use crate::data::dpo::DpoPair;
use crate::data::prompts::PromptItem;
use crate::error::{Result, TrainerError};
use crate::rollout::{score_batch, timed, Sample, ScoreOptions};
use crate::run::offline::{self, OfflineAlgorithm, OfflineStep};
use crate::run::{
    Console, Metrics, MicroContext, Policy, RunOptions, RunSummary, Shown, StepStats, GRAD_NORM,
    LEARNING_RATE, LOSS,
};
pub use setup::{prepare, Prepared};

/// Where the reference log-probs come from.
pub enum Reference {
    /// The policy with its LoRA adapters off.
    AdaptersOff,
    /// A frozen copy of the starting weights (full fine-tuning).
    Frozen(Box<CausalLm>),
    /// Computed before training and stored in the pairs.
    Precomputed,
}

impl Reference {
    /// The reference model beside `policy` (not for [`Reference::Precomputed`], which needs
    /// none; it gets the policy detached).
    pub fn model(&self, policy: &CausalLm) -> CausalLm {
        match self {
            Reference::AdaptersOff => rlft_model::trainable::detached(policy).adapters_disabled(),
            Reference::Frozen(m) => CausalLm::clone(m),
            Reference::Precomputed => rlft_model::trainable::detached(policy),
        }
    }

    /// What it is, for the start-up line.
    pub fn describe(&self) -> &'static str {
        match self {
            Reference::AdaptersOff => "the base (adapters off, no second copy)",
            Reference::Frozen(_) => "a frozen copy of the starting weights",
            Reference::Precomputed => "precomputed log-probs",
        }
    }
}

/// Summed completion log-probs of pairs under one model.
pub struct PairLogps {
    /// `[n]` chosen completions' log-probs (f32; differentiable when asked).
    pub chosen: Tensor,
    /// `[n]` rejected completions' log-probs.
    pub rejected: Tensor,
    /// `[n]` chosen completion lengths (f32).
    pub chosen_lens: Tensor,
    /// `[n]` rejected completion lengths (f32).
    pub rejected_lens: Tensor,
    /// Input tokens computed (padding excluded; each shared prompt once).
    pub tokens: usize,
}

/// Scores the chosen and rejected completions of `pairs` under `model` in one pass: each
/// pair's prompt runs once (both completions attend to it) unless `keep_end` truncation left
/// the two sides different contexts.
pub fn pair_logps(
    model: &CausalLm,
    pairs: &[&DpoPair],
    pad_id: u32,
    grad: bool,
) -> Result<PairLogps> {
    let n = pairs.len();
    let mut items = Vec::with_capacity(n);
    let item = |ids: &[u32]| PromptItem {
        row_index: 0,
        ids: ids.to_vec(),
        text: String::new(),
        messages: Vec::new(),
        row: Value::Null,
    };
    let sample =
        |prompt: usize, ids: &[u32]| Sample::new(prompt, ids.to_vec(), String::new(), false);
    let (mut chosen, mut rejected) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for p in pairs {
        items.push(item(&p.prompt_ids));
        chosen.push(sample(items.len() - 1, &p.chosen_ids));
        if let Some(rp) = &p.rejected_prompt_ids {
            items.push(item(rp));
        }
        rejected.push(sample(items.len() - 1, &p.rejected_ids));
    }
    let samples: Vec<&Sample> = chosen.iter().chain(&rejected).collect();
    let o = ScoreOptions {
        pad_id,
        grad,
        entropy: false,
        temperature: 1.0,
        share_prompts: true,
    };
    let sb = score_batch(model, &items, &samples, o)?;
    let logps = sequence_logps(&sb.logprobs, &sb.mask)?;
    let lens = |r: std::ops::Range<usize>| -> Result<Tensor> {
        let v: Vec<f32> = sb.lens[r].iter().map(|&l| l as f32).collect();
        Ok(Tensor::new(v, model.device())?)
    };
    Ok(PairLogps {
        chosen: logps.narrow(0, 0, n)?,
        rejected: logps.narrow(0, n, n)?,
        chosen_lens: lens(0..n)?,
        rejected_lens: lens(n..2 * n)?,
        tokens: sb.num_tokens,
    })
}

/// The reference log-probs `(chosen, rejected)` of `pairs[i]` for each `i` of `idx`, `batch`
/// pairs per no-grad pass.
pub fn reference_logps(
    reference: &CausalLm,
    pairs: &[DpoPair],
    idx: &[usize],
    batch: usize,
    pad_id: u32,
) -> Result<Vec<(f64, f64)>> {
    let mut out = Vec::with_capacity(idx.len());
    for chunk in idx.chunks(batch.max(1)) {
        let ps: Vec<&DpoPair> = chunk.iter().map(|&i| &pairs[i]).collect();
        let l = pair_logps(reference, &ps, pad_id, false)?;
        let v = |t: &Tensor| -> Result<Vec<f64>> { Ok(t.to_dtype(DType::F64)?.to_vec1()?) };
        out.extend(v(&l.chosen)?.into_iter().zip(v(&l.rejected)?));
    }
    Ok(out)
}

/// The DPO loss of `pairs` scored as `s`, with their reference log-probs `refs`.
fn losses(cfg: &DpoLossConfig, s: &PairLogps, refs: &[(f64, f64)]) -> Result<DpoLossOutput> {
    let dev = s.chosen.device();
    let t = |f: fn(&(f64, f64)) -> f64| -> Result<Tensor> {
        let v: Vec<f32> = refs.iter().map(|r| f(r) as f32).collect();
        Ok(Tensor::new(v, dev)?)
    };
    let (rc, rr) = (t(|r| r.0)?, t(|r| r.1)?);
    let x = DpoLogps::sums((&s.chosen, &s.rejected), (&rc, &rr));
    let x = x.with_lens(&s.chosen_lens, &s.rejected_lens);
    Ok(dpo_loss(&x, cfg)?)
}

/// Adds each pair's TRL statistics (`rewards/*`, `logps/*`) to `stats` with weight 1, so that
/// the means are over the pairs of the step (or eval pass), as
/// [`DpoStats`](crate::algo::dpo_loss::DpoStats) names them.
fn add_pair_stats(stats: &mut StepStats, out: &DpoLossOutput, s: &PairLogps) -> Result<()> {
    let v = |t: &Tensor| -> Result<Vec<f64>> { Ok(t.to_dtype(DType::F64)?.to_vec1()?) };
    let (chosen, rejected) = (v(&out.chosen_rewards)?, v(&out.rejected_rewards)?);
    let (lc, lr) = (v(&s.chosen.detach())?, v(&s.rejected.detach())?);
    for (((&c, &r), lc), lr) in chosen.iter().zip(&rejected).zip(lc).zip(lr) {
        stats.add("rewards/chosen", c, 1.0);
        stats.add("rewards/rejected", r, 1.0);
        stats.add("rewards/accuracies", f64::from(u8::from(c > r)), 1.0);
        stats.add("rewards/margins", c - r, 1.0);
        stats.add("logps/chosen", lc, 1.0);
        stats.add("logps/rejected", lr, 1.0);
    }
    Ok(())
}

/// DPO as an [`OfflineAlgorithm`]: a step is micro-batches of pairs, with the reference
/// log-probs of its pairs.
struct Dpo<'a> {
    cfg: &'a DpoConfig,
    loss: DpoLossConfig,
    reference: &'a Reference,
    train: &'a [DpoPair],
    eval: &'a [DpoPair],
}

impl Dpo<'_> {
    /// Reference log-probs of `idx` (precomputed, or a pass of the reference model).
    fn refs(&self, policy: &Policy, pairs: &[DpoPair], idx: &[usize]) -> Result<Vec<(f64, f64)>> {
        if let Reference::Precomputed = self.reference {
            return idx
                .iter()
                .map(|&i| {
                    pairs[i].ref_logps.ok_or_else(|| {
                        TrainerError::Other(format!("pair {i} has no precomputed reference"))
                    })
                })
                .collect();
        }
        let m = self.reference.model(&policy.model);
        let batch = self.cfg.args.per_device_train_batch_size;
        reference_logps(&m, pairs, idx, batch, policy.pad_id)
    }
}

impl OfflineAlgorithm for Dpo<'_> {
    /// The reference log-probs (chosen, rejected) of the step's pairs, by pair index.
    type Extra = HashMap<usize, (f64, f64)>;

    const CONSOLE: Console = Console {
        step: &[
            LOSS,
            Shown::new("rewards/accuracies", "acc"),
            Shown::new("rewards/margins", "margin"),
            Shown::new("rewards/chosen", "chosen"),
            Shown::new("rewards/rejected", "rejected"),
            GRAD_NORM,
            LEARNING_RATE,
        ],
        progress: &[LOSS, Shown::new("rewards/accuracies", "acc")],
        eval: &[
            Shown::new("eval_loss", "loss"),
            Shown::new("eval_rewards/accuracies", "accuracy"),
            Shown::new("eval_rewards/margins", "margin"),
        ],
    };

    fn prepare(
        &mut self,
        policy: &Policy,
        micro: &[Vec<usize>],
        times: &mut Metrics,
    ) -> Result<Self::Extra> {
        let mut idx: Vec<usize> = micro.iter().flatten().copied().collect();
        idx.sort_unstable();
        idx.dedup();
        let refs = if matches!(self.reference, Reference::Precomputed) {
            self.refs(policy, self.train, &idx)?
        } else {
            timed(times, "ref_logprobs", || {
                rlft_kernels::pool::on_pool_for(policy.model.device(), || {
                    self.refs(policy, self.train, &idx)
                })
            })?
        };
        Ok(idx.into_iter().zip(refs).collect())
    }

    fn micro_loss(&self, cx: MicroContext<'_, OfflineStep<Self::Extra>>) -> Result<Tensor> {
        let (policy, step, micro, stats) = (cx.policy, cx.unit, cx.micro, cx.stats);
        let pairs: Vec<&DpoPair> = micro.iter().map(|&i| &self.train[i]).collect();
        let s = pair_logps(&policy.model, &pairs, policy.pad_id, true)?;
        let refs: Vec<(f64, f64)> = micro.iter().map(|i| step.extra[i]).collect();
        let out = losses(&self.loss, &s, &refs)?;
        stats.tokens += s.tokens;
        add_pair_stats(stats, &out, &s)?;
        Ok((out.losses.sum_all()? / step.rows().max(1) as f64)?)
    }

    fn evaluate(&mut self, policy: &Policy) -> Result<Option<Metrics>> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let plain = rlft_model::trainable::detached(&policy.model);
        let batch = self.cfg.args.per_device_train_batch_size.max(1);
        let all: Vec<usize> = (0..self.eval.len()).collect();
        let refs = self.refs(policy, self.eval, &all)?;
        let (mut total, mut stats) = (0f64, StepStats::default());
        for (chunk, r) in all.chunks(batch).zip(refs.chunks(batch)) {
            let pairs: Vec<&DpoPair> = chunk.iter().map(|&i| &self.eval[i]).collect();
            let s = pair_logps(&plain, &pairs, policy.pad_id, false)?;
            let out = losses(&self.loss, &s, r)?;
            total += out
                .losses
                .to_dtype(DType::F64)?
                .sum_all()?
                .to_scalar::<f64>()?;
            add_pair_stats(&mut stats, &out, &s)?;
        }
        let mut m: Metrics = vec![("eval_loss".into(), total / self.eval.len() as f64)];
        m.extend(stats.means().map(|(k, v)| (format!("eval_{k}"), v)));
        Ok(Some(m))
    }
}

/// Trains with DPO as configured. Prints progress when asked; writes metrics, checkpoints and
/// the final model (with LoRA also the adapter) under `output_dir`.
pub fn train(cfg: &DpoConfig, p: &mut Prepared, opts: &RunOptions) -> Result<RunSummary> {
    let algo = Dpo {
        cfg,
        loss: cfg.loss_config(),
        reference: &p.reference,
        train: &p.train,
        eval: &p.eval,
    };
    let steps = (p.train.len(), p.total_steps);
    offline::run(cfg, algo, steps, &mut p.policy, opts)
}
