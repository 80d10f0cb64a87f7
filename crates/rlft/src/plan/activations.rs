//! What one micro-batch's forward keeps alive for its backward: the tensors each decoder layer
//! saves (per token, and per query-key pair where attention materialises its scores), the
//! passes a micro-batch runs, the LM head, and the backward's working set.
//!
//! candle keeps every tensor an op of the graph was given as input (and the op's output, as the
//! next op's input) until the loss is dropped, after `backward`: a layer's activation memory is
//! the sum of the distinct tensors its ops read. The lists below follow the training forward
//! (`CausalLm::layer_qkv`, `ops::attention`, `CausalLm::layer_out`, `fused/*`, `ops.rs`) op by
//! op; when a kernel changes what it keeps, change its entry here (and re-measure: see
//! `docs/memory.md`).

use serde::Serialize;

use super::{LoraShape, ModelDims, Tuning, MMAP_THRESHOLD};

/// Rows of `[rows, vocab]` logits the chunked LM head computes at a time
/// ([`rlft_model::trainable::LOGPROB_CHUNK`]).
pub const HEAD_CHUNK: usize = rlft_model::trainable::LOGPROB_CHUNK;

/// `[chunk, vocab]` f32 buffers the chunked head's backward holds at once besides the saved
/// ones (gather's scattered gradient, the sum's broadcast gradient, `exp`'s gradient, the
/// accumulated logits gradient). Calibrated on SmolLM2-135M (`docs/memory.md`).
pub const HEAD_BACKWARD_CHUNKS: usize = 4;

/// Per-token f32 elements of the gradients in flight while the backward walks the layers:
/// `BACKWARD_I x intermediate + BACKWARD_H x hidden` (the MLP's three `[tokens, I]` gradients
/// and the residual stream's partial sums).
pub const BACKWARD_I: usize = 3;
/// See [`BACKWARD_I`].
pub const BACKWARD_H: usize = 4;

/// Which training kernels the forward runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kernels {
    /// `rlft_kernels::fused`: f32 (and f64) on the CPU; one graph node per norm, linear, RoPE,
    /// SwiGLU and attention, whose probabilities are recomputed in backward.
    Fused,
    /// candle's differentiable composites (bf16 on the CPU): each elementary op keeps its
    /// inputs, norms and softmax run in f32, attention materialises `[heads, t, T]` scores.
    Composite,
}

/// How the LM head keeps memory for backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadKernel {
    /// `CausalLm::target_logprobs_entropy`'s composite: `[256, vocab]` logits blocks through
    /// candle's `log_sum_exp` and `gather`; each block keeps logits, shifted logits and their
    /// `exp` (f32), and bf16 logits before their f32 cast.
    Chunked,
    /// `rlft_kernels::fused::head::lm_head_logprobs`: logits a block of rows at a time, never
    /// `[rows, vocab]` beyond [`FUSED_HEAD_KEEP`] elements; a frozen head keeps
    /// `d out / d hidden` `[rows, hidden]` (f32), a trainable one the per-row log-sum-exp and
    /// the `[rows, vocab]` probabilities up to [`FUSED_HEAD_KEEP`] elements (recomputing logits
    /// tiles in backward above it).
    Fused,
    /// PPO's critic: the `[1, hidden]` score head (`rlft_model::score::ScoreHead::scores`) over
    /// a `[rows, hidden]` copy of the completion positions; a value per row, no logits.
    Score,
}

/// Elements of the fused head's forward logits block (`fused::head::FWD_TILE`).
pub const FUSED_HEAD_FWD_BLOCK: usize = 1 << 23;
/// Fewest rows of a forward block (`fused::head::FWD_MIN_ROWS`).
pub const FUSED_HEAD_MIN_ROWS: usize = 32;
/// Elements of the fused head's backward logits tile (`fused::head::BWD_TILE`).
pub const FUSED_HEAD_BWD_TILE: usize = 1 << 21;
/// The most `[rows, vocab]` probabilities a trainable fused head keeps for its backward
/// (`fused::head::KEEP_PROBS`).
pub const FUSED_HEAD_KEEP: usize = 1 << 25;

