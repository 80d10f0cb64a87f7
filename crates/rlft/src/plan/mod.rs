//! `rlft plan`: the peak memory (RSS) of a training run, predicted before it starts, with its
//! parts and what to change when it does not fit.
//!
//! A run goes through phases, and what is alive differs between them:
//!
//! | phase | alive besides the process baseline, the policy weights and (after the first step) the optimizer state |
//! |---|---|
//! | `load` | the file being read (a GGUF whole, or the largest safetensors shard), the largest tensor's f32 conversion; with full fine-tuning the loaded weights while their trainable copies are made |
//! | `critic_load` | PPO: the policy loaded, the critic's file (and GGUF blocks) being read, or its trainable copies being made |
//! | `eval` | GRPO eval generation: KV caches of 16 prompts (bf16 LoRA: the merged rollout copy) |
//! | `generate` | KV caches of every completion of a rollout (bf16 LoRA: the merged copy) |
//! | `reward` | `[[rewards]] type = "model"`: a reward model's no-grad scoring pass ([`reward`]) |
//! | `score` | a no-grad log-prob pass (GRPO / Online DPO reference or old policy, DPO reference or eval, SFT eval loss, reward-model eval scores) |
//! | `values` | PPO: the critic's no-grad value pass over a micro-batch of completions |
//! | `update` | gradients (the micro-batch's and the accumulated sums; one set with a single f32 micro-batch), one micro-batch's activations (PPO: the policy's and the critic's) |
//! | `checkpoint` | a copy of the optimizer state, each tensor's write buffers |
//! | `export` | the final model: the LoRA-merged copy, the write buffer (bf16: an f32 copy) |
//! | `critic_export` | PPO: the critic's merged copy and write buffers, after the policy's export |
//!
//! Phases do not add up: what a phase frees goes back to the heap, which the next reuses (the
//! allocator keeps it: `rlft_kernels::alloc`). So RSS after loading is the heap's high-water mark
//! (the largest heap footprint of any phase) plus the buffers of at least [`MMAP_THRESHOLD`]
//! bytes, which get fresh pages, unless a phase's own large buffers fit in the heap's free
//! memory ([`HEAP_REUSE_FACTOR`]); the predicted peak is the largest phase RSS. Every size is a
//! pure function of the model's shape and the config ([`estimate`]); the per-layer tensors the
//! backward needs are listed in [`activations`]. `docs/memory.md` has the predicted-vs-measured
//! table and how to re-measure.
//!
//! Sizes are bytes; `B` is the batch of completions (or examples) per micro-batch, `L` layers,
//! `h` hidden, `V` vocabulary, `P` parameters, `T` trainable parameters.

pub mod activations;
pub mod critic;
pub mod inputs;
pub mod preference;
pub mod reward;
pub mod suggest;

use serde::Serialize;

use rlft_model::ModelConfig;

pub use activations::{
    head_kernel, Activations, HeadKernel, Kernels, Part, Pass, SavedTensor, Sized,
};
pub use critic::CriticShape;
pub use inputs::{
    critic_shape, dpo_lengths, grpo_lengths, model_rewards, reward_model_lengths, run_shape_dpo,
    run_shape_grpo, run_shape_online_dpo, run_shape_reward_model, run_shape_sft, sft_lengths,
};
pub use preference::{DpoReference, DpoShape, RewardModelShape};
pub use reward::ModelRewardShape;
pub use suggest::{suggest, Suggestion};

/// Plan errors; each says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Config problems.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Model metadata problems.
    #[error(transparent)]
    Model(#[from] rlft_model::ModelError),
    /// Dataset files.
    #[error(transparent)]
    Dataset(#[from] rlft_data::DataError),
    /// Dataset contents (prompts, columns, examples).
    #[error("{0}")]
    Data(String),
    /// A shape the plan cannot describe.
    #[error("cannot plan this run: {0}")]
    Invalid(String),
}

/// The dimensions of a decoder-only model that memory depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelDims {
    /// Vocabulary.
    pub vocab: usize,
    /// Hidden size `h`.
    pub hidden: usize,
    /// MLP intermediate size.
    pub intermediate: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// LM head tied to the embeddings (no `lm_head.weight`).
    pub tied_embeddings: bool,
    /// q/k/v biases (Qwen2).
    pub qkv_bias: bool,
    /// o_proj bias.
    pub o_bias: bool,
    /// MLP biases.
    pub mlp_bias: bool,
    /// q/k norms (Qwen3).
    pub qk_norm: bool,
}

