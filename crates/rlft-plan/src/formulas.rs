//! The formulas: parameters and tensors of a model, KV caches and generation, and the
//! activations a micro-batch keeps for its backward, in units of the model's dimensions.

use serde::Serialize;

use crate::{MicroBatch, Model, ModelDims, Run, Tuning, MMAP_THRESHOLD};

/// Bytes of a set of buffers, with the part in buffers of at least [`MMAP_THRESHOLD`] bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Sized {
    /// All of them.
    pub bytes: u64,
    /// Those the allocator maps fresh.
    pub fresh_bytes: u64,
}

impl Sized {
    /// `bytes` in all, `fresh_bytes` of them in fresh buffers.
    pub fn new(bytes: u64, fresh_bytes: u64) -> Self {
        Sized { bytes, fresh_bytes }
    }

    /// One buffer of `bytes`.
    pub fn one(bytes: u64) -> Self {
        Sized::new(bytes, if bytes >= MMAP_THRESHOLD { bytes } else { 0 })
    }

    /// `n` buffers of `bytes` each.
    pub fn times(bytes: u64, n: u64) -> Self {
        Sized::one(bytes) * n
    }

    /// Buffers of the given sizes.
    pub fn of(sizes: impl IntoIterator<Item = u64>) -> Self {
        sizes.into_iter().map(Sized::one).sum()
    }

    /// Small buffers (heap) of `bytes` in all.
    pub fn heap(bytes: u64) -> Self {
        Sized::new(bytes, 0)
    }

    /// The one with more bytes (`self` on a tie).
    pub fn larger(self, o: Sized) -> Sized {
        std::cmp::max_by_key(o, self, |s| s.bytes)
    }
}

impl std::ops::Add for Sized {
    type Output = Sized;
    fn add(self, o: Sized) -> Sized {
        Sized::new(self.bytes + o.bytes, self.fresh_bytes + o.fresh_bytes)
    }
}

impl std::ops::Mul<u64> for Sized {
    type Output = Sized;
    fn mul(self, n: u64) -> Sized {
        Sized::new(self.bytes * n, self.fresh_bytes * n)
    }
}

impl std::iter::Sum for Sized {
    fn sum<I: Iterator<Item = Sized>>(it: I) -> Sized {
        it.fold(Sized::default(), |a, s| a + s)
    }
}

impl ModelDims {
    /// `heads x head_dim`.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// `kv_heads x head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// `[hidden, intermediate, q_dim, kv_dim, vocab, layers]` as `u64`.
    fn wide(&self) -> [u64; 6] {
        let (h, i, q, kv) = (self.hidden, self.intermediate, self.q_dim(), self.kv_dim());
        [h, i, q, kv, self.vocab, self.layers].map(|x| x as u64)
    }

