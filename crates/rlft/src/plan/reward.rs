//! Reward models as rewards of the online trainers (`[[rewards]] type = "model"`,
//! `crate::reward_model::reward`) in the plan.
//!
//! `grpo::setup::prepare` loads each reward model before the policy, in the run's dtype (GGUF
//! blocks dropped: dense weights), and keeps it for the whole run; after each rollout's
//! generation (the KV caches freed) it scores the completions `batch_size` sequences per
//! forward pass without graph (phase `reward`). Its loading (file, largest tensor in f32)
//! happens before the policy's, with only the baseline alive: that moment holds less than the
//! policy's `load` phase unless the reward model is larger than the policy, and is not
//! planned separately.
//!
//! The scored sequence is prompt + completion in the reward model's own tokens (with its chat
//! template); the plan takes the policy's prompt and completion lengths, which match it when
//! the two share a tokenizer, cut to the reward's `max_length`.

use serde::Serialize;

use super::activations::{self, HeadKernel, Pass, Sized};
use super::critic::CriticShape;
use super::{count, tensors, Component, Phase, RunShape, ALL};

/// One `type = "model"` reward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelRewardShape {
    /// The reward's name (its `name`, else `model`).
    pub name: String,
    /// The reward model: a `*ForSequenceClassification` directory (no LM head), or a causal
    /// LM base with a SEQ_CLS adapter merged (the base keeps its LM head).
    pub model: CriticShape,
    /// Sequences per forward pass (the reward's `batch_size`).
    pub batch_size: usize,
    /// Tokens per scored sequence.
    pub tokens: usize,
}

/// The reward models' components: their weights (`reward_model_weights`, alive in every
/// phase) and the largest scoring pass (`reward_model_pass`, phase `reward`), over a rollout
/// of `completions` completions.
pub fn components(
    rewards: &[ModelRewardShape],
    run: &RunShape,
    completions: usize,
) -> Vec<Component> {
    let w = run.weight_bytes();
    let dtype = if run.bf16 { "bf16" } else { "f32" };
    let mut weights = Sized::default();
    let mut names = Vec::new();
    let mut pass = Sized::default();
    let mut pass_detail = String::new();
    for r in rewards {
        weights = weights + tensors(&r.model.weight_tensors(), w);
        names.push(format!(
            "`{}` {} params{}",
            r.name,
            count(r.model.parameters()),
            if r.model.headless {
                ""
            } else {
                " (a causal LM base with its LM head)"
            }
        ));
        let rows = r.batch_size.max(1).min(completions.max(1));
        let p = [Pass {
            name: "reward model rows",
            rows,
            tokens: r.tokens.max(1),
            keys: r.tokens.max(1),
        }];
        let s =
            activations::no_grad_pass(&r.model.dims, run.kernels(), HeadKernel::Score, &p, rows);
        if s.bytes > pass.bytes {
            pass = s;
            pass_detail = format!(
                "`{}`: {rows} sequences x {} tokens per forward pass without graph, a score \
                 per sequence",
                r.name, r.tokens
            );
        }
    }
    vec![
        Component {
            key: "reward_model_weights",
            name: "reward model weights".into(),
            bytes: weights.bytes,
            fresh_bytes: weights.fresh_bytes,
            detail: format!(
                "{} x {dtype}, loaded before the policy, GGUF blocks dropped",
                names.join(", ")
            ),
            phases: ALL.to_vec(),
        },
        Component {
            key: "reward_model_pass",
            name: "reward model scoring pass".into(),
            bytes: pass.bytes,
            fresh_bytes: pass.fresh_bytes,
            detail: pass_detail,
            phases: vec![Phase::Reward],
        },
    ]
}
