//! The DPO trainer: `rlft dpo --config dpo.toml`, on the run core ([`crate::run`]), as TRL
//! 1.16's `DPOTrainer`.
//!
//! A step reads its pairs' reference log-probs (precomputed, or a no-grad pass of the
//! reference over the step's pairs in `next_unit`, phase `ref_logprobs`), then for each
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
use std::sync::Mutex;

use candle_core::{DType, Tensor};
use rlft_model::CausalLm;
use serde_json::{json, Value};

use crate::algo::dpo_loss::{dpo_loss, sequence_logps, DpoLogps, DpoLossConfig, DpoStats};
use crate::config::dpo::DpoConfig;
use crate::data::dpo::DpoPair;
use crate::data::prompts::PromptItem;
use crate::data::DataCursor;
use crate::error::{Result, TrainerError};
use crate::rollout::{score_batch, timed, Sample, ScoreOptions};
use crate::run::{
    offline, Algorithm, Console, Metrics, Policy, Position, RunOptions, RunSummary, Shown,
    StepOutcome, StepStats, GRAD_NORM, LEARNING_RATE, LOSS,
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
        row: Value::Null,
    };
    let sample = |prompt: usize, ids: &[u32]| Sample {
        prompt,
        completion_ids: ids.to_vec(),
        text: String::new(),
        truncated: false,
        sampler_logprobs: None,
    };
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
fn losses(
    cfg: &DpoLossConfig,
    s: &PairLogps,
    refs: &[(f64, f64)],
) -> Result<crate::algo::dpo_loss::DpoLossOutput> {
    let dev = s.chosen.device();
    let t = |f: fn(&(f64, f64)) -> f64| -> Result<Tensor> {
        let v: Vec<f32> = refs.iter().map(|r| f(r) as f32).collect();
        Ok(Tensor::new(v, dev)?)
    };
    let (rc, rr) = (t(|r| r.0)?, t(|r| r.1)?);
    let x = DpoLogps {
        policy_chosen: &s.chosen,
        policy_rejected: &s.rejected,
        ref_chosen: &rc,
        ref_rejected: &rr,
        chosen_lens: Some(&s.chosen_lens),
        rejected_lens: Some(&s.rejected_lens),
    };
    Ok(dpo_loss(&x, cfg)?)
}

/// Pair statistics gathered over a step or an eval pass.
#[derive(Default)]
struct Gathered {
    chosen_rewards: Vec<f64>,
    rejected_rewards: Vec<f64>,
    logps_chosen: Vec<f64>,
    logps_rejected: Vec<f64>,
}

impl Gathered {
    fn add(&mut self, out: &crate::algo::dpo_loss::DpoLossOutput, s: &PairLogps) -> Result<()> {
        let v = |t: &Tensor| -> Result<Vec<f64>> { Ok(t.to_dtype(DType::F64)?.to_vec1()?) };
        self.chosen_rewards.extend(v(&out.chosen_rewards)?);
        self.rejected_rewards.extend(v(&out.rejected_rewards)?);
        self.logps_chosen.extend(v(&s.chosen.detach())?);
        self.logps_rejected.extend(v(&s.rejected.detach())?);
        Ok(())
    }

    fn stats(&self) -> DpoStats {
        DpoStats::of(
            &self.chosen_rewards,
            &self.rejected_rewards,
            (&self.logps_chosen, &self.logps_rejected),
        )
    }
}

/// One optimiser step's micro-batches of pair indices and their reference log-probs.
pub struct DpoUnit {
    micro: Vec<Vec<usize>>,
    refs: HashMap<usize, (f64, f64)>,
}

/// DPO as an [`Algorithm`].
struct Dpo<'a> {
    cfg: &'a DpoConfig,
    loss: DpoLossConfig,
    reference: &'a Reference,
    train: &'a [DpoPair],
    eval: &'a [DpoPair],
    total_steps: u64,
    /// The current step's pair statistics, drained by `step_metrics`.
    step: Mutex<Gathered>,
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