    /// `(module, out, in)` of one layer's linears, in `rlft_model::lora::LORA_MODULES` order.
    pub fn linears(&self) -> [(&'static str, usize, usize); 7] {
        let (h, i, q, kv) = (self.hidden, self.intermediate, self.q_dim(), self.kv_dim());
        [
            ("self_attn.q_proj", q, h),
            ("self_attn.k_proj", kv, h),
            ("self_attn.v_proj", kv, h),
            ("self_attn.o_proj", h, q),
            ("mlp.gate_proj", i, h),
            ("mlp.up_proj", i, h),
            ("mlp.down_proj", h, i),
        ]
    }

    /// Elements of the biases one layer has (full fine-tuning trains them outside the linear).
    fn layer_biases(&self) -> Vec<u64> {
        let [h, i, q, kv, ..] = self.wide();
        let has = [self.qkv_bias, self.o_bias, self.mlp_bias];
        let sizes = [q + 2 * kv, h, 2 * i + h].into_iter().zip(has);
        sizes.filter_map(|(n, on)| on.then_some(n)).collect()
    }

    /// Elements of every weight tensor, as `CausalLm::named_weights` holds them: embedding,
    /// untied head, per layer the linears, norms (q/k norms) and biases, the final norm.
    pub fn weight_tensors(&self) -> Vec<u64> {
        let (h, v, hd) = (self.hidden as u64, self.vocab as u64, self.head_dim as u64);
        let mut out = vec![v * h; 2 - usize::from(self.tied_embeddings)];
        for _ in 0..self.layers {
            out.extend(self.linears().iter().map(|&(_, o, i)| (o * i) as u64));
            out.extend([h, h]);
            out.extend(if self.qk_norm { vec![hd, hd] } else { vec![] });
            out.extend(self.layer_biases());
        }
        out.push(h);
        out
    }

    /// Every parameter `P` (a tied head once).
    pub fn num_parameters(&self) -> usize {
        self.weight_tensors().iter().sum::<u64>() as usize
    }

    /// Elements of the largest weight tensor (the embedding, or an MLP matrix).
    pub fn largest_tensor(&self) -> usize {
        (self.vocab * self.hidden).max(self.intermediate * self.hidden)
    }

    /// `(out, in)` of the linears `tuning` adapts, over all layers.
    pub fn adapted(&self, tuning: &Tuning) -> Vec<(usize, usize)> {
        let Tuning::Lora(l) = tuning else {
            return Vec::new();
        };
        let linears = self.linears();
        let one = linears.iter().filter(|x| l.modules.contains(&x.0));
        let one: Vec<_> = one.map(|x| (x.1, x.2)).collect();
        one.repeat(self.layers)
    }

    /// Elements of every trainable tensor: every weight, or the adapters' `A [r, in]` and
    /// `B [out, r]`.
    pub fn trainable_tensors(&self, tuning: &Tuning) -> Vec<u64> {
        match tuning {
            Tuning::Full => self.weight_tensors(),
            Tuning::Lora(l) => {
                let ab = |(o, i): (usize, usize)| [(l.r * i) as u64, (o * l.r) as u64];
                self.adapted(tuning).into_iter().flat_map(ab).collect()
            }
        }
    }
}

/// Tensors of `elems` elements at `bytes` each.
pub fn tensors(elems: &[u64], bytes: u64) -> Sized {
    Sized::of(elems.iter().map(|e| e * bytes))
}

/// Generation: a KV cache per row and layer for prompt and new tokens, two `[rows, vocab]` f32
/// logits, and the larger of the prefill's buffers and the prompts' caches (copied to the rows).
pub fn generation(dims: &ModelDims, g: &crate::Generation, kv_bytes: u64) -> Sized {
    let (rows, l) = ((g.prompts * g.per_prompt) as u64, dims.layers as u64);
    // One row's k (or v) of one layer for `positions`: `kv_dim x positions`.
    let one = |positions: usize| (dims.kv_dim() * positions) as u64 * kv_bytes;
    let kv = Sized::times(one(g.prompt_tokens + g.new_tokens), rows * 2 * l);
    let logits = Sized::times(rows * dims.vocab as u64 * 4, 2);
    let prefill = no_grad_layer(dims, (g.prompts * g.prompt_tokens) as u64, 4, 2);
    let caches = Sized::times(one(g.prompt_tokens), g.prompts as u64 * 2 * l);
    kv + logits + prefill.larger(caches)
}

/// Which training kernels the forward runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kernels {
    /// `rlft_kernels::fused` (f32 on the CPU): a node per norm, linear, RoPE, SwiGLU, attention.
    Fused,
    /// candle's composites (bf16 on the CPU): each op keeps its inputs, attention its scores.
    Composite,
}

/// The head a micro-batch's rows go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadKernel {
    /// The composite LM head: `[HEAD_CHUNK, vocab]` logits blocks through `log_sum_exp`.
    Chunked,
    /// `rlft_kernels::fused::head`: logits a block of rows at a time.
    Fused,
    /// The `[1, hidden]` score head: a value per row.
    Score,
}

