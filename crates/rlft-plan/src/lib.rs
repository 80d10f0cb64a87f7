//! # rlft-plan: a training run's peak memory, before it starts
//!
//! Pure arithmetic, no model and no config: a trainer declares its run ([`Run`]: the models it
//! holds, the passes of one micro-batch, what it generates and scores) in units of the model's
//! dimensions ([`ModelDims`]), and [`estimate`] turns that into components, each alive in some
//! phases ([`Phase`]), and a predicted peak RSS. [`suggest`] searches the changes that make a
//! run fit. `rlft plan` (crates/rlft-cli) reads the config, asks the trainer for its [`Run`]
//! (`rlft::plan_shapes`) and prints the [`Plan`]; `docs/memory.md` has the measured errors.
//!
//! The sizes (`P` parameters, `T` trainable, `w` bytes per weight):
//! - weights `P x w`, LoRA adapters `T x 4`, AdamW `2 x T x 4`, gradients `T x w + T x 4`, a
//!   reference copy `P x w`, KV caches `rows x layers x 2 x kv_dim x positions x w`, the
//!   export's and checkpoint's buffers ([`formulas`]);
//! - activations: a figure per token per layer for each kernel path, attention scores where
//!   candle's composite path keeps them, the head and the backward's working set
//!   ([`formulas::activations`]), measured by `crates/rlft/tests/plan_activations.rs`.
//!
//! Phases do not add up: the allocator keeps what a phase frees for the next
//! (`rlft_kernels::alloc`), so RSS after loading is the heap's high-water mark (the largest
//! heap footprint of any phase) plus the buffers of at least [`MMAP_THRESHOLD`] bytes, which
//! get fresh pages, unless a phase's own large buffers fit in what the heap holds free
//! ([`HEAP_REUSE_FACTOR`]). The predicted peak is the largest phase RSS.

mod estimate;
pub mod formulas;
mod suggest;

use serde::Serialize;

pub use estimate::estimate;
pub use formulas::{Activations, HeadKernel, Kernels, Part, Sized};
pub use suggest::{suggest, Change, Suggestion};

/// Buffers this large or larger get fresh pages from `mmap` and go back to the system when
/// freed; the heap keeps smaller ones (`rlft_kernels::alloc` sets glibc's threshold, no trim).
pub const MMAP_THRESHOLD: u64 = 32 << 20;

/// A phase's own buffers of [`MMAP_THRESHOLD`] bytes or more reuse the heap's free memory when it
/// is this many times their size (fragmentation); calibrated in `docs/memory.md`.
pub const HEAP_REUSE_FACTOR: u64 = 2;

/// A run the plan cannot describe.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A zero dimension, micro-batch or step.
    #[error("cannot plan this run: {0}")]
    Invalid(String),
}

/// The dimensions of a decoder-only model that memory depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ModelDims {
    /// Vocabulary `V`.
    pub vocab: usize,
    /// Hidden size `h`.
    pub hidden: usize,
    /// MLP intermediate size `i`.
    pub intermediate: usize,
    /// Decoder layers `L`.
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

/// LoRA adapters: rank and the modules they sit on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoraShape {
    /// Rank `r`.
    pub r: usize,
    /// Adapted modules (`self_attn.q_proj`... as [`ModelDims::linears`] names them).
    pub modules: Vec<&'static str>,
    /// `lora_dropout > 0`: a mask per adapted module is kept.
    pub dropout: bool,
}

/// What trains.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tuning {
    /// Every weight.
    #[default]
    Full,
    /// LoRA adapters over frozen weights.
    Lora(LoraShape),
}

/// A model the run holds: its shape, its head and the files it is read from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Model {
    /// Its dimensions.
    pub dims: ModelDims,
    /// A `[1, hidden]` score head (reward model, PPO's critic) instead of the LM head.
    pub score_head: bool,
    /// No LM head: a `*ForSequenceClassification` model, or the reward-model trainer's (it drops
    /// an untied one at load).
    pub headless: bool,
    /// Bytes its loader holds at once (a GGUF file, or the largest safetensors shard).
    pub source_file_bytes: u64,
    /// GGUF blocks an f32 load keeps beside the dense weights for decoding.
    pub decode_block_bytes: u64,
    /// `(parameters, bytes)` of the matrices a LoRA run over an f32 GGUF load keeps in blocks.
    pub frozen_blocks: (u64, u64),
}