/// The LM head the trainers run with these kernels: the fused head for f32 on the CPU, the
/// composite for the rest (`CausalLm::target_logprobs_entropy`).
pub fn head_kernel(kernels: Kernels) -> HeadKernel {
    match kernels {
        Kernels::Fused => HeadKernel::Fused,
        Kernels::Composite => HeadKernel::Chunked,
    }
}

/// One tensor a decoder layer keeps for backward.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SavedTensor {
    /// What it is (module and role).
    pub name: String,
    /// Bytes per token of the pass (0 for score tensors).
    pub bytes_per_token: usize,
    /// Bytes per (head, query, key) triple: attention scores the composite path materialises.
    pub bytes_per_score: usize,
}

fn tok(name: impl Into<String>, elems: usize, bytes: usize) -> SavedTensor {
    SavedTensor {
        name: name.into(),
        bytes_per_token: elems * bytes,
        bytes_per_score: 0,
    }
}

fn score(name: &str, bytes: usize) -> SavedTensor {
    SavedTensor {
        name: format!("attention scores: {name} (per head, query, key)"),
        bytes_per_token: 0,
        bytes_per_score: bytes,
    }
}

/// With full fine-tuning a trainable bias is added outside the linear (in both kernel paths), so
/// the outputs before it are kept too (`bytes` per element).
fn bias_outputs(v: &mut Vec<SavedTensor>, dims: &ModelDims, bytes: usize) {
    let (h, qd, kvd, i) = (dims.hidden, dims.q_dim(), dims.kv_dim(), dims.intermediate);
    if dims.qkv_bias {
        v.push(tok(
            "q/k/v outputs before the trainable bias",
            qd + 2 * kvd,
            bytes,
        ));
    }
    if dims.o_bias {
        v.push(tok("o_proj output before the trainable bias", h, bytes));
    }
    if dims.mlp_bias {
        v.push(tok(
            "MLP outputs before the trainable biases",
            2 * i + h,
            bytes,
        ));
    }
}

