//! Evaluation: one completion per eval prompt (greedy, or sampled = pass@1), scored with the
//! run's rewards. Used by the trainer every `eval_steps` and by `rlft eval`.

use rlft_model::decoder::CausalLm;
use rlft_model::sampling::SamplingParams;
use rlft_rewards::{RewardSet, Scores};
use rlft_text::TextBundle;

use super::stats::{length_metrics, reward_metrics, turn_metrics, Metrics};
use super::{rollout_model, sample_completions, RolloutSettings, Sample, Turns};
use crate::data::prompts::PromptItem;
use crate::error::Result;

/// Scores `samples` (completions of `items`) with every reward function.
pub fn score_samples(
    rewards: &mut RewardSet,
    items: &[PromptItem],
    samples: &[Sample],
) -> Result<Scores> {
    let batch: Vec<rlft_rewards::Sample<'_>> = samples
        .iter()
        .map(|s| rlft_rewards::Sample {
            prompt: &s.prompt_item(items).text,
            completion: &s.text,
            row: &items[s.prompt].row,
            completion_ids: &s.completion_ids,
            completion_tokens: s.completion_ids.len(),
            truncated: s.truncated,
            environment_reward: s.turns.as_ref().and_then(|t| t.environment_reward),
        })
        .collect();
    Ok(rewards.score(&batch)?)
}

/// Per-sample `(name, value)` pairs of every reward function and part, for samples.jsonl.
pub fn sample_reward_parts(names: &[String], scores: &Scores, i: usize) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for (name, f) in names.iter().zip(&scores.per_function) {
        out.push((name.clone(), f.scores[i].unwrap_or(f64::NAN)));
        for (part, v) in &f.parts {
            out.push((format!("{name}/{part}"), v[i]));
        }
    }
    out
}

/// How eval decodes.
#[derive(Debug, Clone)]
pub struct EvalSettings {
    /// Greedy decoding (else sampled with `sampling`).
    pub greedy: bool,
    /// Sampling settings when not greedy.
    pub sampling: SamplingParams,
    /// Most new tokens.
    pub max_new_tokens: usize,
    /// Seed of sampled eval.
    pub seed: u64,
    /// End-of-sequence ids.
    pub eos_token_ids: Vec<u32>,
    /// Padding id.
    pub pad_token_id: u32,
    /// Prompts generated at once.
    pub batch_size: usize,
}

/// What an eval pass produced.
pub struct EvalResult {
    /// `eval/reward`, `eval/rewards/<fn>/mean`, parts, and lengths.
    pub metrics: Metrics,
    /// The completions.
    pub samples: Vec<Sample>,
    /// Their scores.
    pub scores: Scores,
}

/// Generates one completion per prompt of `items` (through `turns`' tools and environment, if
/// any) and scores it.
pub fn evaluate(
    model: &CausalLm,
    text: &TextBundle,
    items: &[PromptItem],
    rewards: &mut RewardSet,
    s: &EvalSettings,
    turns: Option<&Turns>,
) -> Result<EvalResult> {
    let gen_model = rollout_model(model)?;
    let settings = RolloutSettings {
        num_generations: 1,
        max_new_tokens: s.max_new_tokens,
        sampling: if s.greedy {
            SamplingParams::greedy()
        } else {
            s.sampling.clone()
        },
        seed: s.seed,
        eos_token_ids: s.eos_token_ids.clone(),
        pad_token_id: s.pad_token_id,
    };
    let mut samples = Vec::with_capacity(items.len());
    let idx: Vec<usize> = (0..items.len()).collect();
    for chunk in idx.chunks(s.batch_size.max(1)) {
        samples.extend(sample_completions(
            &gen_model, text, items, chunk, &settings, turns,
        )?);
    }
    let scores = score_samples(rewards, items, &samples)?;
    let names = rewards.names();
    let mut metrics = reward_metrics("eval/", &names, &scores, &[]);
    let lens: Vec<usize> = samples.iter().map(|x| x.completion_ids.len()).collect();
    let trunc: Vec<bool> = samples.iter().map(|x| x.truncated).collect();
    metrics.extend(length_metrics("eval/", &lens, &trunc));
    if let Some(turns) = turns {
        metrics.extend(turn_metrics("eval/", &samples, turns));
    }
    Ok(EvalResult {
        metrics,
        samples,
        scores,
    })
}
