//! The policy's own memory in the plan: the process baseline, its weights and what loading
//! them holds, its trainable copies, AdamW's state, its gradients, and the reference model.
//! Each adds its components to the estimate ([`super::estimate`]).

use super::activations::Sized;
use super::estimate::{tensors, Derived, Parts};
use super::{
    count, DpoReference, Environment, Phase, Tuning, Workload, AFTER_LOAD, AFTER_POLICY_LOAD, ALL,
};

/// The process baseline (measured, `env`), the policy weights `P x w`, the GGUF blocks an f32
/// load keeps for decoding, and the loading buffers: the source file and the largest tensor's
/// f32 conversion, or with full fine-tuning the loaded weights while their trainable copies are
/// made.
pub(super) fn weights(c: &mut Parts, d: &Derived, env: &Environment) {
    let (dims, run, dtype) = (d.dims, d.run, d.dtype);
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    c.add(
        "baseline",
        "process baseline".into(),
        Sized {
            bytes: env.baseline_bytes,
            fresh_bytes: 0,
        },
        "binary, tokenizer, dataset, threads (measured)".into(),
        &ALL,
    );
    // LoRA over an f32 GGUF load keeps the frozen matrices in their blocks (no decode copy).
    let (kept_params, kept_bytes) = env.frozen_blocks;
    let in_blocks = !run.bf16 && !d.full && !d.reward_model && kept_bytes > 0;
    if in_blocks {
        let dense = d.p.saturating_sub(kept_params as usize);
        c.add(
            "weights",
            "policy weights".into(),
            Sized {
                bytes: kept_bytes + dense as u64 * d.w,
                fresh_bytes: 0,
            },
            format!(
                "frozen base in its GGUF blocks: {} params in {:.0} MiB, {} params x {dtype}",
                count(kept_params as usize),
                mib(kept_bytes),
                count(dense)
            ),
            &ALL,
        );
    } else {
        c.add(
            "weights",
            "policy weights".into(),
            d.weights,
            if d.reward_model {
                format!(
                    "{} params x {dtype}: the backbone (no LM head) and the score head [1, {}]",
                    count(d.p),
                    dims.hidden
                )
            } else {
                format!("{} params x {dtype}", count(d.p))
            },
            &ALL,
        );
    }
    // Loading: the source file and the largest tensor's f32 conversion; with full fine-tuning
    // the loaded weights stay while their trainable copies are made.
    let file = Sized::one(env.source_file_bytes) + Sized::one(dims.largest_tensor() as u64 * 4);
    let (load, load_detail) = if d.full && d.weights.bytes > file.bytes {
        (
            d.weights,
            "loaded weights while their trainable copies are made".to_string(),
        )
    } else {
        (
            file,
            format!(
                "source file {:.0} MiB + largest tensor in f32",
                mib(env.source_file_bytes)
            ),
        )
    };
    if !run.bf16 && env.decode_block_bytes > 0 && !in_blocks {
        // Kept by GRPO with LoRA (rollouts decode the frozen base from them); dropped after
        // loading by full fine-tuning (the weights move) and by SFT (it never decodes).
        let kept = !d.full && matches!(run.workload, Workload::Grpo(_));
        c.add(
            "decode_blocks",
            "GGUF blocks for decoding".into(),
            // Per tensor a few small buffers (the largest, the head's, under 32 MiB): heap.
            Sized {
                bytes: env.decode_block_bytes,
                fresh_bytes: 0,
            },
            "the frozen weights' Q4_1/Q8_0 blocks, read by the decode kernel".into(),
            if kept { &ALL } else { &[Phase::Load] },
        );
    }
    c.add(
        "load_buffers",
        "loading buffers".into(),
        load,
        load_detail,
        &[Phase::Load],
    );
}