/// Tensors one decoder layer keeps for backward, per token (and per score for the composite
/// attention), in forward order. The layer's input (the previous layer's output, or the
/// embeddings) is not listed: it is the previous layer's last entry.
///
/// Shapes per token: hidden `h`, `qd = heads x head_dim`, `kvd = kv_heads x head_dim`,
/// intermediate `i`.
pub fn layer_saved(dims: &ModelDims, kernels: Kernels, tuning: &Tuning) -> Vec<SavedTensor> {
    let (h, qd, kvd, i) = (dims.hidden, dims.q_dim(), dims.kv_dim(), dims.intermediate);
    let full = matches!(tuning, Tuning::Full);
    let lora = match tuning {
        Tuning::Lora(l) => Some(l),
        Tuning::Full => None,
    };
    let mut v = Vec::new();
    match kernels {
        Kernels::Fused => {
            const B: usize = 4;
            // RMSNorm (one op): keeps its input x (listed with the previous layer) and gives
            // `hs`, the input of the q/k/v projections.
            v.push(tok("input_layernorm out", h, B));
            // Fused linear (one op per projection): keeps x and W; outputs [rows, out].
            v.push(tok("q_proj out", qd, B));
            v.push(tok("k_proj out", kvd, B));
            v.push(tok("v_proj out (attention reads its strided view)", kvd, B));
            if dims.qk_norm {
                // Qwen3: the norm makes the strided head view contiguous, then normalises.
                v.push(tok("q_norm input (contiguous copy)", qd, B));
                v.push(tok("q_norm out", qd, B));
                v.push(tok("k_norm input (contiguous copy)", kvd, B));
                v.push(tok("k_norm out", kvd, B));
            }
            // RoPE (one op, straight from the projection's rows): [b, heads, t, d], the
            // attention's input. v goes in as a strided view of its projection (no copy).
            v.push(tok("q RoPE out", qd, B));
            v.push(tok("k RoPE out", kvd, B));
            // Fused attention keeps q, k, v and writes its output as [b, t, heads * d], the
            // o_proj input; probabilities are recomputed in backward.
            v.push(tok("attention out (o_proj input)", qd, B));
            // The residual add keeps both operands: the projection output and x.
            v.push(tok("o_proj out (kept by the residual add)", h, B));
            v.push(tok("residual after attention", h, B));
            v.push(tok("post_attention_layernorm out", h, B));
            v.push(tok("gate_proj out", i, B));
            v.push(tok("up_proj out", i, B));
            v.push(tok("SwiGLU out", i, B));
            v.push(tok("down_proj out (kept by the residual add)", h, B));
            v.push(tok("residual after the MLP (layer output)", h, B));
            if full {
                bias_outputs(&mut v, dims, B);
            }
            if let Some(l) = lora.filter(|l| l.dropout) {
                // The fused LoRA op keeps its dropout mask [rows, in] (f32).
                let ins: usize = adapted(dims, l).map(|(_, _, inp)| inp).sum();
                v.push(tok("LoRA dropout masks", ins, B));
            }
        }
        Kernels::Composite => {
            const B: usize = 2; // bf16 weights and activations
            const F: usize = 4; // f32 statistics
                                // RMSNorm composite: to f32, square, divide by the rms, back to bf16, times the
                                // weight.
            let norm = |v: &mut Vec<SavedTensor>, name: &str, n: usize| {
                v.push(tok(format!("{name}: x in f32"), n, F));
                v.push(tok(format!("{name}: x^2"), n, F));
                v.push(tok(format!("{name}: x / rms"), n, F));
                v.push(tok(format!("{name}: normed in bf16"), n, B));
                v.push(tok(format!("{name}: out"), n, B));
            };
            norm(&mut v, "input_layernorm", h);
            v.push(tok("q_proj out", qd, B));
            v.push(tok("k_proj out", kvd, B));
            v.push(tok("v_proj out", kvd, B));
            if let Some(l) = lora {
                // LoraAdapter::add_delta: x -> f32, x A^T, (x A^T) B^T, * scaling, the base
                // output (bf16) and in f32, their sum; dropout adds the mask and x * mask.
                for (m, out, inp) in adapted(dims, l) {
                    v.push(tok(format!("{m} LoRA: input in f32"), inp, F));
                    if l.dropout {
                        v.push(tok(format!("{m} LoRA: dropout mask"), inp, F));
                        v.push(tok(format!("{m} LoRA: masked input"), inp, F));
                    }
                    v.push(tok(format!("{m} LoRA: x A^T"), l.r, F));
                    v.push(tok(format!("{m} LoRA: x A^T B^T"), out, F));
                    v.push(tok(format!("{m} LoRA: x scaling"), out, F));
                    v.push(tok(format!("{m} LoRA: base out"), out, B));
                    v.push(tok(format!("{m} LoRA: base out in f32"), out, F));
                    v.push(tok(format!("{m} LoRA: sum"), out, F));
                }
            }
            if dims.qk_norm {
                norm(&mut v, "q_norm", qd);
                norm(&mut v, "k_norm", kvd);
            }
            // RoPE composite: -x2 (half), cat, x cos, rotated sin, their sum (bf16).
            for (name, n) in [("q", qd), ("k", kvd)] {
                v.push(tok(format!("{name} RoPE: -x2"), n / 2, B));
                v.push(tok(format!("{name} RoPE: cat(-x2, x1)"), n, B));
                v.push(tok(format!("{name} RoPE: x cos"), n, B));
                v.push(tok(format!("{name} RoPE: rotated sin"), n, B));
                v.push(tok(format!("{name} RoPE: out"), n, B));
            }
            // Scores q k^T, * scale, to f32, + mask, softmax's shifted scores, exp and
            // probabilities (f32), probabilities back to bf16.
            v.push(score("q k^T", B));
            v.push(score("scaled", B));
            v.push(score("in f32", F));
            v.push(score("masked", F));
            v.push(score("minus max", F));
            v.push(score("exp", F));
            v.push(score("probabilities", F));
            v.push(score("probabilities in bf16", B));
            v.push(tok("v contiguous copy", kvd, B));
            v.push(tok("attention out", qd, B));
            v.push(tok("o_proj input (transpose + reshape copy)", qd, B));
            v.push(tok("o_proj out (kept by the residual add)", h, B));
            v.push(tok("residual after attention", h, B));
            norm(&mut v, "post_attention_layernorm", h);
            v.push(tok("gate_proj out", i, B));
            v.push(tok("up_proj out", i, B));
            v.push(tok("silu(gate)", i, B));
            v.push(tok("silu(gate) * up", i, B));
            v.push(tok("down_proj out (kept by the residual add)", h, B));
            v.push(tok("residual after the MLP (layer output)", h, B));
            if full {
                bias_outputs(&mut v, dims, B);
            }
        }
    }
    v
}

