//! Rollouts, shared by every online trainer (GRPO, and the algorithms that sample completions
//! and score them: RLOO, REINFORCE++, PPO, Online DPO): G completions per prompt from the current
//! policy, and the per-token log-probs of completions under a model (policy with grad, old
//! policy, reference).
//!
//! - [`eval`]: scoring samples with the rewards, and eval passes (also `rlft eval`);
//! - [`logs`]: the online trainers' logs (`samples.jsonl`, eval passes) and step metrics;
//! - [`passes`]: the log-prob passes over samples (old policy, reference, the policy with grad);
//! - [`samples`]: `samples.jsonl`, the completions a run shows;
//! - [`stats`]: reward and length metrics with TRL's names, and the health signs;
//! - [`turns`]: multi-turn rollouts, where completions call tools and read their answers, or
//!   play episodes with an environment.
//!
//! Generation runs on a copy of the policy with LoRA adapters merged in (a few small matmuls per
//! rollout), so it takes the fused CPU decode path; the prompt is prefilled once per group.

use std::sync::Arc;

use rlft_model::decoder::CausalLm;
use rlft_model::generate::{generate, FinishReason, GenerateRequest};
use rlft_model::sampling::SamplingParams;
use rlft_text::TextBundle;

use rlft_rewards::{RewardSet, Scores};

use crate::data::prompts::PromptItem;
use crate::error::Result;
use crate::run::Metrics;
use eval::score_samples;
pub use passes::{
    completion_logprobs, logprobs_no_grad, no_grad_passes, pad_rows, policy_pass, score_batch,
    token_batch, MicroRows, NoGradPasses, PolicyPass, ScoreOptions, ScoredBatch, TokenBatch,
};

pub mod eval;
pub mod logs;
pub mod pairs;
mod passes;
pub mod remote;
pub mod samples;
pub mod stats;
pub mod turns;

pub use turns::{TurnTrace, Turns};

/// One completion of a rollout.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Index of its prompt in the trainer's prompt list.
    pub prompt: usize,
    /// The episode's own first prompt, where an environment's first observation extended the
    /// trainer's prompt ([`turns`]); `None`: `items[prompt]` as it is.
    pub episode_prompt: Option<Arc<PromptItem>>,
    /// Generated ids (an ending eos included).
    pub completion_ids: Vec<u32>,
    /// Decoded completion text (special tokens skipped): what rewards see.
    pub text: String,
    /// Whether it hit `max_completion_length` without an eos.
    pub truncated: bool,
    /// Per-token log-probs the sampler reported (rollouts on servers, [`remote`]); `None` for
    /// the in-process rollout, whose sampler is the policy itself.
    pub sampler_logprobs: Option<Vec<f32>>,
    /// The turns of a multi-turn completion ([`turns`]); `None` when it called no tool and
    /// played no environment step, so the policy sampled every token.
    pub turns: Option<TurnTrace>,
}

impl Sample {
    /// A first-turn sample of prompt `prompt`, as the sampler gave it.
    pub fn new(prompt: usize, completion_ids: Vec<u32>, text: String, truncated: bool) -> Self {
        Sample {
            prompt,
            episode_prompt: None,
            completion_ids,
            text,
            truncated,
            sampler_logprobs: None,
            turns: None,
        }
    }

    /// The prompt this completion follows: the episode's own, else `items[prompt]`.
    pub fn prompt_item<'a>(&'a self, items: &'a [PromptItem]) -> &'a PromptItem {
        self.episode_prompt
            .as_deref()
            .unwrap_or(&items[self.prompt])
    }

    /// Completion tokens the policy sampled: the ones the loss counts (tool answers left out).
    pub fn sampled_tokens(&self) -> usize {
        match &self.turns {
            Some(t) => t.mask.iter().filter(|&&m| m).count(),
            None => self.completion_ids.len(),
        }
    }
}

/// Sampling settings of a rollout.
#[derive(Debug, Clone)]
pub struct RolloutSettings {
    /// Completions per prompt.
    pub num_generations: usize,
    /// Most new tokens.
    pub max_new_tokens: usize,
    /// Temperature, top-k/p, min-p, repetition penalty.
    pub sampling: SamplingParams,
    /// Seed of this rollout (each completion draws from (seed, prompt, sample)).
    pub seed: u64,
    /// End-of-sequence ids.
    pub eos_token_ids: Vec<u32>,
    /// Padding id.
    pub pad_token_id: u32,
}