/// Rows of logits the composite head computes at a time (`trainable::LOGPROB_CHUNK`).
pub const HEAD_CHUNK: u64 = 256;
/// `[chunk, vocab]` f32 buffers the composite head's backward holds besides the saved ones.
pub const HEAD_BACKWARD_CHUNKS: u64 = 4;
/// Elements of the fused head's forward logits block (`fused::head::FWD_TILE`).
pub const FUSED_HEAD_FWD_BLOCK: u64 = 1 << 23;
/// Fewest rows of a forward block (`fused::head::FWD_MIN_ROWS`).
pub const FUSED_HEAD_MIN_ROWS: u64 = 32;
/// Elements of the fused head's backward logits tile (`fused::head::BWD_TILE`).
pub const FUSED_HEAD_BWD_TILE: u64 = 1 << 21;
/// The most `[rows, vocab]` probabilities a trainable fused head keeps for its backward
/// (`fused::head::KEEP_PROBS`); above it the backward recomputes logits tiles.
pub const FUSED_HEAD_KEEP: u64 = 1 << 25;

/// Rows of the fused head's forward logits block for `rows` rows of a `vocab` vocabulary.
fn fused_head_rows(vocab: u64, rows: u64) -> u64 {
    let per_block = FUSED_HEAD_FWD_BLOCK / vocab.max(1);
    per_block.max(FUSED_HEAD_MIN_ROWS).min(rows.max(1))
}

/// Bytes per (head, query, key) the composite attention keeps: bf16 scores and scaled scores,
/// f32 cast, masked, shifted, `exp` and probabilities, bf16 probabilities (2+2+4x5+2).
pub const SCORE_BYTES: u64 = 26;

/// Bytes one decoder layer keeps for the backward per token of a pass (the layer's input
/// counted with the previous layer), measured by `crates/rlft/tests/plan_activations.rs`:
///
/// - fused f32: `4 x (6 h + 3 q + 3 kv + 3 i)`: the input norm's output, q/k/v, q/k after
///   RoPE, the attention output, o_proj's output and the residual, the second norm, gate, up,
///   SwiGLU, down and the residual. Qwen3's q/k norms add `4 x 2 (q + kv)`; LoRA keeps `x A^T`
///   (`4 r` per adapted module), with dropout an f32 mask per adapted input;
/// - composite bf16: `40 h + 18 q + 15 kv + 8 i`: norms in f32 (16 bytes x h each), RoPE as
///   several tensors (about 10 bytes x (q + kv)), the copies around the attention; LoRA adds
///   `4 in + 4 r + 18 out` per adapted module (f32 adapters over the bf16 output), `12 in`
///   with dropout; q/k norms `16 (q + kv)`; attention scores are [`SCORE_BYTES`] apart;
/// - full fine-tuning with biases: the outputs before each trainable bias.
pub fn layer_bytes_per_token(dims: &ModelDims, kernels: Kernels, tuning: &Tuning) -> u64 {
    let (h, q, kv, i) = (dims.hidden, dims.q_dim(), dims.kv_dim(), dims.intermediate);
    let (r, dropout, biases) = match tuning {
        Tuning::Lora(l) => (l.r, usize::from(l.dropout), 0),
        Tuning::Full => (0, 0, dims.layer_biases().iter().sum::<u64>() as usize),
    };
    // One layer's adapted linears: their inputs, outputs and count.
    let adapted = dims.adapted(tuning);
    let one = &adapted[..adapted.len() / dims.layers.max(1)];
    let (ins, outs) = one.iter().fold((0, 0), |(a, b), x| (a + x.1, b + x.0));
    let qk = usize::from(dims.qk_norm) * (q + kv);
    let bytes = match kernels {
        Kernels::Fused => {
            4 * (6 * h + 3 * q + 3 * kv + 3 * i + 2 * qk + dropout * ins + r * one.len() + biases)
        }
        Kernels::Composite => {
            let adapters = (4 + 8 * dropout) * ins + 4 * r * one.len() + 18 * outs;
            40 * h + 18 * q + 15 * kv + 8 * i + 16 * qk + adapters + 2 * biases
        }
    };
    bytes as u64
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
    /// The kernels.
    pub kernels: Kernels,
    /// The head.
    pub head: HeadKernel,
    /// The micro-batch.
    pub micro_batch: MicroBatch,
    /// Bytes one layer keeps per token ([`layer_bytes_per_token`]).
    pub layer_bytes_per_token: u64,
    /// Bytes per (head, query, key): [`SCORE_BYTES`] on the composite path, else 0.
    pub layer_bytes_per_score: u64,
    /// Decoder layers.
    pub layer_count: usize,
    /// All layers over all passes.
    pub layers: Sized,
    /// Embeddings, final norm, shared-prompt gathers, the head, backward buffers.
    pub extra: Vec<Part>,
    /// The part of `extra` alive only while the head or the backward runs (PPO: larger counts).
    pub working_set: Sized,
    /// Sum.
    pub total: Sized,
}