/// `(module, out, in)` of the linear layers an adapter targets.
fn adapted<'a>(
    dims: &'a ModelDims,
    l: &'a LoraShape,
) -> impl Iterator<Item = (&'static str, usize, usize)> + 'a {
    dims.linears()
        .into_iter()
        .filter(|(m, _, _)| l.modules.contains(m))
}

/// One forward pass of a micro-batch: `rows` sequences of `tokens` inputs attending to `keys`
/// positions each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Pass {
    /// What the pass computes.
    pub name: &'static str,
    /// Sequences.
    pub rows: usize,
    /// Input tokens per sequence.
    pub tokens: usize,
    /// Key positions each query can see (`tokens`, or `prompt + tokens` for completions that
    /// attend to a shared prompt).
    pub keys: usize,
}

impl Pass {
    /// `rows x tokens`.
    pub fn total_tokens(&self) -> usize {
        self.rows * self.tokens
    }
}

/// Bytes of a set of buffers, with the part in buffers of at least [`MMAP_THRESHOLD`] bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Sized {
    /// All of them.
    pub bytes: u64,
    /// Those the allocator maps fresh (see [`MMAP_THRESHOLD`]).
    pub fresh_bytes: u64,
}

impl Sized {
    /// Buffers of the given sizes.
    pub fn of(sizes: impl IntoIterator<Item = u64>) -> Self {
        sizes
            .into_iter()
            .fold(Sized::default(), |a, s| a + Sized::one(s))
    }

    /// One buffer of `bytes`.
    pub fn one(bytes: u64) -> Self {
        Sized {
            bytes,
            fresh_bytes: if bytes >= MMAP_THRESHOLD { bytes } else { 0 },
        }
    }

    /// `n` buffers of `bytes` each.
    pub fn times(bytes: u64, n: u64) -> Self {
        let one = Sized::one(bytes);
        Sized {
            bytes: one.bytes * n,
            fresh_bytes: one.fresh_bytes * n,
        }
    }
}

impl std::ops::Add for Sized {
    type Output = Sized;
    fn add(self, o: Sized) -> Sized {
        Sized {
            bytes: self.bytes + o.bytes,
            fresh_bytes: self.fresh_bytes + o.fresh_bytes,
        }
    }
}

/// One named part of the activations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Part {
    /// What it is.
    pub name: String,
    /// Its buffers.
    #[serde(flatten)]
    pub size: Sized,
}