impl Algorithm for Dpo<'_> {
    type Unit = DpoUnit;

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

    fn data_len(&self) -> usize {
        self.train.len()
    }

    fn total_steps(&self) -> u64 {
        self.total_steps
    }

    fn next_unit(
        &mut self,
        policy: &Policy,
        data: &mut DataCursor,
        _at: Position,
        times: &mut Metrics,
    ) -> Result<DpoUnit> {
        let micro = offline::next_step_rows(&self.cfg.args, data);
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
        Ok(DpoUnit {
            micro,
            refs: idx.into_iter().zip(refs).collect(),
        })
    }

    fn steps(&self, unit: &DpoUnit) -> Vec<Vec<Vec<usize>>> {
        vec![unit.micro.clone()]
    }

    fn micro_loss(
        &self,
        policy: &Policy,
        unit: &DpoUnit,
        step: &[Vec<usize>],
        micro: &[usize],
        stats: &mut StepStats,
    ) -> Result<Option<Tensor>> {
        let step_pairs: usize = step.iter().map(Vec::len).sum();
        let pairs: Vec<&DpoPair> = micro.iter().map(|&i| &self.train[i]).collect();
        let s = pair_logps(&policy.model, &pairs, policy.pad_id, true)?;
        let refs: Vec<(f64, f64)> = micro.iter().map(|i| unit.refs[i]).collect();
        let out = losses(&self.loss, &s, &refs)?;
        stats.tokens += s.tokens;
        self.step.lock().expect("not poisoned").add(&out, &s)?;
        Ok(Some((out.losses.sum_all()? / step_pairs.max(1) as f64)?))
    }

    fn step_metrics(
        &self,
        _: &DpoUnit,
        out: &StepOutcome,
        first: bool,
        times: &Metrics,
    ) -> Metrics {
        let g = std::mem::take(&mut *self.step.lock().expect("not poisoned"));
        let mut m: Metrics = vec![
            ("loss".into(), out.loss),
            ("learning_rate".into(), out.lr),
            ("grad_norm".into(), out.grad_norm),
        ];
        m.extend(g.stats().named(""));
        m.push((
            "tokens_per_s".into(),
            out.tokens as f64 / out.seconds.max(1e-9),
        ));
        m.push(("time/update".into(), out.seconds));
        if first {
            m.extend(times.iter().cloned());
        }
        m
    }

    fn evaluate(&mut self, policy: &Policy, _at: Position) -> Result<Option<Metrics>> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let plain = rlft_model::trainable::detached(&policy.model);
        let batch = self.cfg.args.per_device_train_batch_size.max(1);
        let all: Vec<usize> = (0..self.eval.len()).collect();
        let refs = self.refs(policy, self.eval, &all)?;
        let (mut total, mut g) = (0f64, Gathered::default());
        for (chunk, r) in all.chunks(batch).zip(refs.chunks(batch)) {
            let pairs: Vec<&DpoPair> = chunk.iter().map(|&i| &self.eval[i]).collect();
            let s = pair_logps(&plain, &pairs, policy.pad_id, false)?;
            let out = losses(&self.loss, &s, r)?;
            total += out
                .losses
                .to_dtype(DType::F64)?
                .sum_all()?
                .to_scalar::<f64>()?;
            g.add(&out, &s)?;
        }
        let mut m: Metrics = vec![("eval_loss".into(), total / self.eval.len() as f64)];
        m.extend(g.stats().named("eval_"));
        Ok(Some(m))
    }
}

/// Trains with DPO as configured. Prints progress when asked; writes metrics, checkpoints and
/// the final model (with LoRA also the adapter) under `output_dir`.
pub fn train(cfg: &DpoConfig, p: &mut Prepared, opts: &RunOptions) -> Result<RunSummary> {
    let mut algo = Dpo {
        cfg,
        loss: cfg.loss_config(),
        reference: &p.reference,
        train: &p.train,
        eval: &p.eval,
        total_steps: p.total_steps as u64,
        step: Mutex::default(),
    };
    crate::run::run(cfg, &mut algo, &mut p.policy, opts)
}

/// The JSON summary line `rlft dpo` prints at the end.
pub fn summary_json(s: &RunSummary) -> Value {
    json!({
        "global_step": s.global_step,
        "initial_eval_loss": s.initial_metric("eval_loss"),
        "final_eval_loss": s.final_metric("eval_loss"),
        "initial_eval_accuracy": s.initial_metric("eval_rewards/accuracies"),
        "final_eval_accuracy": s.final_metric("eval_rewards/accuracies"),
        "final_eval_margin": s.final_metric("eval_rewards/margins"),
        "last_train_loss": s.step_values("loss").last(),
        "skipped_steps": s.skipped_steps,
        "interrupted": s.interrupted,
        "final_dir": s.final_dir,
    })
}
