//! Batched generation with an external KV cache.
//!
//! Prompts of different lengths are left-padded and prefilled once each; the `n` samples of a
//! prompt then share that prefill (the cache rows are duplicated, not recomputed). On the fused
//! CPU path the tokens every prompt starts with (chat template, system prompt) are prefilled
//! once for the whole batch ([`decode_fast::prefill`]). Finished rows
//! leave the batch, so no compute is spent on padding after a sequence stops. Every sequence has
//! its own seeded PRNG stream `(seed, prompt, sample)`, so results do not depend on batch size.

use rayon::prelude::*;

use crate::decode_fast::{self, RowCache};
use crate::decoder::{Batch, CausalLm};
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::sampling::{sample, Rng, SamplingParams};

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_new_tokens` reached.
    Length,
}

/// A generation request over token ids.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt token ids, one row per prompt (lengths may differ).
    pub prompts: Vec<Vec<u32>>,
    /// Samples per prompt (they share the prompt's prefill).
    pub n: usize,
    /// Upper bound on new tokens per sample.
    pub max_new_tokens: usize,
    /// Sampling rule.
    pub sampling: SamplingParams,
    /// Seed of all PRNG streams.
    pub seed: u64,
    /// Generation stops after any of these ids (the id is kept in the output).
    pub eos_token_ids: Vec<u32>,
    /// Generation stops when the decoded text contains any of these (cut before it).
    pub stop_strings: Vec<String>,
    /// Id used to left-pad prompts (never attended to).
    pub pad_token_id: u32,
}

/// One generated sample.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Completion {
    /// Index of the prompt in the request.
    pub prompt_index: usize,
    /// Index of the sample among the prompt's `n`.
    pub sample_index: usize,
    /// New token ids (an eos id that ended the sequence included).
    pub token_ids: Vec<u32>,
    /// Log-probability of each new token (see [`crate::sampling::Sampled`]).
    pub logprobs: Vec<f32>,
    /// Decoded text of the new tokens, special tokens skipped, cut before a stop string.
    pub text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
}

/// Turns token ids into text for stop strings and the returned `text`.
pub trait Detokenize: Sync {
    /// Decodes ids, skipping special tokens.
    fn detokenize(&self, ids: &[u32]) -> String;
}

impl<F: Fn(&[u32]) -> String + Sync> Detokenize for F {
    fn detokenize(&self, ids: &[u32]) -> String {
        self(ids)
    }
}

struct Row {
    prompt: usize,
    sample: usize,
    pad: usize,
    seen: Vec<u32>,
    rng: Rng,
    out: Vec<u32>,
    logprobs: Vec<f32>,
    text: String,
    done: Option<FinishReason>,
}

/// Generates `n` samples for every prompt. Output order: prompt-major, then sample index.
/// f32 models on the CPU decode with the fused path ([`decode_fast`]).
pub fn generate(
    model: &CausalLm,
    req: &GenerateRequest,
    detok: &dyn Detokenize,
) -> Result<Vec<Completion>> {
    generate_with(model, req, detok, decode_fast::supported(model))
}

/// [`generate`] choosing the decode path: `fused = false` forces the tensor path (any device
/// and dtype), which tests use to check the two agree.
pub fn generate_with(
    model: &CausalLm,
    req: &GenerateRequest,
    detok: &dyn Detokenize,
    fused: bool,
) -> Result<Vec<Completion>> {
    model.require_lm_head()?;
    // Decoding on the CPU runs many short parallel loops: start them from a pool worker. A GPU
    // keeps the calling thread (the one its context was made on).
    if model.device().is_cpu() {
        rlft_kernels::pool::on_pool(|| generate_on_thread(model, req, detok, fused))
    } else {
        generate_on_thread(model, req, detok, fused)
    }
}

fn generate_on_thread(
    model: &CausalLm,
    req: &GenerateRequest,
    detok: &dyn Detokenize,
    fused: bool,
) -> Result<Vec<Completion>> {
    if fused && !decode_fast::supported(model) {
        return Err(ModelError::Invalid(
            "the fused decode path needs an f32 model on the CPU".into(),
        ));
    }
    req.sampling.validate().map_err(ModelError::Invalid)?;
    if req.prompts.iter().any(Vec::is_empty) {
        return Err(ModelError::Invalid(
            "a prompt has no tokens; every prompt needs at least one token".into(),
        ));
    }
    if req.n == 0 || req.prompts.is_empty() {
        return Ok(Vec::new());
    }
    let device = model.device();
    let max_len = req.prompts.iter().map(Vec::len).max().unwrap_or(0);
    let capacity = max_len + req.max_new_tokens;
    if capacity > model.config.max_position_embeddings {
        return Err(ModelError::Invalid(format!(
            "prompt ({max_len} tokens) + max_new_tokens ({}) exceeds the model's context of {} \
             tokens; shorten the prompt or lower max_new_tokens",
            req.max_new_tokens, model.config.max_position_embeddings
        )));
    }
    let pads: Vec<usize> = req.prompts.iter().map(|p| max_len - p.len()).collect();
    // Prefill each prompt once, then share it across the n samples of the prompt.
    let expand: Vec<u32> = (0..req.prompts.len())
        .flat_map(|p| std::iter::repeat_n(p as u32, req.n))
        .collect();
    let prefill_span = rlft_kernels::op_time::span("generate: prefill");
    let (mut decoder, first_logits) = if fused {
        let (caches, logits) = decode_fast::prefill(model, &req.prompts, req.max_new_tokens)?;
        let caches: Vec<RowCache> = expand.iter().map(|&p| caches[p as usize].clone()).collect();
        (Decoder::Fast(caches), logits)
    } else {
        let mut cache = KvCache::new(model.layers.len(), capacity);
        let batch = Batch::left_padded(&req.prompts, &pads, 0, req.pad_token_id, device)?;
        let hidden = model.forward(&batch, Some(&mut cache), false)?;
        let logits = model.logits_at(&hidden, &vec![max_len - 1; req.prompts.len()])?;
        cache.select_rows(&expand)?;
        (Decoder::Tensor(cache), logits.to_vec2()?)
    };
    drop(prefill_span);
    let mut logits: Vec<Vec<f32>> = expand
        .iter()
        .map(|&p| first_logits[p as usize].clone())
        .collect();
    let mut rows: Vec<Row> = expand
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let p = p as usize;
            Row {
                prompt: p,
                sample: i % req.n,
                pad: pads[p],
                seen: req.prompts[p].clone(),
                rng: Rng::new(req.seed, p as u64, (i % req.n) as u64),
                out: Vec::new(),
                logprobs: Vec::new(),
                text: String::new(),
                done: None,
            }
        })
        .collect();
    let mut active: Vec<usize> = (0..rows.len()).collect();
    if req.max_new_tokens == 0 {
        for r in &mut rows {
            r.done = Some(FinishReason::Length);
        }
        active.clear();
    }
    while !active.is_empty() {
        // Sample one token for every active row (rows are independent: parallel).
        let mut act_rows: Vec<&mut Row> = {
            let mut v: Vec<Option<&mut Row>> = rows.iter_mut().map(Some).collect();
            active
                .iter()
                .map(|&i| v[i].take().expect("unique"))
                .collect()
        };
        let sample_span = rlft_kernels::op_time::span("generate: sample");
        act_rows
            .par_iter_mut()
            .zip(logits.par_iter())
            .for_each(|(row, lg)| sample_step(row, lg, req, detok));
        drop(act_rows);
        drop(sample_span);
        // Drop finished rows from the batch and the cache.
        let keep: Vec<usize> = (0..active.len())
            .filter(|&j| rows[active[j]].done.is_none())
            .collect();
        if keep.is_empty() {
            break;
        }
        if keep.len() != active.len() {
            decoder.keep_rows(&keep)?;
            active = keep.iter().map(|&j| active[j]).collect();
        }
        let tokens: Vec<u32> = active
            .iter()
            .map(|&i| *rows[i].out.last().expect("sampled"))
            .collect();
        let _step = rlft_kernels::op_time::span("generate: decode step");
        logits = match &mut decoder {
            Decoder::Fast(caches) => {
                let ids: Vec<Vec<u32>> = tokens.iter().map(|&t| vec![t]).collect();
                decode_fast::forward(model, caches, &ids)?
            }
            Decoder::Tensor(cache) => {
                let past = cache.len();
                let ids: Vec<Vec<u32>> = tokens.iter().map(|&t| vec![t]).collect();
                let pad: Vec<usize> = active.iter().map(|&i| rows[i].pad).collect();
                let batch = Batch::left_padded(&ids, &pad, past, req.pad_token_id, device)?;
                let hidden = model.forward(&batch, Some(cache), false)?;
                model
                    .logits_at(&hidden, &vec![0; active.len()])?
                    .to_vec2()?
            }
        };
    }
    let out = rows
        .into_par_iter()
        .map(|r| {
            let text = if r.done == Some(FinishReason::Stop) && !r.text.is_empty() {
                r.text
            } else {
                let t = detok.detokenize(&r.out);
                match first_stop(&t, &req.stop_strings) {
                    Some(cut) => t[..cut].to_string(),
                    None => t,
                }
            };
            Completion {
                prompt_index: r.prompt,
                sample_index: r.sample,
                token_ids: r.out,
                logprobs: r.logprobs,
                text,
                finish_reason: r.done.unwrap_or(FinishReason::Length),
            }
        })
        .collect();
    Ok(out)
}

/// The decode-time state: per-row caches for the fused CPU path, or a batched tensor cache.
enum Decoder {
    Fast(Vec<RowCache>),
    Tensor(KvCache),
}

impl Decoder {
    /// Keeps the rows at positions `keep` (ascending) of the current batch.
    fn keep_rows(&mut self, keep: &[usize]) -> Result<()> {
        match self {
            Decoder::Fast(caches) => {
                let mut it = keep.iter().peekable();
                let mut idx = 0;
                caches.retain(|_| {
                    let k = it.peek() == Some(&&idx);
                    if k {
                        it.next();
                    }
                    idx += 1;
                    k
                });
                Ok(())
            }
            Decoder::Tensor(cache) => {
                let idx: Vec<u32> = keep.iter().map(|&j| j as u32).collect();
                cache.select_rows(&idx)
            }
        }
    }
}

/// Samples the next token of one row and records why it ends, if it does.
fn sample_step(row: &mut Row, logits: &[f32], req: &GenerateRequest, detok: &dyn Detokenize) {
    let s = sample(logits, &row.seen, &req.sampling, &mut row.rng);
    row.out.push(s.token);
    row.seen.push(s.token);
    row.logprobs.push(s.logprob);
    if req.eos_token_ids.contains(&s.token) {
        row.done = Some(FinishReason::Stop);
    } else if !req.stop_strings.is_empty() {
        let text = detok.detokenize(&row.out);
        if let Some(cut) = first_stop(&text, &req.stop_strings) {
            row.text = text[..cut].to_string();
            row.done = Some(FinishReason::Stop);
        }
    }
    if row.done.is_none() && row.out.len() >= req.max_new_tokens {
        row.done = Some(FinishReason::Length);
    }
}

/// Byte offset of the earliest stop string in `text`.
fn first_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}