impl ModelDims {
    /// The dimensions of `c`.
    pub fn from_config(c: &ModelConfig) -> Self {
        ModelDims {
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            layers: c.num_hidden_layers,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            tied_embeddings: c.tie_word_embeddings,
            qkv_bias: c.attention_bias,
            o_bias: c.attention_bias && c.family != rlft_model::Family::Qwen2,
            mlp_bias: c.mlp_bias,
            qk_norm: c.family.has_qk_norm(),
        }
    }

    /// `heads x head_dim`.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// `kv_heads x head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// `(module, out, in)` of one layer's linear layers, in [`rlft_model::lora::LORA_MODULES`]
    /// order.
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

    /// Parameters of one decoder layer: linear weights and biases, norms.
    pub fn layer_params(&self) -> usize {
        let (h, i, q, kv) = (self.hidden, self.intermediate, self.q_dim(), self.kv_dim());
        let weights: usize = self.linears().iter().map(|(_, o, i)| o * i).sum();
        let mut biases = 0;
        if self.qkv_bias {
            biases += q + 2 * kv;
        }
        if self.o_bias {
            biases += h;
        }
        if self.mlp_bias {
            biases += 2 * i + h;
        }
        let norms = 2 * h + if self.qk_norm { 2 * self.head_dim } else { 0 };
        weights + biases + norms
    }

    /// Every parameter `P` (a tied head counted once), as `CausalLm::named_weights` holds them.
    pub fn num_parameters(&self) -> usize {
        let embed = self.vocab * self.hidden;
        let head = if self.tied_embeddings { 0 } else { embed };
        embed + head + self.layers * self.layer_params() + self.hidden
    }

    /// Elements of the largest weight tensor (the embedding, or a large MLP matrix).
    pub fn largest_tensor(&self) -> usize {
        (self.vocab * self.hidden).max(self.intermediate * self.hidden)
    }
}

/// LoRA adapters: rank and the modules they sit on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoraShape {
    /// Rank `r`.
    pub r: usize,
    /// Adapted modules, entries of [`rlft_model::lora::LORA_MODULES`].
    pub modules: Vec<&'static str>,
    /// `lora_dropout > 0` (the fused op then keeps a mask per adapted module).
    pub dropout: bool,
}

/// What trains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tuning {
    /// Every weight (trainable copies of all `P`).
    Full,
    /// LoRA adapters over frozen weights.
    Lora(LoraShape),
}

impl Tuning {
    /// Trainable parameters `T`.
    pub fn trainable_params(&self, dims: &ModelDims) -> usize {
        match self {
            Tuning::Full => dims.num_parameters(),
            Tuning::Lora(l) => {
                let per_layer: usize = dims
                    .linears()
                    .iter()
                    .filter(|(m, _, _)| l.modules.contains(m))
                    .map(|(_, o, i)| l.r * (o + i))
                    .sum();
                dims.layers * per_layer
            }
        }
    }

    /// Parameters of the weights an adapter changes (what merging copies).
    pub fn merged_params(&self, dims: &ModelDims) -> usize {
        match self {
            Tuning::Full => 0,
            Tuning::Lora(l) => {
                let per_layer: usize = dims
                    .linears()
                    .iter()
                    .filter(|(m, _, _)| l.modules.contains(m))
                    .map(|(_, o, i)| o * i)
                    .sum();
                dims.layers * per_layer
            }
        }
    }
}

/// A GRPO run's shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrpoShape {
    /// Completions per prompt `G`.
    pub num_generations: usize,
    /// Prompts per rollout.
    pub rollout_prompts: usize,
    /// Completions per rollout.
    pub rollout_completions: usize,
    /// Prompt tokens (the longest prompt of the dataset, or `max_prompt_length`).
    pub prompt_tokens: usize,
    /// `max_completion_length`.
    pub completion_tokens: usize,
    /// `beta > 0`: a reference log-prob pass (and with full fine-tuning a reference copy).
    pub reference: bool,
    /// More than one optimiser step per rollout: an old-policy log-prob pass.
    pub old_logprobs: bool,
    /// One prompt pass per distinct prompt of a micro-batch.
    pub share_prompts: bool,
    /// `temperature != 1`: the head's input rows are scaled.
    pub temperature_scaled: bool,
    /// Eval generation, when the run has eval prompts.
    pub eval: Option<EvalPrompts>,
    /// PPO's critic (`advantage_estimator = "gae"`, `value_model`).
    pub critic: Option<CriticShape>,
    /// `[[rewards]] type = "model"`: reward models scoring each rollout.
    pub reward_models: Vec<ModelRewardShape>,
    /// Online DPO (`OnlineDpoConfig::online`): groups of two completions, and the config's
    /// `per_device_train_batch_size` counts prompts (half the completions of a micro-batch).
    pub online_dpo: bool,
}

