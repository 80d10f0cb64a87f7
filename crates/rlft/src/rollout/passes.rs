//! Log-prob passes over rollout samples: the no-grad passes of a rollout (old policy,
//! reference) and the policy's pass with grad for one micro-batch, on shared-prompt batches
//! (each prompt once, its completions attending to its keys and values) or plain rows.

use candle_core::{DType, Device, Tensor};
use rlft_model::decoder::{Batch, CausalLm};
use rlft_model::shared_prefix::{shared_prefix_batch, shared_prefix_logprobs};
use rlft_model::trainable::sequence_logprobs_entropy;

use super::{timed, Sample};
use crate::data::prompts::PromptItem;
use crate::error::Result;
use crate::run::Metrics;

/// Prompt + completion rows as one batch whose last `Tc` positions predict the completion
/// tokens: prompts left-padded to the longest, completions right-padded to `Tc` (the longest
/// completion; padding after the real tokens is never attended to by them).
#[derive(Debug)]
pub struct TokenBatch {
    /// `[n, P + Tc - 1]` inputs.
    pub batch: Batch,
    /// `[n, Tc]` u32 completion tokens (pad id past each completion's end).
    pub targets: Tensor,
    /// `[n, Tc]` f32: 1 on completion tokens, 0 on padding.
    pub mask: Tensor,
    /// Completion lengths.
    pub lens: Vec<usize>,
    /// Input tokens that are not padding.
    pub num_tokens: usize,
}

/// Builds a [`TokenBatch`]; every completion must have at least one token.
pub fn token_batch(
    prompts: &[&[u32]],
    completions: &[&[u32]],
    pad_id: u32,
    device: &Device,
) -> Result<TokenBatch> {
    let p = prompts.iter().map(|x| x.len()).max().unwrap_or(0);
    let tc = completions.iter().map(|c| c.len()).max().unwrap_or(0);
    if tc == 0 || p == 0 {
        return Err(crate::error::TrainerError::Other(
            "token_batch: empty prompt or completion".into(),
        ));
    }
    let n = prompts.len();
    let mut rows = Vec::with_capacity(n);
    let mut pads = Vec::with_capacity(n);
    let mut targets = Vec::with_capacity(n * tc);
    let mut mask = Vec::with_capacity(n * tc);
    let mut num_tokens = 0;
    for (pr, c) in prompts.iter().zip(completions) {
        let mut padded = c.to_vec();
        padded.resize(tc, pad_id);
        let mut row = pr.to_vec();
        row.extend_from_slice(&padded[..tc - 1]);
        num_tokens += pr.len() + c.len().saturating_sub(1);
        pads.push(p - pr.len());
        rows.push(row);
        targets.extend_from_slice(&padded);
        mask.extend((0..tc).map(|j| if j < c.len() { 1f32 } else { 0.0 }));
    }
    Ok(TokenBatch {
        batch: Batch::left_padded(&rows, &pads, 0, pad_id, device)?,
        targets: Tensor::from_vec(targets, (n, tc), device)?,
        mask: Tensor::from_vec(mask, (n, tc), device)?,
        lens: completions.iter().map(|c| c.len()).collect(),
        num_tokens,
    })
}

/// Per-token log-probs `[n, Tc]` (f32) of the batch's completion tokens under `model` at the
/// sampling `temperature` (as TRL computes them), and with `entropy` the detached per-token
/// entropies.
pub fn completion_logprobs(
    model: &CausalLm,
    tb: &TokenBatch,
    grad: bool,
    entropy: bool,
    temperature: f64,
) -> Result<(Tensor, Option<Tensor>)> {
    let (lp, ent) =
        sequence_logprobs_entropy(model, &tb.batch, &tb.targets, grad, entropy, temperature)?;
    let lp = lp.to_dtype(DType::F32)?;
    let ent = match ent {
        Some(e) => Some(e.to_dtype(DType::F32)?),
        None => None,
    };
    Ok((lp, ent))
}

