//! The offline preference trainers in the plan: DPO (`crate::dpo`) and the reward model
//! (`crate::reward_model`). Both take `per_device_train_batch_size` pairs per micro-batch, two
//! sequences each; what differs from SFT is how those rows run and what else stays alive.
//!
//! - DPO scores a micro-batch's chosen and rejected completions in one pass that runs each
//!   pair's prompt once (`dpo::pair_logps`: `rollout::score_batch` with shared prompts, as
//!   GRPO's groups of two): a prompt pass of `B` rows (`2B` when `keep_end` truncation left
//!   the two sides different prompts) and a completion pass of `2B` rows attending to it, the
//!   LM head over every completion token. The reference is the base with adapters off (LoRA),
//!   a frozen copy of the starting weights (full fine-tuning), or log-probs precomputed before
//!   training (the copy is freed then); its no-grad pass has the same rows.
//! - The reward model runs the `2B` chosen and rejected sequences as plain left-padded rows
//!   (`reward_model::score_pairs`): no LM head (an untied one is dropped at load), the
//!   `[1, hidden]` score head over one row per sequence (`rlft_model::score::sequence_scores`).

use serde::Serialize;

use super::activations::Pass;
use super::critic::CriticShape;
use super::{trainable_tensors, weight_tensors, ModelDims, Tuning};

/// Where DPO's reference log-probs come from (`dpo::Reference`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DpoReference {
    /// LoRA: the policy with its adapters off, no copy.
    AdaptersOff,
    /// Full fine-tuning: a frozen copy of the starting weights, kept through training.
    Copy,
    /// `precompute_ref_log_probs`: computed before training; a full fine-tuning copy is freed
    /// then (while it lives, the optimizer state does not exist yet, so that moment holds less
    /// than the `score` phase).
    Precomputed,
}

/// A DPO run's shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DpoShape {
    /// Prompt tokens: the dataset's longest prompt, or the config's limit.
    pub prompt_tokens: usize,
    /// Completion tokens: the dataset's longest chosen or rejected completion, or the limit.
    pub completion_tokens: usize,
    /// Prompt rows per pair: 1, or 2 when `keep_end` truncation left a pair's two sides
    /// different prompts.
    pub prompts_per_pair: usize,
    /// The reference.
    pub reference: DpoReference,
    /// Eval pairs exist (an eval pass of the policy without graph).
    pub eval: bool,
}

/// A reward-model run's shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RewardModelShape {
    /// Tokens of the longest chosen or rejected sequence (prompt included), or `max_length`.
    pub sequence_tokens: usize,
    /// Eval pairs exist (an eval pass without graph).
    pub eval: bool,
}

/// DPO's passes of a micro-batch of `pairs` pairs: the prompt pass, the completion pass of
/// both sides attending to it; the LM head's rows (`2 x pairs x completion`), and the shared
/// prompt gather `(completions, prompt tokens)`.
pub fn dpo_passes(pairs: usize, d: &DpoShape) -> (Vec<Pass>, usize, Option<(usize, usize)>) {
    let (p, c) = (d.prompt_tokens, d.completion_tokens);
    let ts = c.saturating_sub(1).max(1);
    let rows = 2 * pairs;
    let passes = vec![
        Pass {
            name: "prompt pass (one per pair)",
            rows: pairs * d.prompts_per_pair.max(1),
            tokens: p,
            keys: p,
        },
        Pass {
            name: "chosen + rejected completion pass",
            rows,
            tokens: ts,
            keys: p + ts,
        },
    ];
    (passes, rows * c, Some((rows, p)))
}

/// The reward model's pass over a micro-batch of `pairs` pairs: `2 x pairs` rows of the
/// longest sequence; the score head reads one row per sequence.
pub fn reward_model_passes(pairs: usize, r: &RewardModelShape) -> (Vec<Pass>, usize) {
    let t = r.sequence_tokens.max(1);
    let pass = Pass {
        name: "chosen + rejected rows",
        rows: 2 * pairs,
        tokens: t,
        keys: t,
    };
    (vec![pass], 2 * pairs)
}

/// The reward model's backbone and head as [`CriticShape`] describes a score model: no LM
/// head (`reward_model::setup` drops an untied one at load).
pub fn score_model(dims: &ModelDims) -> CriticShape {
    CriticShape {
        dims: *dims,
        headless: true,
        source_file_bytes: 0,
        decode_block_bytes: 0,
    }
}

/// Elements of every weight tensor and every trainable tensor of the model a run trains: the
/// causal LM's ([`weight_tensors`], [`trainable_tensors`]), or for the reward model its
/// backbone without LM head and the `[1, hidden]` score head (trainable beside the adapters).
pub fn model_tensors(
    dims: &ModelDims,
    tuning: &Tuning,
    reward_model: bool,
) -> (Vec<u64>, Vec<u64>) {
    if reward_model {
        let s = score_model(dims);
        (s.weight_tensors(), s.trainable_tensors(tuning))
    } else {
        (weight_tensors(dims), trainable_tensors(dims, tuning))
    }
}