/// One forward pass of a micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Pass {
    /// What it computes.
    pub name: &'static str,
    /// Sequences.
    pub rows: usize,
    /// Input tokens per sequence.
    pub tokens: usize,
    /// Key positions each query sees.
    pub keys: usize,
}

impl Pass {
    /// `rows` sequences of `tokens` inputs attending to `keys` positions.
    pub fn new(name: &'static str, rows: usize, tokens: usize, keys: usize) -> Self {
        Pass {
            name,
            rows,
            tokens,
            keys,
        }
    }

    /// `rows x tokens`.
    pub fn total_tokens(&self) -> usize {
        self.rows * self.tokens
    }
}

/// The forward passes of one micro-batch and what reads their output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MicroBatch {
    /// The passes.
    pub passes: Vec<Pass>,
    /// Rows through the head (scored positions).
    pub head_rows: usize,
    /// `(completions, prompt tokens)` gathering keys/values from a shared prompt pass.
    pub shared_prompt: Option<(usize, usize)>,
    /// Hidden rows divided by the sampling temperature before the head.
    pub temperature_scaled: bool,
}

impl MicroBatch {
    /// `rows` plain sequences of `tokens` inputs, `head_rows` of them scored.
    pub fn plain(name: &'static str, rows: usize, tokens: usize, head_rows: usize) -> Self {
        let t = tokens.max(1);
        MicroBatch::of(vec![Pass::new(name, rows, t, t)], head_rows, None)
    }

    /// A prompt pass of `prompt_rows` rows of `prompt` tokens, then `completions` rows of
    /// `completion - 1` inputs attending to it (`rollout::score_batch`), the head over them all.
    pub fn shared(
        prompt_rows: usize,
        prompt: usize,
        completions: usize,
        completion: usize,
    ) -> Self {
        let ts = completion.saturating_sub(1).max(1);
        let passes = vec![
            Pass::new("prompt pass", prompt_rows, prompt, prompt),
            Pass::new("completion pass", completions, ts, prompt + ts),
        ];
        let shared = Some((completions, prompt));
        MicroBatch::of(passes, completions * completion, shared)
    }

    fn of(passes: Vec<Pass>, head_rows: usize, shared_prompt: Option<(usize, usize)>) -> Self {
        MicroBatch {
            passes,
            head_rows,
            shared_prompt,
            temperature_scaled: false,
        }
    }

    /// Input tokens over all passes.
    pub fn tokens(&self) -> usize {
        self.passes.iter().map(Pass::total_tokens).sum()
    }
}

/// Generating samples for prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Generation {
    /// Prompts at once.
    pub prompts: usize,
    /// Samples per prompt.
    pub per_prompt: usize,
    /// Tokens of the longest prompt.
    pub prompt_tokens: usize,
    /// New tokens per sample.
    pub new_tokens: usize,
}

/// The reference model, when the trainer has one (a component even at 0 bytes, to say why).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reference {
    /// A frozen copy of the starting weights (else the base with adapters off, or precomputed).
    pub copy: bool,
    /// Why, in words.
    pub detail: String,
}

/// PPO's critic: a second model trained beside the policy, over plain rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Critic {
    /// The value model (a score head).
    pub model: Model,
    /// Its micro-batch (its value pass runs the same rows without graph).
    pub update: MicroBatch,
}

/// A `[[rewards]] type = "model"` reward model, scoring each rollout without graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RewardScorer {
    /// The reward's name.
    pub name: String,
    /// The reward model (a score head).
    pub model: Model,
    /// Sequences per forward pass.
    pub rows: usize,
    /// Tokens per sequence.
    pub tokens: usize,
}

/// Where AdamW keeps the state of bf16 weights (rlft's `optim`); f32 weights have f32 moments
/// and no master under each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum OptimizerState {
    /// f32 moments and an f32 master copy: 12 bytes per parameter.
    #[default]
    F32Master,
    /// f32 moments and the master's 16-bit low half: 10 bytes.
    SplitMaster,
    /// Moments in bf16, no master: 4 bytes.
    Bf16Moments,
}