/// A micro-batch's activations, itemised.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Activations {
    /// Which kernels the estimate assumes.
    pub kernels: Kernels,
    /// Which LM head.
    pub head: HeadKernel,
    /// The forward passes of one micro-batch.
    pub passes: Vec<Pass>,
    /// Rows the LM head scores (completion positions).
    pub head_rows: usize,
    /// What one layer keeps, per token / score.
    pub layer_tensors: Vec<SavedTensor>,
    /// Decoder layers.
    pub layer_count: usize,
    /// All layers over all passes.
    pub layers: Sized,
    /// Everything else: embeddings, final norm, shared-prompt keys/values, LM head, backward
    /// buffers.
    pub extra: Vec<Part>,
    /// The part of `extra` alive only while the forward's head or the backward runs (the head's
    /// blocks, gradients in flight, the embedding's partial sums): two graphs backpropagated
    /// one after the other (PPO's policy and critic) hold the larger of theirs, not both.
    pub working_set: Sized,
    /// Sum.
    pub total: Sized,
}

/// One layer's saved tensors over a set of passes: one buffer per tensor and pass.
pub fn layer_size(dims: &ModelDims, tensors: &[SavedTensor], passes: &[Pass]) -> Sized {
    let mut out = Sized::default();
    for p in passes {
        let tokens = p.total_tokens() as u64;
        let scores = (p.rows * dims.heads * p.tokens * p.keys) as u64;
        for t in tensors {
            out = out
                + Sized::one(tokens * t.bytes_per_token as u64 + scores * t.bytes_per_score as u64);
        }
    }
    out
}

/// Inputs of [`activations`] beyond the model and tuning.
#[derive(Debug, Clone, Copy)]
pub struct MicroBatch<'a> {
    /// The passes.
    pub passes: &'a [Pass],
    /// Rows through the LM head.
    pub head_rows: usize,
    /// Completions whose prompt keys/values are gathered from a shared prompt pass:
    /// `(completions, prompt tokens)`, per layer two `index_select` outputs and two `cat`s.
    pub shared_prompt: Option<(usize, usize)>,
    /// Hidden rows are divided by the sampling temperature before the head (GRPO, T != 1).
    pub temperature_scaled: bool,
    /// Activation checkpointing: each layer's input is kept, and one layer's internals at a
    /// time (its recomputation in the backward).
    pub checkpointing: bool,
}