/// The trainable copies: none with full fine-tuning (the weights are trained in place), the
/// LoRA adapters `T x 4` (f32 whatever the base) otherwise.
pub(super) fn trainable(c: &mut Parts, d: &Derived) {
    let (name, detail, size) = match &d.run.tuning {
        Tuning::Full => (
            "trainable copies".to_string(),
            "full fine-tuning: the policy weights are the trainable copies".to_string(),
            Sized::default(),
        ),
        Tuning::Lora(l) => (
            "trainable copies (LoRA adapters)".to_string(),
            format!(
                "r={} on {} modules x {} layers{}: {} params x f32",
                l.r,
                l.modules.len(),
                d.dims.layers,
                if d.reward_model {
                    " + the score head"
                } else {
                    ""
                },
                count(d.t)
            ),
            tensors(&d.trainable_elems, 4),
        ),
    };
    c.add("trainable", name, size, detail, &ALL);
}

/// AdamW's state: with bf16 full fine-tuning an f32 master copy `T x 4`, the moments
/// `2 x T x 4`; and the gradients: a micro-batch's `T x w` (LoRA: f32) + the accumulated sums
/// `T x 4`, or only `T x 4` for one micro-batch of f32 gradients (they become the sums).
pub(super) fn optimizer(c: &mut Parts, d: &Derived) {
    let (t, f32_state) = (d.t, d.f32_state);
    if d.full && d.run.bf16 {
        c.add(
            "master",
            "master weights".into(),
            f32_state,
            format!("AdamW's f32 copy of {} bf16 params", count(t)),
            &AFTER_LOAD,
        );
    }
    c.add(
        "optimizer",
        "optimizer state".into(),
        f32_state + f32_state,
        format!("AdamW m, v: 2 x {} x f32", count(t)),
        &AFTER_LOAD,
    );
    let grad_bytes = if d.full { d.w } else { 4 };
    // f32 gradients of a single micro-batch become the sums as they are (no copy).
    let (grads, grads_detail) = if d.run.accumulation == 1 && grad_bytes == 4 {
        (
            f32_state,
            format!("one micro-batch: its grads {} x f32 are the sums", count(t)),
        )
    } else {
        (
            tensors(&d.trainable_elems, grad_bytes) + f32_state,
            format!(
                "micro-batch grads {} x {} + accumulated sums {} x f32",
                count(t),
                if d.full { d.dtype } else { "f32" },
                count(t)
            ),
        )
    };
    c.add(
        "gradients",
        "gradients".into(),
        grads,
        grads_detail,
        &[Phase::Update],
    );
}

/// The reference model: GRPO with `beta > 0` and DPO keep a copy `P x w` with full fine-tuning
/// (DPO: not with `precompute_ref_log_probs`); with LoRA the base with adapters off is the
/// reference. SFT and the reward model have none (no component).
pub(super) fn reference(c: &mut Parts, d: &Derived) {
    match (&d.run.workload, d.full) {
        (Workload::Grpo(g), true) if g.reference => c.add(
            "reference",
            "reference model".into(),
            d.weights,
            "beta > 0 with full fine-tuning: the initial weights, kept".into(),
            &AFTER_POLICY_LOAD,
        ),
        (Workload::Grpo(g), false) if g.reference => c.add(
            "reference",
            "reference model".into(),
            Sized::default(),
            "LoRA: the base with adapters off, no copy".into(),
            &AFTER_LOAD,
        ),
        (Workload::Grpo(_), _) => c.add(
            "reference",
            "reference model".into(),
            Sized::default(),
            "beta = 0: none".into(),
            &AFTER_LOAD,
        ),
        (Workload::Dpo(dpo), _) => {
            let (size, detail) = match dpo.reference {
                DpoReference::Copy => (
                    d.weights,
                    "full fine-tuning: a frozen copy of the starting weights, kept",
                ),
                DpoReference::AdaptersOff => (
                    Sized::default(),
                    "LoRA: the base with adapters off, no copy",
                ),
                DpoReference::Precomputed => (
                    Sized::default(),
                    "precompute_ref_log_probs: log-probs computed before training, no model \
                     kept (a full fine-tuning copy is freed before the optimizer exists)",
                ),
            };
            c.add(
                "reference",
                "reference model".into(),
                size,
                detail.into(),
                &AFTER_POLICY_LOAD,
            )
        }
        (Workload::Sft(_) | Workload::RewardModel(_), _) => {}
    }
}