/// Eval prompts of a GRPO run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EvalPrompts {
    /// Prompts (a run generates for up to 16 at once).
    pub prompts: usize,
    /// Tokens of the longest.
    pub prompt_tokens: usize,
}

/// An SFT run's shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SftShape {
    /// Tokens of the longest example (or `max_length`); a micro-batch feeds one fewer.
    pub example_tokens: usize,
    /// Eval loss passes run (before and after training).
    pub eval: bool,
}

/// The trainer and its shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// `rlft grpo`.
    Grpo(GrpoShape),
    /// `rlft sft`.
    Sft(SftShape),
    /// `rlft dpo`.
    Dpo(DpoShape),
    /// `rlft reward-model`.
    RewardModel(RewardModelShape),
}

/// Everything about a run that its memory depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunShape {
    /// bf16 weights and activations (else f32).
    pub bf16: bool,
    /// Full fine-tuning or LoRA.
    pub tuning: Tuning,
    /// `per_device_train_batch_size`.
    pub micro_batch: usize,
    /// `gradient_accumulation_steps`.
    pub accumulation: usize,
    /// `gradient_checkpointing`: layer inputs kept, layers recomputed in the backward.
    pub gradient_checkpointing: bool,
    /// The trainer and its shapes.
    pub workload: Workload,
}

impl RunShape {
    /// Bytes per weight.
    pub fn weight_bytes(&self) -> u64 {
        if self.bf16 {
            2
        } else {
            4
        }
    }

    /// The training kernels (CPU): fused for f32, candle's composites for bf16.
    pub fn kernels(&self) -> Kernels {
        if self.bf16 {
            Kernels::Composite
        } else {
            Kernels::Fused
        }
    }

    /// The head the update reads: the LM head for the kernels, the score head for the reward
    /// model.
    pub fn head(&self) -> HeadKernel {
        match self.workload {
            Workload::RewardModel(_) => HeadKernel::Score,
            _ => head_kernel(self.kernels()),
        }
    }

    /// Distinct prompts in the worst micro-batch of a rollout (groups of `G` completions are
    /// contiguous; micro-batches are consecutive runs of `micro_batch` completions).
    pub fn prompts_per_micro_batch(&self) -> usize {
        let Workload::Grpo(g) = &self.workload else {
            return self.micro_batch;
        };
        let (b, gsz) = (self.micro_batch.max(1), g.num_generations.max(1));
        (0..g.rollout_completions.max(b))
            .step_by(b)
            .map(|s| (s + b - 1) / gsz - s / gsz + 1)
            .max()
            .unwrap_or(1)
    }

    /// The forward passes of one micro-batch, the head's rows and the shared-prompt gather.
    pub fn micro_batch_passes(&self) -> (Vec<Pass>, usize, Option<(usize, usize)>) {
        let b = self.micro_batch;
        match &self.workload {
            Workload::Grpo(g) => {
                let (p, c) = (g.prompt_tokens, g.completion_tokens);
                if g.share_prompts {
                    let ts = c.saturating_sub(1).max(1);
                    let passes = vec![
                        Pass {
                            name: "prompt pass (one per distinct prompt)",
                            rows: self.prompts_per_micro_batch(),
                            tokens: p,
                            keys: p,
                        },
                        Pass {
                            name: "completion pass",
                            rows: b,
                            tokens: ts,
                            keys: p + ts,
                        },
                    ];
                    (passes, b * c, Some((b, p)))
                } else {
                    let t = p + c - 1;
                    let passes = vec![Pass {
                        name: "prompt + completion rows",
                        rows: b,
                        tokens: t,
                        keys: t,
                    }];
                    (passes, b * c, None)
                }
            }
            Workload::Sft(s) => {
                let t = s.example_tokens.saturating_sub(1).max(1);
                let passes = vec![Pass {
                    name: "example rows",
                    rows: b,
                    tokens: t,
                    keys: t,
                }];
                (passes, b * t, None)
            }
            Workload::Dpo(d) => preference::dpo_passes(b, d),
            Workload::RewardModel(r) => {
                let (passes, rows) = preference::reward_model_passes(b, r);
                (passes, rows, None)
            }
        }
    }
}