/// Log-probs of a set of samples' completion tokens.
pub struct ScoredBatch {
    /// `[n, Tc]` per-token log-probs (f32).
    pub logprobs: Tensor,
    /// `[n, Tc]` detached entropies, when asked for.
    pub entropy: Option<Tensor>,
    /// `[n, Tc]` f32: 1 on completion tokens.
    pub mask: Tensor,
    /// Completion lengths.
    pub lens: Vec<usize>,
    /// Input tokens computed (padding excluded).
    pub num_tokens: usize,
}

/// How [`score_batch`] computes.
#[derive(Debug, Clone, Copy)]
pub struct ScoreOptions {
    /// Padding id.
    pub pad_id: u32,
    /// Differentiable (policy) or not (old policy, reference).
    pub grad: bool,
    /// Also the per-token entropies (detached).
    pub entropy: bool,
    /// Sampling temperature the log-probs are taken at.
    pub temperature: f64,
    /// One prompt pass per distinct prompt (see [`score_batch`]).
    pub share_prompts: bool,
}

/// Per-token log-probs of `samples` (completions of `items`) under `model`, at the sampling
/// temperature. With `share_prompts` each distinct prompt runs once and its completions attend
/// to its keys/values ([`rlft_model::shared_prefix`]); the result (and its gradients) equal the
/// unshared `prompt + completion` rows.
pub fn score_batch(
    model: &CausalLm,
    items: &[PromptItem],
    samples: &[&Sample],
    o: ScoreOptions,
) -> Result<ScoredBatch> {
    let ScoreOptions {
        pad_id,
        grad,
        entropy,
        temperature,
        share_prompts,
    } = o;
    let comps: Vec<&[u32]> = samples.iter().map(|s| &s.completion_ids[..]).collect();
    let device = model.device();
    if share_prompts {
        // Completions of one prompt share its pass; an environment's episodes may each have
        // their own first prompt, so prompts are told apart by their ids.
        let mut prompts: Vec<&[u32]> = Vec::new();
        let mut group = Vec::with_capacity(samples.len());
        for s in samples {
            let ids = &s.prompt_item(items).ids[..];
            let g = match prompts.iter().position(|&u| u == ids) {
                Some(g) => g,
                None => {
                    prompts.push(ids);
                    prompts.len() - 1
                }
            };
            group.push(g);
        }
        let sb = shared_prefix_batch(&prompts, &comps, &group, pad_id, device)?;
        let (lp, ent) = shared_prefix_logprobs(model, &sb, grad, entropy, temperature)?;
        return Ok(ScoredBatch {
            logprobs: lp.to_dtype(DType::F32)?,
            entropy: ent.map(|e| e.to_dtype(DType::F32)).transpose()?,
            mask: sb.mask,
            lens: sb.lens,
            num_tokens: sb.num_tokens,
        });
    }
    let prompts: Vec<&[u32]> = samples
        .iter()
        .map(|s| &s.prompt_item(items).ids[..])
        .collect();
    let tb = token_batch(&prompts, &comps, pad_id, device)?;
    let (lp, ent) = completion_logprobs(model, &tb, grad, entropy, temperature)?;
    Ok(ScoredBatch {
        logprobs: lp,
        entropy: ent,
        mask: tb.mask,
        lens: tb.lens,
        num_tokens: tb.num_tokens,
    })
}

/// Log-probs of every sample's completion tokens without gradients, `batch_size` rows at a
/// time: one `Vec` per sample, of its completion length.
pub fn logprobs_no_grad(
    model: &CausalLm,
    items: &[PromptItem],
    samples: &[Sample],
    batch_size: usize,
    pad_id: u32,
    temperature: f64,
    share_prompts: bool,
) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::with_capacity(samples.len());
    for chunk in samples.chunks(batch_size.max(1)) {
        let refs: Vec<&Sample> = chunk.iter().collect();
        let o = ScoreOptions {
            pad_id,
            grad: false,
            entropy: false,
            temperature,
            share_prompts,
        };
        let sb = score_batch(model, items, &refs, o)?;
        let rows: Vec<Vec<f32>> = sb.logprobs.to_vec2()?;
        for (r, len) in rows.into_iter().zip(&sb.lens) {
            out.push(r[..*len].to_vec());
        }
    }
    Ok(out)
}

