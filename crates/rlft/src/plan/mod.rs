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
//!
//! The run's shape is in `shape.rs`; the estimate in `estimate.rs`, which adds the policy's own
//! parts (`policy.rs`), the working buffers (`buffers.rs`), the critic's (`critic.rs`) and the
//! reward models' (`reward.rs`), then the phase totals.

pub mod activations;
mod buffers;
pub mod critic;
mod estimate;
pub mod inputs;
mod policy;
pub mod preference;
pub mod reward;
mod shape;
pub mod suggest;

use serde::Serialize;

pub use activations::{
    head_kernel, Activations, HeadKernel, Kernels, Part, Pass, SavedTensor, Sized,
};
pub use buffers::{generation, kv_cache_bytes};
pub use critic::CriticShape;
pub use estimate::estimate;
// Shared with `critic.rs` and `reward.rs`.
use estimate::tensors;
pub use inputs::{
    critic_shape, dpo_lengths, grpo_lengths, model_rewards, reward_model_lengths, run_shape_dpo,
    run_shape_grpo, run_shape_online_dpo, run_shape_reward_model, run_shape_sft, sft_lengths,
};
pub use preference::{DpoReference, DpoShape, RewardModelShape};
pub use reward::ModelRewardShape;
pub use shape::{
    trainable_tensors, weight_tensors, EvalPrompts, GrpoShape, LoraShape, ModelDims, RunShape,
    SftShape, Tuning, Workload,
};
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
    /// `(parameters, bytes)` of the matrices a LoRA run over an f32 GGUF load keeps in their
    /// blocks instead of f32 (`ModelMetadata::frozen_blocks`).
    pub frozen_blocks: (u64, u64),
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

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_preference;