/// Per-token f32 elements of the gradients in flight through a layer in the backward:
/// `BACKWARD_I x intermediate + BACKWARD_H x hidden` (the MLP's three `[tokens, i]`
/// gradients and the residual stream's partial sums).
pub const BACKWARD_I: u64 = 3;
/// See [`BACKWARD_I`].
pub const BACKWARD_H: u64 = 4;

/// The activations of one micro-batch's forward + backward through `m` of `run`, with
/// `checkpointing` keeping each layer's input and one layer's internals at a time.
pub fn activations(run: &Run, m: &Model, mb: &MicroBatch, checkpointing: bool) -> Activations {
    let (tuning, kernels) = (&run.tuning, run.kernels());
    let (dims, head, fused) = (&m.dims, m.head(kernels), kernels == Kernels::Fused);
    let (act, per_score, mlp) = match kernels {
        Kernels::Fused => (4, 0, 3),
        Kernels::Composite => (2, SCORE_BYTES, 4),
    };
    let [h, i, _, kvd, v, nl] = dims.wide();
    let per_token = layer_bytes_per_token(dims, kernels, tuning);
    let tokens = mb.tokens() as u64;
    // One layer's buffers, for the mmap threshold: the MLP's `[tokens, i]` tensors (3 fused,
    // 4 composite), the rest as `[tokens, h]` tensors and a small remainder; scores as 5 f32
    // and 3 bf16 buffers per pass.
    let rest = per_token.saturating_sub(mlp * i * act);
    let mut one = Sized::default();
    for p in &mb.passes {
        let t = p.total_tokens() as u64;
        let widths = Sized::times(t * i * act, mlp) + Sized::times(t * h * act, rest / (h * act));
        one = one + widths + Sized::heap(t * (rest % (h * act)));
        if per_score > 0 {
            let s = (p.rows * dims.heads * p.tokens * p.keys) as u64;
            one = one + Sized::times(s * 4, 5) + Sized::times(s * 2, 3);
        }
    }
    let (layers, copies) = match checkpointing {
        true => (one + Sized::times(tokens * h * act, nl + 2), 1),
        false => (one * nl, nl),
    };
    let per_pass = |b: u64| Sized::of(mb.passes.iter().map(|p| p.total_tokens() as u64 * b));
    let mut extra = Vec::new();
    let mut push = |name: &str, size| extra.push((name.to_string(), size));
    push("token embeddings", per_pass(h * act));
    push("final norm", per_pass(h * if fused { 4 } else { 16 }));
    if let Some((n, p)) = mb.shared_prompt {
        // Per layer: the prompt pass's v made contiguous, k and v gathered per completion,
        // and their cat with the completion's own.
        let t = mb.passes.last().map_or(0, |x| x.tokens) as u64;
        let prompts = mb.passes.first().map_or(0, |x| x.rows) as u64;
        let (n, p, kvd) = (n as u64, p as u64, kvd * act);
        let layer = Sized::one(prompts * p * kvd)
            + Sized::times(n * p * kvd, 2)
            + Sized::times(n * (p + t) * kvd, 2);
        push("shared-prompt keys/values (gather + cat)", layer * copies);
    }
    let (r, score) = (mb.head_rows as u64, head == HeadKernel::Score);
    let rows = Sized::times(r * h * act, 1 + u64::from(mb.temperature_scaled));
    let (head_name, passes) = match score {
        true => ("score head", "backward"),
        false => ("LM head", "forward/backward"),
    };
    push(&format!("{head_name} input rows"), rows);
    let full = matches!(tuning, Tuning::Full);
    let keep = full && r * v <= FUSED_HEAD_KEEP;
    let (name, saved, bwd) = match head {
        HeadKernel::Chunked => {
            // Per block: logits (and their f32 cast for bf16), shifted logits, `exp`.
            let block = |rows: u64| {
                Sized::times(rows * v * 4, 3) + Sized::one(rows * v * 2) * u64::from(!fused)
            };
            let starts = (0..r).step_by(HEAD_CHUNK as usize);
            let s: Sized = starts.map(|at| block((r - at).min(HEAD_CHUNK))).sum();
            let blocks = r.div_ceil(HEAD_CHUNK);
            let name = format!("LM head logits ({blocks} x [<= {HEAD_CHUNK}, {v}] blocks x 3)");
            let bwd = Sized::times(r.min(HEAD_CHUNK) * v * 4, HEAD_BACKWARD_CHUNKS);
            (name, s, bwd)
        }
        HeadKernel::Fused => {
            // Frozen head: d out / d hidden [rows, h]; trainable: lse per row, and the
            // probabilities when few enough. In flight: the forward's logits block, or the
            // backward's input gradient with (trainable) a logits tile.
            let (saved, name) = match (full, keep) {
                (true, true) => (
                    r * 4 + r * v * 4,
                    "LM head (fused): log-sum-exp per row and the [rows, vocab] probabilities",
                ),
                (true, false) => (r * 4, "LM head (fused): log-sum-exp per row"),
                (false, _) => (r * h * 4, "LM head (fused): input gradient [rows, h]"),
            };
            let fwd_rows = fused_head_rows(v, r);
            let block = if keep { 0 } else { fwd_rows * v * 4 };
            let fwd = Sized::one(block) + Sized::one(fwd_rows * h * 4);
            let tile = FUSED_HEAD_BWD_TILE.min(r * v) * 4 * u64::from(full);
            let bwd = Sized::of([tile, r * h * 4]);
            (name.into(), Sized::one(saved), fwd.larger(bwd))
        }
        // Scores in the run's dtype, their f32 cast and the masked values; the backward's
        // [rows, hidden] input gradient.
        HeadKernel::Score => (
            "score head: values per row".into(),
            Sized::one(r * (act + 8)),
            Sized::one(r * h * act),
        ),
    };
    push(&name, saved);
    push(&format!("{head_name} {passes} buffers"), bwd);
    let in_flight =
        Sized::times(tokens * i * 4, BACKWARD_I) + Sized::times(tokens * h * 4, BACKWARD_H);
    push("layer backward gradients in flight", in_flight);
    let mut working_set = bwd + in_flight;
    if full {
        // The embedding (and a tied head) gradient as [vocab, hidden] partial sums; a score
        // model's embedding has one.
        let partial = Sized::times(v * h * act, if score { 1 } else { 2 });
        working_set = working_set + partial;
        push("embedding/head gradient partial sums", partial);
    }
    let total = extra.iter().fold(layers, |a, p| a + p.1);
    let extra = extra.into_iter().map(|(name, size)| Part { name, size });
    Activations {
        kernels,
        head,
        micro_batch: mb.clone(),
        layer_bytes_per_token: per_token,
        layer_bytes_per_score: per_score,
        layer_count: dims.layers,
        layers,
        extra: extra.collect(),
        working_set,
        total,
    }
}

