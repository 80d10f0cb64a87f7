//! PPO's critic in the plan (`crate::ppo`): a second decoder, loaded from `value_model` (GGUF
//! blocks dropped, dense in the run's dtype), with a `[1, hidden]` score head, trained as the
//! policy is (its own LoRA adapters, or every weight) in the same AdamW.
//!
//! Beside the policy it costs its weights, its trainable parameters' AdamW state and gradients,
//! a no-grad value pass per rollout (micro-batches of plain prompt + completion rows, the
//! `values` phase), and per micro-batch a forward + backward of its own over the same rows: its
//! saved tensors sit beside the policy's until the summed loss is dropped, while the two
//! backward passes run one after the other (the two graphs share no node), so only the larger
//! working set counts. Activation checkpointing covers the policy only
//! (`run::optim`'s session is the policy model's), so the critic keeps every layer. Loading and
//! exporting the critic come after the policy's (phases `critic_load`, `critic_export`).

use serde::Serialize;

use super::activations::{self, Activations, HeadKernel, MicroBatch, Pass, Sized};
use super::{
    count, tensors, trainable_tensors, weight_tensors, Component, GrpoShape, ModelDims, Phase,
    RunShape, Tuning, AFTER_LOAD, AFTER_POLICY_LOAD,
};

/// The value model's shape and files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CriticShape {
    /// The value model's dimensions (the policy's when `value_model` is `model`).
    pub dims: ModelDims,
    /// Loaded from a `*ForSequenceClassification` directory (a trained reward model): no LM
    /// head. A causal LM keeps its untied `lm_head` (trainable with full fine-tuning, never
    /// used, so no gradient).
    pub headless: bool,
    /// Bytes its loader holds at once (its GGUF file, or its largest safetensors shard).
    pub source_file_bytes: u64,
    /// GGUF blocks its f32 load holds until the critic drops them, right after loading.
    pub decode_block_bytes: u64,
}

impl CriticShape {
    /// Whether the decoder brings an `lm_head` tensor of its own.
    fn has_lm_head(&self) -> bool {
        !self.headless && !self.dims.tied_embeddings
    }

    /// Elements of every weight tensor: the decoder's (as [`weight_tensors`]; without the LM
    /// head when headless) and the score head `[1, hidden]`.
    pub fn weight_tensors(&self) -> Vec<u64> {
        let mut w = weight_tensors(&self.dims);
        if self.headless && !self.dims.tied_embeddings {
            w.remove(1);
        }
        w.push(self.dims.hidden as u64);
        w
    }

    /// Elements of every trainable tensor: the LoRA adapters and the head, or every weight.
    pub fn trainable_tensors(&self, tuning: &Tuning) -> Vec<u64> {
        match tuning {
            Tuning::Full => self.weight_tensors(),
            Tuning::Lora(_) => {
                let mut t = trainable_tensors(&self.dims, tuning);
                t.push(self.dims.hidden as u64);
                t
            }
        }
    }

    /// The trainable tensors that receive a gradient: all but a causal LM's unused `lm_head`.
    pub fn gradient_tensors(&self, tuning: &Tuning) -> Vec<u64> {
        let mut t = self.trainable_tensors(tuning);
        if matches!(tuning, Tuning::Full) && self.has_lm_head() {
            t.remove(1);
        }
        t
    }

    /// Parameters (the head included).
    pub fn parameters(&self) -> usize {
        self.weight_tensors().iter().sum::<u64>() as usize
    }
}

/// The critic's pass over one micro-batch: `B` plain rows of prompt + completion - 1 tokens
/// (`Critic::values`, no shared prompt pass), and the completion rows its head reads.
pub fn critic_passes(run: &RunShape, g: &GrpoShape) -> (Vec<Pass>, usize) {
    let t = g.prompt_tokens + g.completion_tokens.max(1) - 1;
    let pass = Pass {
        name: "critic: prompt + completion rows",
        rows: run.micro_batch,
        tokens: t,
        keys: t,
    };
    (vec![pass], run.micro_batch * g.completion_tokens)
}

