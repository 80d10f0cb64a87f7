//! The run's working buffers in the plan: the rollout (or export) model with the LoRA
//! adapters merged, the generation KV caches, a micro-batch's activations and no-grad pass,
//! and the checkpoint and export buffers. Each adds its components to the estimate
//! ([`super::estimate`]).

use super::activations::{self, Activations, MicroBatch, Pass, Sized};
use super::estimate::{tensors, Derived, Parts};
use super::{count, DpoReference, GrpoShape, ModelDims, Phase, Tuning, Workload};

/// Bytes of a KV cache: `rows x layers x 2 (k, v) x kv_dim x positions x bytes`.
pub fn kv_cache_bytes(dims: &ModelDims, rows: usize, positions: usize, bytes: u64) -> u64 {
    (rows * dims.layers * 2 * dims.kv_dim() * positions) as u64 * bytes
}

/// Generating `n` samples for each of `prompts` prompts of `prompt_tokens` with `new_tokens`
/// new tokens each: a KV cache per row and layer with room for its prompt and new tokens (f32
/// CPU decoding copies each prompt's prefilled cache to its `n` rows), two `[rows, vocab]` f32
/// logits buffers, and the larger of the prefill's layer buffers and the prompts' own caches
/// (filled up to the prompt), which the rows' copies outlive.
pub fn generation(
    dims: &ModelDims,
    prompts: usize,
    n: usize,
    prompt_tokens: usize,
    new_tokens: usize,
    kv_bytes: u64,
) -> Sized {
    let rows = (prompts * n) as u64;
    let per_row = kv_cache_bytes(dims, 1, prompt_tokens + new_tokens, kv_bytes)
        / 2
        / dims.layers.max(1) as u64;
    let kv = Sized::times(per_row, rows * 2 * dims.layers as u64);
    let logits = Sized::times(rows * dims.vocab as u64 * 4, 2);
    let (h, i, qd, kvd) = (
        dims.hidden as u64,
        dims.intermediate as u64,
        dims.q_dim() as u64,
        dims.kv_dim() as u64,
    );
    let t = (prompts * prompt_tokens) as u64 * 4;
    let prefill = Sized::times(t * h, 4)
        + Sized::times(t * qd, 2)
        + Sized::times(t * kvd, 2)
        + Sized::times(t * i, 2);
    let prompt_row =
        kv_cache_bytes(dims, 1, prompt_tokens, kv_bytes) / 2 / dims.layers.max(1) as u64;
    let prompt_caches = Sized::times(prompt_row, (prompts * 2 * dims.layers) as u64);
    kv + logits
        + if prefill.bytes >= prompt_caches.bytes {
            prefill
        } else {
            prompt_caches
        }
}

/// The merged copy of the adapted weights (LoRA) and `merge_lora`'s f32 buffers: GRPO's
/// rollout model (bf16) or export model (f32), the export model of the other trainers; GRPO's
/// rollout and eval KV caches ([`generation`]).
pub(super) fn rollout(c: &mut Parts, d: &Derived) {
    let dims = d.dims;
    let merged_elems: Vec<u64> = match &d.run.tuning {
        Tuning::Full => Vec::new(),
        Tuning::Lora(l) => (0..dims.layers)
            .flat_map(|_| {
                dims.linears()
                    .into_iter()
                    .filter(|(m, _, _)| l.modules.contains(m))
                    .map(|(_, o, i)| (o * i) as u64)
            })
            .collect(),
    };
    let largest_merged = merged_elems.iter().copied().max().unwrap_or(0);
    // merge_lora's f32 delta, weight and sum of the largest adapted matrix: what an export
    // holds as it merges and writes one tensor at a time; a merged copy (bf16 rollouts) holds
    // every merged weight besides.
    let one = Sized::times(largest_merged * 4, 3);
    let merge = tensors(&merged_elems, d.w) + one;
    match &d.run.workload {
        Workload::Grpo(g) => {
            let merge = if d.run.bf16 { merge } else { one };
            rollout_model(c, d, merge, merged_elems.is_empty());
            generation_caches(c, d, g);
        }
        _ if !merged_elems.is_empty() => c.add(
            "rollout_model",
            "merged model (export)".into(),
            one,
            "the final export merges the adapters one tensor at a time as it writes".into(),
            &[Phase::Export],
        ),
        _ => {}
    }
}

/// GRPO's rollout model of `merge` bytes: none with full fine-tuning (`unmerged`: no adapted
/// weight), the merged copy generation runs on (bf16), or only the export's (f32).
fn rollout_model(c: &mut Parts, d: &Derived, merge: Sized, unmerged: bool) {
    let (run, dtype) = (d.run, d.dtype);
    // The f32 CPU decoder adds the adapters' low-rank update itself; the bf16 path
    // generates from a merged copy. The final export always merges.
    let (name, detail, phases): (&str, String, &[Phase]) = if unmerged {
        (
            "rollout model",
            "full fine-tuning: generation shares the policy weights".into(),
            &[Phase::Eval, Phase::Generate, Phase::Export],
        )
    } else if run.bf16 {
        (
            "rollout model (LoRA merged)",
            format!(
                "generation runs on a copy with the adapters merged: {} params x {dtype}",
                count(run.tuning.merged_params(d.dims))
            ),
            &[Phase::Eval, Phase::Generate, Phase::Export],
        )
    } else {
        (
            "merged model (export)",
            "generation adds the adapters to the frozen base as it decodes; the final \
             export merges them one tensor at a time as it writes"
                .into(),
            &[Phase::Export],
        )
    };
    c.add("rollout_model", name.into(), merge, detail, phases);
}