/// What a trainer declares of a run: its models, its passes and what it generates and scores.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Run {
    /// bf16 weights and activations (else f32).
    pub bf16: bool,
    /// AdamW's state of bf16 weights.
    pub optimizer_state: OptimizerState,
    /// Full fine-tuning or LoRA.
    pub tuning: Tuning,
    /// `per_device_train_batch_size`, in the trainer's unit.
    pub micro_batch: usize,
    /// What `micro_batch` counts ("completions", "examples", "pairs").
    pub unit: &'static str,
    /// `gradient_accumulation_steps`.
    pub accumulation: usize,
    /// Layer inputs kept, layers recomputed in the backward (the policy's only).
    pub gradient_checkpointing: bool,
    /// The trained model.
    pub policy: Model,
    /// One micro-batch of the update.
    pub update: MicroBatch,
    /// A no-grad pass over the update's rows, and what it scores.
    pub scored: Option<String>,
    /// The reference model.
    pub reference: Option<Reference>,
    /// Rollout generation.
    pub generation: Option<Generation>,
    /// Eval generation.
    pub eval_generation: Option<Generation>,
    /// PPO's critic.
    pub critic: Option<Critic>,
    /// Reward models scoring each rollout.
    pub reward_models: Vec<RewardScorer>,
}

impl Run {
    /// A run of `policy` with `tuning` and micro-batches of `micro_batch` (`update`): f32, no
    /// accumulation, nothing generated, scored or referenced; the trainer sets the rest.
    pub fn new(policy: Model, tuning: Tuning, micro_batch: usize, update: MicroBatch) -> Self {
        let (unit, accumulation) = ("examples", 1);
        Run {
            policy,
            tuning,
            micro_batch,
            update,
            unit,
            accumulation,
            ..Run::default()
        }
    }

    /// Bytes per weight: 4 (f32) or 2 (bf16).
    pub fn weight_bytes(&self) -> u64 {
        [4, 2][usize::from(self.bf16)]
    }

    /// The weights' dtype: "f32" or "bf16".
    pub fn dtype(&self) -> &'static str {
        ["f32", "bf16"][usize::from(self.bf16)]
    }

    /// The CPU training kernels: fused for f32, candle's composites for bf16.
    pub fn kernels(&self) -> Kernels {
        [Kernels::Fused, Kernels::Composite][usize::from(self.bf16)]
    }
}

/// What the plan measures outside the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Environment {
    /// Resident bytes of the process before the weights: binary, tokenizer, dataset, threads.
    pub baseline_bytes: u64,
}

/// A phase of a run: what is alive differs between them (`docs/memory.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Reading the weights, making trainable copies.
    Load,
    /// PPO: reading the critic's weights.
    CriticLoad,
    /// Eval generation.
    Eval,
    /// Rollout generation.
    Generate,
    /// Scoring a rollout with reward models.
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
    /// Every phase, in order.
    pub const ALL: [Phase; 11] = [
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
    /// The part of `live_bytes` in fresh buffers.
    pub fresh_bytes: u64,
    /// Predicted RSS: the heap's high-water mark plus the phase's fresh buffers (crate docs).
    pub rss_bytes: u64,
}

/// The prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// Every component, also those of 0 bytes that explain an absence.
    pub components: Vec<Component>,
    /// The phases the run has.
    pub phases: Vec<PhaseTotal>,
    /// The largest heap footprint (live bytes outside fresh buffers) of any phase.
    pub heap_high_water_bytes: u64,
    /// The phase of the peak.
    pub peak_phase: Phase,
    /// Predicted peak RSS.
    pub total_bytes: u64,
    /// The policy's micro-batch activations, itemised.
    pub activations: Activations,
    /// PPO: the critic's.
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

/// `n` with a unit: "134.5M".
pub fn count(n: usize) -> String {
    match n {
        1_000_000_000.. => format!("{:.2}B", n as f64 / 1e9),
        1_000_000.. => format!("{:.1}M", n as f64 / 1e6),
        1_000.. => format!("{:.1}K", n as f64 / 1e3),
        _ => n.to_string(),
    }
}