/// What the plan measures or reads outside the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Environment {
    /// Resident bytes of the process before the weights: binary, tokenizer, dataset, threads.
    pub baseline_bytes: u64,
    /// Bytes the loader holds at once while reading the weights (the GGUF file, or the largest
    /// safetensors shard).
    pub source_file_bytes: u64,
    /// GGUF blocks an f32 load keeps beside the frozen weights for decoding (0 for HF
    /// directories; `ModelMetadata::decode_block_bytes`).
    pub decode_block_bytes: u64,
}

/// A phase of a run (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Reading the weights, making trainable copies.
    Load,
    /// PPO: reading the critic's weights, making its trainable copies.
    CriticLoad,
    /// GRPO eval generation.
    Eval,
    /// GRPO rollout generation.
    Generate,
    /// Scoring a rollout with reward models (`[[rewards]] type = "model"`).
    Reward,
    /// No-grad log-prob passes.
    Score,
    /// PPO: the critic's no-grad value pass.
    Values,
    /// Forward + backward of a micro-batch, the optimiser step.
    Update,
    /// Saving a checkpoint.
    Checkpoint,
    /// The final export.
    Export,
    /// PPO: the critic's export, after the policy's.
    CriticExport,
}

impl Phase {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::CriticLoad => "critic_load",
            Phase::Eval => "eval",
            Phase::Generate => "generate",
            Phase::Reward => "reward",
            Phase::Score => "score",
            Phase::Values => "values",
            Phase::Update => "update",
            Phase::Checkpoint => "checkpoint",
            Phase::Export => "export",
            Phase::CriticExport => "critic_export",
        }
    }
}

/// One part of the memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Component {
    /// Stable key (JSON).
    pub key: &'static str,
    /// What it is.
    pub name: String,
    /// Bytes.
    pub bytes: u64,
    /// The part in buffers of at least [`MMAP_THRESHOLD`] bytes.
    pub fresh_bytes: u64,
    /// How it is computed.
    pub detail: String,
    /// Phases it is alive in.
    pub phases: Vec<Phase>,
}

/// A phase's totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PhaseTotal {
    /// The phase.
    pub phase: Phase,
    /// Sum of the components alive in it.
    pub live_bytes: u64,
    /// The part of `live_bytes` in buffers the allocator maps fresh.
    pub fresh_bytes: u64,
    /// Predicted RSS in the phase: the heap's high-water mark (from any phase; the load phase's
    /// own) plus the phase's fresh buffers, less those that fit in the heap's free memory
    /// ([`HEAP_REUSE_FACTOR`]).
    pub rss_bytes: u64,
}

/// The prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// Every component, also those of 0 bytes that explain an absence (e.g. LoRA's reference).
    pub components: Vec<Component>,
    /// The phases the run has.
    pub phases: Vec<PhaseTotal>,
    /// The largest heap footprint (live bytes outside fresh buffers) of any phase.
    pub heap_high_water_bytes: u64,
    /// The phase of the peak.
    pub peak_phase: Phase,
    /// Predicted peak RSS.
    pub total_bytes: u64,
    /// The micro-batch's activations, itemised.
    pub activations: Activations,
    /// PPO: the critic's activations of a micro-batch, itemised.
    pub critic_activations: Option<Activations>,
    /// Parameters `P`.
    pub parameters: usize,
    /// Trainable parameters `T`.
    pub trainable_parameters: usize,
}

impl Plan {
    /// The component with key `key`.
    pub fn component(&self, key: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.key == key)
    }

    /// Bytes of the component `key` (0 when absent).
    pub fn bytes(&self, key: &str) -> u64 {
        self.component(key).map_or(0, |c| c.bytes)
    }

    /// The totals of `phase`, if the run has it.
    pub fn phase(&self, phase: Phase) -> Option<&PhaseTotal> {
        self.phases.iter().find(|p| p.phase == phase)
    }
}