/// GRPO's KV caches: a rollout's (`G` completions of each prompt), and eval generation's (one
/// per eval prompt) when the run has eval prompts.
fn generation_caches(c: &mut Parts, d: &Derived, g: &GrpoShape) {
    let (dims, dtype) = (d.dims, d.dtype);
    let kv_bytes = d.w;
    let positions = g.prompt_tokens + g.completion_tokens;
    c.add(
        "generation",
        "generation (KV cache)".into(),
        generation(
            dims,
            g.rollout_prompts,
            g.num_generations,
            g.prompt_tokens,
            g.completion_tokens,
            kv_bytes,
        ),
        format!(
            "{} prompts x {} completions x {positions} positions x {} layers x 2 x {} kv \
             heads x {} x {dtype}, + logits",
            g.rollout_prompts, g.num_generations, dims.layers, dims.kv_heads, dims.head_dim
        ),
        &[Phase::Generate],
    );
    if let Some(e) = g.eval {
        c.add(
            "eval_generation",
            "eval generation (KV cache)".into(),
            generation(
                dims,
                e.prompts,
                1,
                e.prompt_tokens,
                g.completion_tokens,
                kv_bytes,
            ),
            format!(
                "{} prompts x {} positions",
                e.prompts,
                e.prompt_tokens + g.completion_tokens
            ),
            &[Phase::Eval],
        );
    }
}

/// A micro-batch's activations ([`activations::activations`]) in the update, and the no-grad
/// log-prob pass over the same rows ([`activations::no_grad_pass`]) when the run scores one.
/// Returns the activations and what the no-grad pass scores ([`scored_pass`]).
pub(super) fn passes(c: &mut Parts, d: &Derived) -> (Activations, Option<&'static str>) {
    let (dims, run) = (d.dims, d.run);
    let (passes, head_rows, shared) = run.micro_batch_passes();
    let temperature_scaled = matches!(&run.workload, Workload::Grpo(g) if g.temperature_scaled);
    let acts = activations::activations(
        dims,
        &run.tuning,
        run.kernels(),
        run.head(),
        &MicroBatch {
            passes: &passes,
            head_rows,
            shared_prompt: shared,
            temperature_scaled,
            checkpointing: run.gradient_checkpointing,
        },
    );
    let tokens: usize = passes.iter().map(Pass::total_tokens).sum();
    c.add(
        "activations",
        "activations".into(),
        acts.total,
        format!(
            "micro-batch of {} {}: {tokens} tokens x {} layers{} + {} head over {head_rows} rows",
            run.micro_batch,
            match run.workload {
                Workload::Dpo(_) | Workload::RewardModel(_) => "pairs",
                Workload::Sft(_) => "examples",
                Workload::Grpo(_) => "completions",
            },
            dims.layers,
            if run.gradient_checkpointing {
                " (checkpointed: layer inputs + one layer)"
            } else {
                ""
            },
            if d.reward_model { "score" } else { "LM" }
        ),
        &[Phase::Update],
    );
    let scored = scored_pass(&run.workload);
    if let Some(what) = scored {
        c.add(
            "logprob_pass",
            "no-grad log-prob pass".into(),
            activations::no_grad_pass(dims, run.kernels(), run.head(), &passes, head_rows),
            format!("{what}: a micro-batch's forward without graph"),
            &[Phase::Score],
        );
    }
    (acts, scored)
}

/// What a run's no-grad pass scores, if it has one: GRPO's reference or old-policy log-probs,
/// SFT's eval loss, DPO's reference log-probs (and eval), the reward model's eval scores.
fn scored_pass(workload: &Workload) -> Option<&'static str> {
    match workload {
        Workload::Grpo(g) => (g.reference || g.old_logprobs).then_some("reference/old log-probs"),
        Workload::Sft(s) => s.eval.then_some("eval loss"),
        Workload::Dpo(d) => Some(match (d.reference, d.eval) {
            (DpoReference::Precomputed, false) => "reference log-probs (precomputed)",
            (DpoReference::Precomputed, true) => "reference log-probs (precomputed), eval",
            _ => "reference log-probs",
        }),
        Workload::RewardModel(r) => r.eval.then_some("eval scores"),
    }
}

/// The checkpoint's buffers (a copy of the optimizer state and master weights, two write
/// buffers of the largest trainable tensor in f32) and the final export's (the largest
/// tensor's f32 write buffer; bf16: every weight converted to f32).
pub(super) fn saving(c: &mut Parts, d: &Derived) {
    let run = d.run;
    // A checkpoint copies the optimizer state (and master weights) and writes each tensor
    // through two buffers (values, bytes) of the largest trainable tensor or its f32 state.
    let largest_trainable = d.trainable_elems.iter().copied().max().unwrap_or(0);
    let state_copies = if d.full && run.bf16 { 3 } else { 2 };
    let mut ckpt = Sized::times(largest_trainable * 4, 2);
    for _ in 0..state_copies {
        ckpt = ckpt + d.f32_state;
    }
    c.add(
        "checkpoint_buffers",
        "checkpoint buffers".into(),
        ckpt,
        format!(
            "a copy of the optimizer state ({state_copies} x {} x f32) + write buffers",
            count(d.t)
        ),
        &[Phase::Checkpoint],
    );
    // The final export writes f32 weights one tensor at a time; bf16 weights are all converted
    // to f32 first.
    let mut export = Sized::one(d.dims.largest_tensor() as u64 * 4);
    if run.bf16 {
        export = export + tensors(&d.weight_elems, 4);
    }
    c.add(
        "export_buffers",
        "export buffers".into(),
        export,
        if run.bf16 {
            "the weights converted to f32 for the final export".into()
        } else {
            "the largest tensor's write buffer".into()
        },
        &[Phase::Export],
    );
}