/// Stacks per-sample vectors into `[n, tc]`, zero-padded.
pub fn pad_rows(rows: &[&[f32]], tc: usize, device: &Device) -> Result<Tensor> {
    let mut v = Vec::with_capacity(rows.len() * tc);
    for r in rows {
        v.extend_from_slice(&r[..r.len().min(tc)]);
        v.extend(std::iter::repeat_n(0f32, tc - r.len().min(tc)));
    }
    Ok(Tensor::from_vec(v, (rows.len(), tc), device)?)
}

/// The no-grad log-prob passes of a rollout's samples that a clipped loss with a KL term needs.
pub struct NoGradPasses<'a> {
    /// The policy being trained.
    pub policy: &'a CausalLm,
    /// A frozen reference copy (full fine-tuning); `None` with LoRA: the policy with its
    /// adapters off is the reference.
    pub reference: Option<&'a CausalLm>,
    /// Keep the sampling policy's log-probs (a rollout feeds several optimiser steps).
    pub old: bool,
    /// Compute the reference's log-probs (`beta > 0`).
    pub with_reference: bool,
    /// Rows per pass.
    pub batch: usize,
    /// Padding id.
    pub pad_id: u32,
    /// Sampling temperature (log-probs of `logits / T`, as sampled).
    pub temperature: f64,
    /// One prompt pass per group.
    pub share_prompts: bool,
}

/// Per-sample token log-probs `(old, reference)`, each when asked for (phases `old_logprobs`
/// and `ref_logprobs`). They run on the thread pool with its workers spinning.
#[allow(clippy::type_complexity)]
pub fn no_grad_passes(
    p: &NoGradPasses<'_>,
    items: &[PromptItem],
    samples: &[Sample],
    times: &mut Metrics,
) -> Result<(Option<Vec<Vec<f32>>>, Option<Vec<Vec<f32>>>)> {
    let device = p.policy.device();
    let pass = |m: &CausalLm| {
        rlft_kernels::pool::on_pool_for(device, || {
            logprobs_no_grad(
                m,
                items,
                samples,
                p.batch,
                p.pad_id,
                p.temperature,
                p.share_prompts,
            )
        })
    };
    let old = if p.old {
        Some(timed(times, "old_logprobs", || {
            pass(&rlft_model::trainable::detached(p.policy))
        })?)
    } else {
        None
    };
    let reference = if p.with_reference {
        Some(timed(times, "ref_logprobs", || {
            let m = match p.reference {
                Some(r) => r.clone(),
                None => rlft_model::trainable::detached(p.policy).adapters_disabled(),
            };
            pass(&m)
        })?)
    } else {
        None
    };
    Ok((old, reference))
}

/// A micro-batch of rollout samples scored by the policy with a graph: what every
/// policy-gradient loss of the online trainers takes.
pub struct PolicyPass {
    /// `[n, Tc]` per-token log-probs (differentiable).
    pub logp: Tensor,
    /// `[n, Tc]` 1 on completion tokens that count (padding, masked rows and tool answers 0).
    pub mask: Tensor,
    /// `[n, Tc]` old-policy log-probs of the rows, when the rollout kept them.
    pub old: Option<Tensor>,
    /// `[n, Tc]` reference log-probs of the rows, when the rollout has them.
    pub reference: Option<Tensor>,
    /// Mean token entropy over `mask` (None without counted tokens).
    pub entropy: Option<f64>,
    /// `[n, Tc]` per-token entropies (detached), when asked for: what an entropy mask
    /// (`top_entropy_quantile`) selects tokens by.
    pub entropies: Option<Tensor>,
    /// Input tokens that are not padding.
    pub num_tokens: usize,
}

/// The rows of a rollout a micro-batch reads.
pub struct MicroRows<'a> {
    /// The rollout's samples.
    pub samples: &'a [Sample],
    /// The micro-batch: indices into `samples`.
    pub rows: &'a [usize],
    /// Per row: whether its tokens count (e.g. not a truncated completion under DAPO's mask).
    pub keep: &'a [bool],
    /// Old-policy log-probs of every sample (no grad), when kept.
    pub old: Option<&'a [Vec<f32>]>,
    /// Reference log-probs of every sample (no grad), when computed.
    pub reference: Option<&'a [Vec<f32>]>,
}