const ALL: [Phase; 11] = [
    Phase::Load,
    Phase::CriticLoad,
    Phase::Eval,
    Phase::Generate,
    Phase::Reward,
    Phase::Score,
    Phase::Values,
    Phase::Update,
    Phase::Checkpoint,
    Phase::Export,
    Phase::CriticExport,
];
/// Every phase once the policy is loaded (PPO's critic loads next).
const AFTER_POLICY_LOAD: [Phase; 10] = [
    Phase::CriticLoad,
    Phase::Eval,
    Phase::Generate,
    Phase::Reward,
    Phase::Score,
    Phase::Values,
    Phase::Update,
    Phase::Checkpoint,
    Phase::Export,
    Phase::CriticExport,
];
/// Every phase once the models are loaded (the optimizer exists).
const AFTER_LOAD: [Phase; 9] = [
    Phase::Eval,
    Phase::Generate,
    Phase::Reward,
    Phase::Score,
    Phase::Values,
    Phase::Update,
    Phase::Checkpoint,
    Phase::Export,
    Phase::CriticExport,
];

/// Buffers this large or larger get fresh pages from `mmap` and go back to the system when
/// freed; smaller ones come from the heap, which keeps what is freed for later allocations
/// (`rlft_kernels::alloc` sets glibc's threshold to 32 MiB and turns trimming off). So RSS never
/// drops below the heap's high-water mark, and a later phase's large buffers come on top of it.
pub const MMAP_THRESHOLD: u64 = 32 << 20;

/// A phase's own buffers of [`MMAP_THRESHOLD`] bytes or more reuse the heap's free memory
/// (what earlier phases freed) when it is at least this many times their size; fragmentation
/// leaves less room than the free total. Calibrated on the default model (`docs/memory.md`).
pub const HEAP_REUSE_FACTOR: u64 = 2;

/// `n` with a unit: "134.5M".
pub fn count(n: usize) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2}B", n as f64 / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.1}M", n as f64 / 1e6)
    } else if n >= 1_000 {
        format!("{:.1}K", n as f64 / 1e3)
    } else {
        n.to_string()
    }
}

/// Elements of every weight tensor (`CausalLm::named_weights`: a tied head once).
pub fn weight_tensors(dims: &ModelDims) -> Vec<u64> {
    let (h, v) = (dims.hidden as u64, dims.vocab as u64);
    let mut out = vec![v * h];
    if !dims.tied_embeddings {
        out.push(v * h);
    }
    let (q, kv, i) = (
        dims.q_dim() as u64,
        dims.kv_dim() as u64,
        dims.intermediate as u64,
    );
    for _ in 0..dims.layers {
        out.extend(dims.linears().iter().map(|(_, o, i)| (o * i) as u64));
        out.extend([h, h]);
        if dims.qk_norm {
            out.extend([dims.head_dim as u64; 2]);
        }
        if dims.qkv_bias {
            out.extend([q, kv, kv]);
        }
        if dims.o_bias {
            out.push(h);
        }
        if dims.mlp_bias {
            out.extend([i, i, h]);
        }
    }
    out.push(h);
    out
}

/// Elements of every trainable tensor.
pub fn trainable_tensors(dims: &ModelDims, tuning: &Tuning) -> Vec<u64> {
    match tuning {
        Tuning::Full => weight_tensors(dims),
        Tuning::Lora(l) => {
            let mut out = Vec::new();
            for _ in 0..dims.layers {
                for (m, o, i) in dims.linears() {
                    if l.modules.contains(&m) {
                        out.push((l.r * i) as u64);
                        out.push((o * l.r) as u64);
                    }
                }
            }
            out
        }
    }
}

/// Tensors of `elems` elements at `bytes` each.
fn tensors(elems: &[u64], bytes: u64) -> Sized {
    Sized::of(elems.iter().map(|e| e * bytes))
}

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