/// One layer's temporaries of a forward without graph over `t` tokens: x, the norm's output,
/// q, k, v, the attention output, o, and `mlp` MLP-wide tensors, at `act` bytes.
fn no_grad_layer(dims: &ModelDims, t: u64, act: u64, mlp: u64) -> Sized {
    let [h, i, q, kv, ..] = dims.wide();
    let each = |width: u64, n: u64| Sized::times(t * width * act, n);
    each(h, 4) + each(q, 2) + each(kv, 2) + each(i, mlp)
}

/// Bytes a no-grad log-prob pass (or a score model's value pass) holds at its peak: one
/// layer's temporaries (composite: and its scores, masked scores and probabilities in f32),
/// the rows the head reads, and the head's logits block (or values).
pub fn no_grad_pass(m: &Model, kernels: Kernels, mb: &MicroBatch) -> Sized {
    let act = if kernels == Kernels::Fused { 4 } else { 2 };
    let (dims, mut out) = (&m.dims, Sized::default());
    for p in &mb.passes {
        out = out + no_grad_layer(dims, p.total_tokens() as u64, act, 3);
        if kernels == Kernels::Composite {
            out = out + Sized::times((p.rows * dims.heads * p.tokens * p.keys) as u64 * 4, 3);
        }
    }
    let (v, r) = (dims.vocab as u64, mb.head_rows as u64);
    let head = match m.head(kernels) {
        HeadKernel::Score => Sized::one(r * 8),
        HeadKernel::Chunked => Sized::times(r.min(HEAD_CHUNK) * v * 4, 3),
        HeadKernel::Fused => Sized::one(fused_head_rows(v, r) * v * 4),
    };
    out + head + Sized::one(r * dims.hidden as u64 * act)
}