/// Scores micro-batch `m` with the policy (graph, entropy), masks rows not kept and the tool
/// answers inside completions, and pads the old and reference log-probs to the batch's
/// completion length.
pub fn policy_pass(
    model: &CausalLm,
    items: &[PromptItem],
    m: &MicroRows<'_>,
    opts: ScoreOptions,
) -> Result<PolicyPass> {
    let device = model.device();
    let refs: Vec<&Sample> = m.rows.iter().map(|&i| &m.samples[i]).collect();
    let sb = score_batch(model, items, &refs, opts)?;
    let tc = sb.mask.dim(1)?;
    // Rows not kept count no token; tool answers and observations inside a completion count
    // none either.
    let mut counted = Vec::with_capacity(refs.len() * tc);
    for (s, &keep) in refs.iter().zip(m.keep) {
        let sampled = |j: usize| {
            s.turns
                .as_ref()
                .is_none_or(|t| t.mask.get(j) == Some(&true))
        };
        counted.extend((0..tc).map(|j| f32::from(u8::from(keep && sampled(j)))));
    }
    let mask = (&sb.mask * Tensor::from_vec(counted, (refs.len(), tc), device)?)?;
    let pad = |v: Option<&[Vec<f32>]>| -> Result<Option<Tensor>> {
        v.map(|v| {
            let rows: Vec<&[f32]> = m.rows.iter().map(|&i| &v[i][..]).collect();
            pad_rows(&rows, tc, device)
        })
        .transpose()
    };
    let entropy = match &sb.entropy {
        Some(e) => {
            let w = mask.to_dtype(e.dtype())?;
            let s = (e * &w)?.sum_all()?.to_scalar::<f32>()? as f64;
            let c = w.sum_all()?.to_scalar::<f32>()? as f64;
            (c > 0.0).then(|| s / c)
        }
        None => None,
    };
    Ok(PolicyPass {
        logp: sb.logprobs,
        old: pad(m.old)?,
        reference: pad(m.reference)?,
        mask,
        entropy,
        entropies: sb.entropy,
        num_tokens: sb.num_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlft_model::config::Family;
    use rlft_model::tiny::{random_model, tiny_config};

    #[test]
    fn token_batch_logprobs_equal_single_rows() {
        let m = random_model(tiny_config(Family::Qwen2), 3, DType::F32, &Device::Cpu).unwrap();
        let prompts: Vec<Vec<u32>> = vec![vec![5, 6, 7, 8], vec![9, 10]];
        let comps: Vec<Vec<u32>> = vec![vec![11, 12], vec![13, 14, 15, 16]];
        let pr: Vec<&[u32]> = prompts.iter().map(|x| &x[..]).collect();
        let co: Vec<&[u32]> = comps.iter().map(|x| &x[..]).collect();
        let tb = token_batch(&pr, &co, 0, &Device::Cpu).unwrap();
        let (lp, ent) = completion_logprobs(&m, &tb, false, true, 1.0).unwrap();
        let lp: Vec<Vec<f32>> = lp.to_vec2().unwrap();
        assert!(ent.unwrap().to_vec2::<f32>().unwrap()[0][0] > 0.0);
        for i in 0..2 {
            let one = token_batch(&pr[i..=i], &co[i..=i], 0, &Device::Cpu).unwrap();
            let (l1, _) = completion_logprobs(&m, &one, false, false, 1.0).unwrap();
            let l1: Vec<f32> = l1.to_vec2().unwrap().remove(0);
            for (j, v) in l1.iter().enumerate() {
                assert!(
                    (v - lp[i][j]).abs() < 1e-5,
                    "row {i} tok {j}: {v} vs {}",
                    lp[i][j]
                );
            }
        }
        assert_eq!(
            tb.mask.to_vec2::<f32>().unwrap()[0],
            vec![1.0, 1.0, 0.0, 0.0]
        );
    }
}