/// The critic's components (keys `critic_*`) and its micro-batch activations; `policy` is the
/// policy's micro-batch activations (whose backward working set the critic's does not add to).
pub fn components(
    critic: &CriticShape,
    run: &RunShape,
    g: &GrpoShape,
    policy: &Activations,
) -> (Vec<Component>, Activations) {
    let w = run.weight_bytes();
    let dims = &critic.dims;
    let dtype = if run.bf16 { "bf16" } else { "f32" };
    let full = matches!(run.tuning, Tuning::Full);
    let weight_elems = critic.weight_tensors();
    let trainable_elems = critic.trainable_tensors(&run.tuning);
    let grad_elems = critic.gradient_tensors(&run.tuning);
    let t: usize = trainable_elems.iter().sum::<u64>() as usize;
    let mut c = Vec::new();
    let mut add = |key, name: &str, size: Sized, detail: String, phases: &[Phase]| {
        c.push(Component {
            key,
            name: name.into(),
            bytes: size.bytes,
            fresh_bytes: size.fresh_bytes,
            detail,
            phases: phases.to_vec(),
        })
    };
    let weights = tensors(&weight_elems, w);
    add(
        "critic_weights",
        "critic weights (value model)",
        weights,
        format!(
            "{} params x {dtype}: the decoder{} and the score head [1, {}]; GGUF blocks dropped",
            count(critic.parameters()),
            if critic.has_lm_head() {
                " (with its unused lm_head)"
            } else {
                ""
            },
            dims.hidden
        ),
        &AFTER_POLICY_LOAD,
    );
    // Reading: the file, the largest tensor in f32 and (f32 GGUF) the blocks until they are
    // dropped; with full fine-tuning then the loaded weights while their copies are made.
    let blocks = if run.bf16 {
        0
    } else {
        critic.decode_block_bytes
    };
    let file = Sized::one(critic.source_file_bytes)
        + Sized::one(dims.largest_tensor() as u64 * 4)
        + Sized {
            bytes: blocks,
            fresh_bytes: 0,
        };
    let (load, load_detail) = if full && weights.bytes > file.bytes {
        (
            weights,
            "loaded weights while their trainable copies are made".into(),
        )
    } else {
        (
            file,
            format!(
                "source file {:.0} MiB + largest tensor in f32{}",
                critic.source_file_bytes as f64 / (1u64 << 20) as f64,
                if blocks > 0 { " + GGUF blocks" } else { "" }
            ),
        )
    };
    add(
        "critic_load_buffers",
        "critic loading buffers",
        load,
        load_detail,
        &[Phase::CriticLoad],
    );
    let adapters = match &run.tuning {
        Tuning::Full => Sized::default(),
        Tuning::Lora(_) => tensors(&trainable_tensors(dims, &run.tuning), 4),
    };
    add(
        "critic_trainable",
        "critic trainable copies",
        adapters,
        match &run.tuning {
            Tuning::Full => {
                "full fine-tuning: the critic's weights are its trainable copies".into()
            }
            Tuning::Lora(l) => format!(
                "its own LoRA adapters, r={} on {} modules x {} layers, x f32 (the head trains \
                 in place)",
                l.r,
                l.modules.len(),
                dims.layers
            ),
        },
        &AFTER_POLICY_LOAD,
    );
    let state = tensors(&trainable_elems, 4);
    if full && run.bf16 {
        add(
            "critic_master",
            "critic master weights",
            state,
            format!("AdamW's f32 copy of {} bf16 params", count(t)),
            &AFTER_LOAD,
        );
    }
    add(
        "critic_optimizer",
        "critic optimizer state",
        state + state,
        format!(
            "AdamW m, v (the policy's optimizer): 2 x {} x f32",
            count(t)
        ),
        &AFTER_LOAD,
    );
    let grad_state = tensors(&grad_elems, 4);
    let grad_bytes = if full { w } else { 4 };
    let tg: usize = grad_elems.iter().sum::<u64>() as usize;
    let (grads, grads_detail) = if run.accumulation == 1 && grad_bytes == 4 {
        (
            grad_state,
            format!(
                "one micro-batch: its grads {} x f32 are the sums",
                count(tg)
            ),
        )
    } else {
        (
            tensors(&grad_elems, grad_bytes) + grad_state,
            format!(
                "micro-batch grads {} x {} + accumulated sums {} x f32",
                count(tg),
                if full { dtype } else { "f32" },
                count(tg)
            ),
        )
    };
    add(
        "critic_gradients",
        "critic gradients",
        grads,
        grads_detail,
        &[Phase::Update],
    );
    let (passes, rows) = critic_passes(run, g);
    let tokens = passes[0].total_tokens();
    add(
        "critic_values",
        "critic value pass (no grad)",
        activations::no_grad_pass(dims, run.kernels(), HeadKernel::Score, &passes, rows),
        format!(
            "per rollout, micro-batches of {} rows x {} tokens through the critic without graph",
            run.micro_batch, passes[0].tokens
        ),
        &[Phase::Values],
    );
    let acts = activations::activations(
        dims,
        &run.tuning,
        run.kernels(),
        HeadKernel::Score,
        &MicroBatch {
            passes: &passes,
            head_rows: rows,
            shared_prompt: None,
            temperature_scaled: false,
            checkpointing: false,
        },
    );
    // The backward passes run one after the other: the phase holds the larger working set.
    let overlap = if acts.working_set.bytes <= policy.working_set.bytes {
        acts.working_set
    } else {
        policy.working_set
    };
    add(
        "critic_activations",
        "critic activations",
        Sized {
            bytes: acts.total.bytes - overlap.bytes,
            fresh_bytes: acts.total.fresh_bytes.saturating_sub(overlap.fresh_bytes),
        },
        format!(
            "micro-batch of {}: {tokens} tokens x {} layers (never checkpointed) + score head \
             over {rows} rows; its backward's working set ({:.1} MiB) runs apart from the \
             policy's, only the larger counts",
            run.micro_batch,
            dims.layers,
            acts.working_set.bytes as f64 / (1u64 << 20) as f64
        ),
        &[Phase::Update],
    );
    // A checkpoint copies the whole optimizer state, the critic's with it.
    let largest = trainable_elems.iter().copied().max().unwrap_or(0);
    let copies = if full && run.bf16 { 3 } else { 2 };
    let mut ckpt = Sized::times(largest * 4, 2);
    for _ in 0..copies {
        ckpt = ckpt + state;
    }
    add(
        "critic_checkpoint_buffers",
        "critic checkpoint buffers",
        ckpt,
        format!(
            "a copy of its optimizer state ({copies} x {} x f32) + write buffers",
            count(t)
        ),
        &[Phase::Checkpoint],
    );
    // `Critic::export`: with LoRA a merged copy of the adapted weights (and merge_lora's f32
    // temporaries), then the write buffers as the policy's export.
    let merged: Vec<u64> = match &run.tuning {
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
    let largest_merged = merged.iter().copied().max().unwrap_or(0);
    let mut export = tensors(&merged, w) + Sized::times(largest_merged * 4, 3);
    export = export + Sized::one(dims.largest_tensor() as u64 * 4);
    if run.bf16 {
        export = export + tensors(&weight_elems, 4);
    }
    add(
        "critic_export",
        "critic export",
        export,
        format!(
            "critic/ as an HF directory{}{}",
            if merged.is_empty() {
                ""
            } else {
                ": the adapters merged into a copy"
            },
            if run.bf16 {
                ", the weights converted to f32"
            } else {
                ", the largest tensor's write buffer"
            }
        ),
        &[Phase::CriticExport],
    );
    (c, acts)
}