impl Model {
    /// Elements of every weight tensor: the decoder's ([`ModelDims::weight_tensors`]; an
    /// untied LM head dropped when headless) and the `[1, hidden]` score head.
    pub fn weight_tensors(&self) -> Vec<u64> {
        let mut w = self.dims.weight_tensors();
        if self.headless && !self.dims.tied_embeddings {
            w.remove(1);
        }
        w.extend(self.score_head.then_some(self.dims.hidden as u64));
        w
    }

    /// Elements of every trainable tensor: every weight, or the adapters (and a score head,
    /// which trains in place beside them).
    pub fn trainable_tensors(&self, tuning: &Tuning) -> Vec<u64> {
        let Tuning::Lora(_) = tuning else {
            return self.weight_tensors();
        };
        let mut t = self.dims.trainable_tensors(tuning);
        t.extend(self.score_head.then_some(self.dims.hidden as u64));
        t
    }

    /// The trainable tensors that get a gradient: all but a score model's unused `lm_head`.
    pub fn gradient_tensors(&self, tuning: &Tuning) -> Vec<u64> {
        let mut t = self.trainable_tensors(tuning);
        if matches!(tuning, Tuning::Full) && self.unused_lm_head() {
            t.remove(1);
        }
        t
    }

    /// A score model that keeps its causal LM's untied `lm_head`, unused.
    pub fn unused_lm_head(&self) -> bool {
        self.score_head && !self.headless && !self.dims.tied_embeddings
    }

    /// Parameters (a score head included).
    pub fn parameters(&self) -> usize {
        self.weight_tensors().iter().sum::<u64>() as usize
    }

    /// The head its rows go through with `kernels`.
    pub fn head(&self, kernels: Kernels) -> HeadKernel {
        match (self.score_head, kernels) {
            (true, _) => HeadKernel::Score,
            (false, Kernels::Fused) => HeadKernel::Fused,
            (false, Kernels::Composite) => HeadKernel::Chunked,
        }
    }
}