/// The activations of one micro-batch's forward + backward.
pub fn activations(
    dims: &ModelDims,
    tuning: &Tuning,
    kernels: Kernels,
    head: HeadKernel,
    mb: &MicroBatch<'_>,
) -> Activations {
    let tensors = layer_saved(dims, kernels, tuning);
    let act_bytes = match kernels {
        Kernels::Fused => 4u64,
        Kernels::Composite => 2,
    };
    let (h, v) = (dims.hidden as u64, dims.vocab as u64);
    let one_layer = layer_size(dims, &tensors, mb.passes);
    let n_layers = dims.layers as u64;
    let tokens: u64 = mb.passes.iter().map(|p| p.total_tokens() as u64).sum();
    let h_bytes = tokens * dims.hidden as u64 * act_bytes;
    // With checkpointing: every layer's input, the last output's leaf copy and the
    // recomputed layer's input copy, and one layer's internals.
    let (layers, layer_copies) = if mb.checkpointing {
        (one_layer + Sized::times(h_bytes, n_layers + 2), 1)
    } else {
        (
            Sized {
                bytes: one_layer.bytes * n_layers,
                fresh_bytes: one_layer.fresh_bytes * n_layers,
            },
            n_layers,
        )
    };
    // One buffer per pass of `per_token` bytes per token.
    let per_pass = |per_token: u64| {
        Sized::of(
            mb.passes
                .iter()
                .map(|p| p.total_tokens() as u64 * per_token),
        )
    };
    let mut extra: Vec<Part> = Vec::new();
    let mut push = |name: String, size: Sized| extra.push(Part { name, size });
    push("token embeddings".into(), per_pass(h * act_bytes));
    let final_norm = match kernels {
        Kernels::Fused => per_pass(h * 4),
        Kernels::Composite => {
            per_pass(h * 4) + per_pass(h * 4) + per_pass(h * 4) + per_pass(h * 2) + per_pass(h * 2)
        }
    };
    push("final norm".into(), final_norm);
    if let Some((n, prompt)) = mb.shared_prompt {
        // Per layer: the prompt pass's v made contiguous ([prompts, kvh, prompt, d]), k and v
        // of the prompt gathered per completion ([n, kvh, prompt, d] x 2), and their cat with
        // the completion's own ([n, kvh, prompt + t, d] x 2).
        let t = mb.passes.last().map_or(0, |p| p.tokens) as u64;
        let prompts = mb.passes.first().map_or(0, |p| p.rows) as u64;
        let (n, p, kvd) = (n as u64, prompt as u64, dims.kv_dim() as u64);
        let per_layer = Sized::one(prompts * p * kvd * act_bytes)
            + Sized::times(n * p * kvd * act_bytes, 2)
            + Sized::times(n * (p + t) * kvd * act_bytes, 2);
        push(
            "shared-prompt keys/values (gather + cat)".into(),
            Sized {
                bytes: per_layer.bytes * layer_copies,
                fresh_bytes: per_layer.fresh_bytes * layer_copies,
            },
        );
    }
    let r = mb.head_rows as u64;
    // The positions the head scores, copied out of the hidden states ([rows, hidden]), and
    // divided by the temperature.
    let copies = 1 + u64::from(mb.temperature_scaled);
    push(
        match head {
            HeadKernel::Score => "score head input rows".into(),
            _ => "LM head input rows".into(),
        },
        Sized::times(r * h * act_bytes, copies),
    );
    let chunk = r.min(HEAD_CHUNK as u64);
    let full = matches!(tuning, Tuning::Full);
    let (head_saved, head_bwd) = match head {
        HeadKernel::Chunked => {
            // Per block: logits (+ their f32 cast for bf16), logits - max, exp.
            let blocks = r / HEAD_CHUNK as u64;
            let last = r % HEAD_CHUNK as u64;
            let block = |rows: u64| {
                let f = Sized::times(rows * v * 4, 3);
                match kernels {
                    Kernels::Fused => f,
                    Kernels::Composite => f + Sized::one(rows * v * 2),
                }
            };
            let mut saved = Sized::default();
            for _ in 0..blocks {
                saved = saved + block(HEAD_CHUNK as u64);
            }
            if last > 0 {
                saved = saved + block(last);
            }
            (
                saved,
                Sized::times(chunk * v * 4, HEAD_BACKWARD_CHUNKS as u64),
            )
        }
        HeadKernel::Fused => {
            // Frozen head: d out / d hidden [rows, h] (f32); trainable: lse [rows], and the
            // probabilities [rows, vocab] when they are few enough to keep.
            let keep = full && r * v <= FUSED_HEAD_KEEP as u64;
            let saved = Sized::one(match (full, keep) {
                (true, true) => r * 4 + r * v * 4,
                (true, false) => r * 4,
                (false, _) => r * h * 4,
            });
            // The forward's logits block (kept ones are counted above; p @ W for a frozen
            // head), or the backward's [rows, hidden] input gradient with, for a trainable
            // head, a logits tile.
            let rows = (FUSED_HEAD_FWD_BLOCK as u64 / v.max(1))
                .max(FUSED_HEAD_MIN_ROWS as u64)
                .min(r.max(1));
            let block = if keep { 0 } else { rows * v * 4 };
            let fwd = Sized::one(block) + Sized::one(rows * h * 4);
            let tile = if full {
                Sized::one((FUSED_HEAD_BWD_TILE as u64).min(r * v) * 4)
            } else {
                Sized::default()
            };
            let bwd = tile + Sized::one(r * h * 4);
            (saved, if fwd.bytes >= bwd.bytes { fwd } else { bwd })
        }
        HeadKernel::Score => {
            // [rows, 1] scores in the run's dtype, their f32 cast and the masked values; the
            // backward's [rows, hidden] input gradient.
            (
                Sized::one(r * (act_bytes + 8)),
                Sized::one(r * h * act_bytes),
            )
        }
    };
    push(
        match head {
            HeadKernel::Chunked => format!(
                "LM head logits ({} x [<= {HEAD_CHUNK}, {}] blocks x 3)",
                r.div_ceil(HEAD_CHUNK as u64),
                dims.vocab
            ),
            HeadKernel::Fused if full && r * v <= FUSED_HEAD_KEEP as u64 => {
                "LM head (fused): log-sum-exp per row and the [rows, vocab] probabilities".into()
            }
            HeadKernel::Fused if full => "LM head (fused): log-sum-exp per row".into(),
            HeadKernel::Fused => "LM head (fused): input gradient [rows, h]".into(),
            HeadKernel::Score => "score head: values per row".into(),
        },
        head_saved,
    );
    let mut working_set = head_bwd;
    push(
        match head {
            HeadKernel::Score => "score head backward buffers".into(),
            _ => "LM head forward/backward buffers".into(),
        },
        head_bwd,
    );
    let i = dims.intermediate as u64;
    let in_flight = Sized::times(tokens * i * 4, BACKWARD_I as u64)
        + Sized::times(tokens * h * 4, BACKWARD_H as u64);
    working_set = working_set + in_flight;
    push("layer backward gradients in flight".into(), in_flight);
    if full {
        // The embedding (and a tied head) gradient is built as [vocab, hidden] partial sums;
        // the score head is not tied, so the critic's embedding has one.
        let sums = if head == HeadKernel::Score { 1 } else { 2 };
        let partial = Sized::times(v * h * act_bytes, sums);
        working_set = working_set + partial;
        push("embedding/head gradient partial sums".into(), partial);
    }
    let total = extra.iter().fold(layers, |a, p| a + p.size);
    Activations {
        kernels,
        head,
        passes: mb.passes.to_vec(),
        head_rows: mb.head_rows,
        layer_tensors: tensors,
        layer_count: dims.layers,
        layers,
        extra,
        working_set,
        total,
    }
}