/// The model generation runs on: a detached view of `policy` (weights shared, no graph). Its
/// adapters stay separate where the fused CPU decoder applies (it adds the low-rank update
/// itself and keeps reading a GGUF base from its blocks); elsewhere they are merged (no
/// weights copied except the adapted ones).
pub fn rollout_model(policy: &CausalLm) -> Result<CausalLm> {
    let mut m = rlft_model::trainable::detached(policy);
    if m.has_active_adapters() {
        if !rlft_model::decode_fast::supported(&m) {
            rlft_model::lora::merge_lora(&mut m)?;
        }
    } else if m.has_adapters() {
        rlft_model::lora::remove_lora(&mut m);
    }
    Ok(m)
}

/// Generates `num_generations` completions for each of `prompts` (indices into `items`);
/// groups are contiguous, in the order of `prompts`. With `turns`, completions go on through
/// their tool calls and environment steps ([`turns::continue_turns`]); with an environment,
/// each completion is an episode that starts with its `reset` ([`turns::episodes`]).
pub fn sample_completions(
    model: &CausalLm,
    text: &TextBundle,
    items: &[PromptItem],
    prompts: &[usize],
    s: &RolloutSettings,
    turns: Option<&Turns>,
) -> Result<Vec<Sample>> {
    let g = s.num_generations;
    let episodes = match turns {
        Some(t) => t.start_episodes(text, items, prompts, g, s.seed)?,
        None => Vec::new(),
    };
    let first = turns::episodes::first_turn(items, prompts, g, &episodes);
    let req = GenerateRequest {
        prompts: first.contexts,
        n: first.n,
        max_new_tokens: s.max_new_tokens,
        sampling: s.sampling.clone(),
        seed: s.seed,
        eos_token_ids: s.eos_token_ids.clone(),
        stop_strings: Vec::new(),
        pad_token_id: s.pad_token_id,
    };
    let detok = |ids: &[u32]| text.decode(ids, true).unwrap_or_default();
    let out = generate(model, &req, &detok)?;
    let mut samples: Vec<Sample> = out
        .into_iter()
        .map(|c| {
            let e = c.prompt_index * first.n + c.sample_index;
            let truncated = c.finish_reason == FinishReason::Length;
            let mut sample = Sample::new(prompts[e / g], c.token_ids, c.text, truncated);
            sample.episode_prompt = episodes.get(e).and_then(|x| x.prompt.clone());
            sample
        })
        .collect();
    if let Some(turns) = turns {
        let ids: Vec<String> = episodes.iter().map(|e| e.id.clone()).collect();
        let mut gen = |r: &GenerateRequest| Ok(generate(model, r, &detok)?);
        turns::continue_turns(&mut samples, items, turns, text, s, &ids, &mut gen)?;
        turns.close(&episodes)?;
    }
    Ok(samples)
}

/// Times `f` as phase `phase`: pushes `time/<phase>` (seconds) to `times`.
pub fn timed<T>(times: &mut Metrics, phase: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let t = std::time::Instant::now();
    let out = f()?;
    times.push((format!("time/{phase}"), t.elapsed().as_secs_f64()));
    Ok(out)
}

/// Where a rollout's completions are sampled.
#[derive(Clone, Copy)]
pub enum Sampler<'a> {
    /// In process, from (a detached view of) the policy, with the run's tools if it has any.
    Policy(&'a CausalLm, Option<&'a Turns>),
    /// On OpenAI-compatible servers ([`remote`]), from `model`: the adapter version they hold.
    Servers {
        /// The servers.
        pool: &'a remote::ServerPool,
        /// The model name to ask them for.
        model: &'a str,
    },
}

/// Generates the completions of `prompts` with `sampler` and scores them with `rewards`: the
/// `generate` and `reward` phases every online trainer starts with.
pub fn generate_and_score(
    sampler: Sampler<'_>,
    text: &TextBundle,
    items: &[PromptItem],
    prompts: &[usize],
    settings: &RolloutSettings,
    rewards: &mut RewardSet,
    times: &mut Metrics,
) -> Result<(Vec<Sample>, Scores)> {
    let samples = timed(times, "generate", || match sampler {
        Sampler::Policy(policy, turns) => {
            let m = rollout_model(policy)?;
            sample_completions(&m, text, items, prompts, settings, turns)
        }
        Sampler::Servers { pool, model } => pool.sample(model, text, items, prompts, settings),
    })?;
    let scores = timed(times, "reward", || score_samples(rewards, items, &samples))?;
    Ok((samples, scores))
}