/// Predicts the peak RSS of `run` on a model of `dims` (see the module docs).
///
/// `P` = parameters, `T` = trainable parameters, `w` = 4 (f32) or 2 (bf16) bytes:
/// - weights `P x w`; LoRA adapters `T x 4` (f32 whatever the base);
/// - f32 loads of a GGUF file: the frozen weights' blocks for decoding (GRPO with LoRA: all
///   phases; otherwise while loading);
/// - AdamW `2 x T x 4`; bf16 full fine-tuning also an f32 master copy `T x 4`;
/// - gradients `T x w` (a micro-batch's) + `T x 4` (the accumulated sums, f32); with one
///   micro-batch of f32 gradients only `T x 4` (they become the sums);
/// - GRPO full fine-tuning with `beta > 0`: a reference copy `P x w` (the trainer keeps it when
///   `grpo::setup::passes` says so);
/// - LoRA export (and bf16 rollout/eval): the merged copy of the adapted weights;
/// - PPO's critic: its weights, trainable parameters, AdamW state, gradients, value pass,
///   activations, checkpoint and export buffers ([`critic::components`]);
/// - DPO: a reference copy `P x w` with full fine-tuning (not with
///   `precompute_ref_log_probs`), micro-batches of pairs sharing each prompt pass
///   ([`preference::dpo_passes`]); the reward model: no LM head, a `[1, hidden]` score head
///   ([`preference::model_tensors`], [`preference::reward_model_passes`]);
/// - `[[rewards]] type = "model"`: the reward models' weights and scoring pass
///   ([`reward::components`]);
/// - rollout KV caches: `prompts x G x L x 2 x kv_heads x head_dim x (prompt + completion) x
///   4` (f32) or x 2 (bf16), see [`generation`];
/// - activations: [`activations::activations`].
///
/// Each phase's RSS is the heap's high-water mark plus the phase's buffers of at least
/// [`MMAP_THRESHOLD`] bytes; the peak is the largest.
pub fn estimate(dims: &ModelDims, run: &RunShape, env: &Environment) -> Result<Plan, PlanError> {
    if run.micro_batch == 0 || run.accumulation == 0 {
        return Err(PlanError::Invalid(
            "per_device_train_batch_size and gradient_accumulation_steps must be >= 1".into(),
        ));
    }
    if dims.layers == 0 || dims.hidden == 0 || dims.vocab == 0 || dims.kv_heads == 0 {
        return Err(PlanError::Invalid(format!(
            "the model config has a zero dimension: {dims:?}"
        )));
    }
    let w = run.weight_bytes();
    let reward_model = matches!(run.workload, Workload::RewardModel(_));
    let (weight_elems, trainable_elems) =
        preference::model_tensors(dims, &run.tuning, reward_model);
    let p = weight_elems.iter().sum::<u64>() as usize;
    let t = trainable_elems.iter().sum::<u64>() as usize;
    let full = matches!(run.tuning, Tuning::Full);
    let dtype = if run.bf16 { "bf16" } else { "f32" };
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut c: Vec<Component> = Vec::new();
    let mut add = |key, name: String, size: Sized, detail: String, phases: &[Phase]| {
        c.push(Component {
            key,
            name,
            bytes: size.bytes,
            fresh_bytes: size.fresh_bytes,
            detail,
            phases: phases.to_vec(),
        })
    };
    add(
        "baseline",
        "process baseline".into(),
        Sized {
            bytes: env.baseline_bytes,
            fresh_bytes: 0,
        },
        "binary, tokenizer, dataset, threads (measured)".into(),
        &ALL,
    );
    let weights = tensors(&weight_elems, w);
    add(
        "weights",
        "policy weights".into(),
        weights,
        if reward_model {
            format!(
                "{} params x {dtype}: the backbone (no LM head) and the score head [1, {}]",
                count(p),
                dims.hidden
            )
        } else {
            format!("{} params x {dtype}", count(p))
        },
        &ALL,
    );
    // Loading: the source file and the largest tensor's f32 conversion; with full fine-tuning
    // the loaded weights stay while their trainable copies are made.
    let file = Sized::one(env.source_file_bytes) + Sized::one(dims.largest_tensor() as u64 * 4);
    let (load, load_detail) = if full && weights.bytes > file.bytes {
        (
            weights,
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
    if !run.bf16 && env.decode_block_bytes > 0 {
        // Kept by GRPO with LoRA (rollouts decode the frozen base from them); dropped after
        // loading by full fine-tuning (the weights move) and by SFT (it never decodes).
        let kept = !full && matches!(run.workload, Workload::Grpo(_));
        add(
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
    add(
        "load_buffers",
        "loading buffers".into(),
        load,
        load_detail,
        &[Phase::Load],
    );
    let (trainable_name, trainable_detail, trainable_size) = match &run.tuning {
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
                dims.layers,
                if reward_model {
                    " + the score head"
                } else {
                    ""
                },
                count(t)
            ),
            tensors(&trainable_elems, 4),
        ),
    };
    add(
        "trainable",
        trainable_name,
        trainable_size,
        trainable_detail,
        &ALL,
    );
    let f32_state = tensors(&trainable_elems, 4);
    if full && run.bf16 {
        add(
            "master",
            "master weights".into(),
            f32_state,
            format!("AdamW's f32 copy of {} bf16 params", count(t)),
            &AFTER_LOAD,
        );
    }
    add(
        "optimizer",
        "optimizer state".into(),
        f32_state + f32_state,
        format!("AdamW m, v: 2 x {} x f32", count(t)),
        &AFTER_LOAD,
    );
    let grad_bytes = if full { w } else { 4 };
    // f32 gradients of a single micro-batch become the sums as they are (no copy).
    let (grads, grads_detail) = if run.accumulation == 1 && grad_bytes == 4 {
        (
            f32_state,
            format!("one micro-batch: its grads {} x f32 are the sums", count(t)),
        )
    } else {
        (
            tensors(&trainable_elems, grad_bytes) + f32_state,
            format!(
                "micro-batch grads {} x {} + accumulated sums {} x f32",
                count(t),
                if full { dtype } else { "f32" },
                count(t)
            ),
        )
    };
    add(
        "gradients",
        "gradients".into(),
        grads,
        grads_detail,
        &[Phase::Update],
    );
    match (&run.workload, full) {
        (Workload::Grpo(g), true) if g.reference => add(
            "reference",
            "reference model".into(),
            weights,
            "beta > 0 with full fine-tuning: the initial weights, kept".into(),
            &AFTER_POLICY_LOAD,
        ),
        (Workload::Grpo(g), false) if g.reference => add(
            "reference",
            "reference model".into(),
            Sized::default(),
            "LoRA: the base with adapters off, no copy".into(),
            &AFTER_LOAD,
        ),
        (Workload::Grpo(_), _) => add(
            "reference",
            "reference model".into(),
            Sized::default(),
            "beta = 0: none".into(),
            &AFTER_LOAD,
        ),
        (Workload::Dpo(d), _) => {
            let (size, detail) = match d.reference {
                DpoReference::Copy => (
                    weights,
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
            add(
                "reference",
                "reference model".into(),
                size,
                detail.into(),
                &AFTER_POLICY_LOAD,
            )
        }
        (Workload::Sft(_) | Workload::RewardModel(_), _) => {}
    }
    let merged_elems: Vec<u64> = match &run.tuning {
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
    // The merged weights, and merge_lora's f32 delta, weight and sum of the largest.
    let merge = tensors(&merged_elems, w) + Sized::times(largest_merged * 4, 3);
    let kv_bytes = w;
    match &run.workload {
        Workload::Grpo(g) => {
            // The f32 CPU decoder adds the adapters' low-rank update itself; the bf16 path
            // generates from a merged copy. The final export always merges.
            let (name, detail, phases): (&str, String, &[Phase]) = if merged_elems.is_empty() {
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
                        count(run.tuning.merged_params(dims))
                    ),
                    &[Phase::Eval, Phase::Generate, Phase::Export],
                )
            } else {
                (
                    "merged model (export)",
                    format!(
                        "generation adds the adapters to the frozen base as it decodes; the \
                         final export merges them into a copy: {} params x {dtype}",
                        count(run.tuning.merged_params(dims))
                    ),
                    &[Phase::Export],
                )
            };
            add("rollout_model", name.into(), merge, detail, phases);
            let positions = g.prompt_tokens + g.completion_tokens;
            add(
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
                add(
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
        _ if !merged_elems.is_empty() => add(
            "rollout_model",
            "merged model (export)".into(),
            merge,
            "the final export merges the adapters into a copy".into(),
            &[Phase::Export],
        ),
        _ => {}
    }
    let (passes, head_rows, shared) = run.micro_batch_passes();
    let temperature_scaled = matches!(&run.workload, Workload::Grpo(g) if g.temperature_scaled);
    let acts = activations::activations(
        dims,
        &run.tuning,
        run.kernels(),
        run.head(),
        &activations::MicroBatch {
            passes: &passes,
            head_rows,
            shared_prompt: shared,
            temperature_scaled,
            checkpointing: run.gradient_checkpointing,
        },
    );
    let tokens: usize = passes.iter().map(Pass::total_tokens).sum();
    add(
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
            if reward_model { "score" } else { "LM" }
        ),
        &[Phase::Update],
    );
    let scored = match &run.workload {
        Workload::Grpo(g) => (g.reference || g.old_logprobs).then_some("reference/old log-probs"),
        Workload::Sft(s) => s.eval.then_some("eval loss"),
        Workload::Dpo(d) => Some(match (d.reference, d.eval) {
            (DpoReference::Precomputed, false) => "reference log-probs (precomputed)",
            (DpoReference::Precomputed, true) => "reference log-probs (precomputed), eval",
            _ => "reference log-probs",
        }),
        Workload::RewardModel(r) => r.eval.then_some("eval scores"),
    };
    if let Some(what) = scored {
        add(
            "logprob_pass",
            "no-grad log-prob pass".into(),
            activations::no_grad_pass(dims, run.kernels(), run.head(), &passes, head_rows),
            format!("{what}: a micro-batch's forward without graph"),
            &[Phase::Score],
        );
    }
    // A checkpoint copies the optimizer state (and master weights) and writes each tensor
    // through two buffers (values, bytes) of the largest trainable tensor or its f32 state.
    let largest_trainable = trainable_elems.iter().copied().max().unwrap_or(0);
    let state_copies = if full && run.bf16 { 3 } else { 2 };
    let mut ckpt = Sized::times(largest_trainable * 4, 2);
    for _ in 0..state_copies {
        ckpt = ckpt + f32_state;
    }
    add(
        "checkpoint_buffers",
        "checkpoint buffers".into(),
        ckpt,
        format!(
            "a copy of the optimizer state ({state_copies} x {} x f32) + write buffers",
            count(t)
        ),
        &[Phase::Checkpoint],
    );
    // The final export writes f32 weights one tensor at a time; bf16 weights are all converted
    // to f32 first.
    let mut export = Sized::one(dims.largest_tensor() as u64 * 4);
    if run.bf16 {
        export = export + tensors(&weight_elems, 4);
    }
    add(
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
    let critic = match &run.workload {
        Workload::Grpo(g) => g
            .critic
            .as_ref()
            .map(|k| critic::components(k, run, g, &acts)),
        _ => None,
    };
    let reward_models = match &run.workload {
        Workload::Grpo(g) if !g.reward_models.is_empty() => {
            c.extend(reward::components(
                &g.reward_models,
                run,
                g.rollout_completions,
            ));
            true
        }
        _ => false,
    };
    let critic_activations = critic.map(|(parts, a)| {
        c.extend(parts);
        a
    });
    let present: Vec<Phase> = ALL
        .into_iter()
        .filter(|ph| match ph {
            Phase::CriticLoad | Phase::Values | Phase::CriticExport => critic_activations.is_some(),
            Phase::Eval => {
                matches!(&run.workload, Workload::Grpo(g) if g.eval.is_some())
            }
            Phase::Generate => matches!(run.workload, Workload::Grpo(_)),
            Phase::Reward => reward_models,
            Phase::Score => scored.is_some(),
            _ => true,
        })
        .collect();
    // Per phase: all bytes, bytes in fresh buffers, and fresh bytes of the components that
    // live in this phase only (allocated anew in it).
    let sums = |phase: Phase| {
        c.iter()
            .filter(|x| x.phases.contains(&phase))
            .fold((0u64, 0u64, 0u64), |(b, f, tf), x| {
                let transient = x.phases.len() < AFTER_LOAD.len();
                let t = if transient { x.fresh_bytes } else { 0 };
                (b + x.bytes, f + x.fresh_bytes, tf + t)
            })
    };
    let heap_high_water = present
        .iter()
        .map(|&ph| {
            let (b, f, _) = sums(ph);
            b - f
        })
        .max()
        .unwrap_or(0);
    let phases: Vec<PhaseTotal> = present
        .iter()
        .map(|&phase| {
            let (live, fresh, transient) = sums(phase);
            // A phase's own large buffers fit in what the heap holds free from earlier phases
            // when there is room to spare; otherwise they are mapped on top of it.
            let free = heap_high_water - (live - fresh);
            let on_top = if free >= HEAP_REUSE_FACTOR * transient {
                fresh - transient
            } else {
                fresh
            };
            PhaseTotal {
                phase,
                live_bytes: live,
                fresh_bytes: fresh,
                // Loading comes first: only its own heap is there.
                rss_bytes: if phase == Phase::Load {
                    live
                } else {
                    (heap_high_water + on_top).max(live)
                },
            }
        })
        .collect();
    let peak = phases
        .iter()
        .copied()
        .max_by_key(|x| (x.rss_bytes, x.live_bytes, std::cmp::Reverse(x.phase)))
        .expect("load and update are always present");
    Ok(Plan {
        components: c,
        phases,
        heap_high_water_bytes: heap_high_water,
        peak_phase: peak.phase,
        total_bytes: peak.rss_bytes,
        activations: acts,
        critic_activations,
        parameters: p,
        trainable_parameters: t,
    })
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_preference;