/// Bytes a no-grad log-prob pass (reference, old policy, SFT eval; `head` the LM head the
/// kernels run) or value pass (PPO's critic, [`HeadKernel::Score`]) holds at its peak: the
/// hidden states, one layer's temporaries, and the head's logits block (the composite's with
/// its shifted copy and `exp`; the score head's values).
pub fn no_grad_pass(
    dims: &ModelDims,
    kernels: Kernels,
    head: HeadKernel,
    passes: &[Pass],
    head_rows: usize,
) -> Sized {
    let (h, i, qd, kvd) = (
        dims.hidden as u64,
        dims.intermediate as u64,
        dims.q_dim() as u64,
        dims.kv_dim() as u64,
    );
    let act = match kernels {
        Kernels::Fused => 4,
        Kernels::Composite => 2,
    };
    // Per pass: x, hs, q, k, v, attention out, o, gate, up, act at once.
    let mut out = Sized::default();
    for p in passes {
        let t = p.total_tokens() as u64;
        out = out
            + Sized::times(t * h * act, 4)
            + Sized::times(t * qd * act, 2)
            + Sized::times(t * kvd * act, 2)
            + Sized::times(t * i * act, 3);
        if kernels == Kernels::Composite {
            // Scores, masked scores and probabilities of one layer (f32).
            out = out + Sized::times((p.rows * dims.heads * p.tokens * p.keys) as u64 * 4, 3);
        }
    }
    let v = dims.vocab as u64;
    let head = match head {
        HeadKernel::Score => Sized::one(head_rows as u64 * 8),
        HeadKernel::Chunked => Sized::times((head_rows as u64).min(HEAD_CHUNK as u64) * v * 4, 3),
        HeadKernel::Fused => {
            let rows = (FUSED_HEAD_FWD_BLOCK as u64 / v.max(1))
                .max(FUSED_HEAD_MIN_ROWS as u64)
                .min(head_rows.max(1) as u64);
            Sized::one(rows * v * 4)
        }
    };
    out + head + Sized::one(head_rows as u64 * h * act)
}
