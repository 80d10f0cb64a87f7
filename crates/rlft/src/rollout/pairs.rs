//! Preference pairs from a model's own samples (`rlft data sampled-preferences`): per prompt,
//! `num_generations` completions sampled as a rollout samples them, scored with the config's
//! rewards; the best-scored completion is `chosen`, the worst `rejected`. This is how RLHF
//! collects a reward model's pairs (Llama 2, §3.2.1: pairs of the policy's own samples) and how
//! iterative / online DPO labels them: the rejected replies are what the policy writes, so a
//! reward model trained on them has seen the replies a policy trained against it starts from.

use rlft_rewards::RewardSet;
use rlft_text::TextBundle;
use serde_json::{json, Map, Value};

use super::eval::score_samples;
use super::{rollout_model, sample_completions, RolloutSettings};
use crate::data::prompts::PromptItem;
use crate::error::{Result, TrainerError};
use rlft_model::decoder::CausalLm;

/// The (chosen, rejected) indices of one prompt's completions: the first best-scored one and
/// the first worst-scored one whose text differs from it. `None` when fewer than two are
/// scored, or when the best and the worst score differ by `min_gap` or less (ties carry no
/// preference).
pub fn pick_pair(scores: &[Option<f64>], texts: &[&str], min_gap: f64) -> Option<(usize, usize)> {
    let scored: Vec<(usize, f64)> = scores
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.filter(|v| v.is_finite()).map(|v| (i, v)))
        .collect();
    let mut best = *scored.first()?;
    for &(i, v) in &scored {
        if v > best.1 {
            best = (i, v);
        }
    }
    let mut worst: Option<(usize, f64)> = None;
    for &(i, v) in &scored {
        if texts[i] != texts[best.0] && worst.is_none_or(|w| v < w.1) {
            worst = Some((i, v));
        }
    }
    let worst = worst?;
    (best.1 - worst.1 > min_gap).then_some((best.0, worst.0))
}

/// One preference row from a prompt row, as the completions were sampled: with a chat
/// template (`chat`) a conversational row (`prompt` the row's messages, a string prompt
/// becoming one user message as the online trainers render it; `chosen` / `rejected` one
/// assistant message each), without one a standard row of strings. `chosen_reward` /
/// `rejected_reward` are the two scores, and the row's other columns are kept. The config's
/// `system_prompt` is not added: a trainer reading the pairs adds its own.
pub fn pair_row(
    row: &Value,
    prompt_column: &str,
    chat: bool,
    chosen: (&str, f64),
    rejected: (&str, f64),
) -> Result<Value> {
    let prompt = row.get(prompt_column).ok_or_else(|| {
        TrainerError::Data(format!(
            "a prompt row has no `{prompt_column}` column; set `prompt_column`"
        ))
    })?;
    let prompt = match prompt {
        Value::String(s) if chat => json!([{"role": "user", "content": s}]),
        p => p.clone(),
    };
    let reply = |text: &str| match chat {
        true => json!([{"role": "assistant", "content": text}]),
        false => json!(text),
    };
    let mut out = Map::new();
    out.insert("prompt".into(), prompt);
    out.insert("chosen".into(), reply(chosen.0));
    out.insert("rejected".into(), reply(rejected.0));
    out.insert("chosen_reward".into(), json!(chosen.1));
    out.insert("rejected_reward".into(), json!(rejected.1));
    if let Value::Object(cols) = row {
        for (k, v) in cols {
            if k != prompt_column && !out.contains_key(k) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(Value::Object(out))
}

/// What [`sampled_pairs`] made.
#[derive(Debug, Default)]
pub struct SampledPairs {
    /// The preference rows, in prompt order.
    pub rows: Vec<Value>,
    /// Prompts sampled.
    pub prompts: usize,
    /// Prompts whose completions all scored the same (within `min_gap`): no pair.
    pub ties: usize,
    /// Completions sampled.
    pub completions: usize,
    /// Mean score of the scored completions.
    pub mean_reward: f64,
}

/// How [`sampled_pairs`] samples and pairs.
#[derive(Debug, Clone)]
pub struct PairSettings {
    /// The sampling (`num_generations` completions per prompt).
    pub rollout: RolloutSettings,
    /// The rows' prompt column (`prompt_column`).
    pub prompt_column: String,
    /// Whether the prompts were rendered with a chat template (conversational rows).
    pub chat: bool,
    /// Smallest score difference that makes a pair.
    pub min_gap: f64,
    /// Prompts sampled at once.
    pub batch: usize,
}

/// Samples `num_generations` completions for each of `items`, scores them with `rewards` and
/// makes one pair per prompt with [`pick_pair`] and [`pair_row`].
pub fn sampled_pairs(
    model: &CausalLm,
    text: &TextBundle,
    items: &[PromptItem],
    rewards: &mut RewardSet,
    ps: &PairSettings,
) -> Result<SampledPairs> {
    let (s, prompt_column, min_gap, batch) = (&ps.rollout, &ps.prompt_column, ps.min_gap, ps.batch);
    let gen_model = rollout_model(model)?;
    let mut out = SampledPairs::default();
    let mut sum = 0.0;
    let mut n_scored = 0usize;
    let idx: Vec<usize> = (0..items.len()).collect();
    for chunk in idx.chunks(batch.max(1)) {
        let samples = sample_completions(&gen_model, text, items, chunk, s)?;
        let scores = score_samples(rewards, items, &samples)?;
        for &p in chunk {
            let mine: Vec<usize> = (0..samples.len())
                .filter(|&i| samples[i].prompt == p)
                .collect();
            let sc: Vec<Option<f64>> = mine
                .iter()
                .map(|&i| scores.is_scored(i).then_some(scores.total[i]))
                .collect();
            for v in sc.iter().flatten() {
                sum += v;
                n_scored += 1;
            }
            let texts: Vec<&str> = mine.iter().map(|&i| samples[i].text.as_str()).collect();
            match pick_pair(&sc, &texts, min_gap) {
                Some((c, r)) => out.rows.push(pair_row(
                    &items[p].row,
                    prompt_column,
                    ps.chat,
                    (&samples[mine[c]].text, sc[c].unwrap_or_default()),
                    (&samples[mine[r]].text, sc[r].unwrap_or_default()),
                )?),
                None => out.ties += 1,
            }
        }
        out.completions += samples.len();
        out.prompts += chunk.len();
        progress(&out);
    }
    out.mean_reward = if n_scored > 0 {
        sum / n_scored as f64
    } else {
        f64::NAN
    };
    Ok(out)
}

fn progress(p: &SampledPairs) {
    eprintln!(
        "  {} prompts, {} completions, {} pairs",
        p.prompts,
        p.completions,
        p.rows.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_and_worst_are_picked_and_ties_skipped() {
        let texts = ["a", "b", "c", "d"];
        let s = [Some(0.1), Some(1.0), None, Some(-0.5)];
        assert_eq!(pick_pair(&s, &texts, 0.0), Some((1, 3)));
        // The first of equal best scores is chosen.
        let s = [Some(1.0), Some(1.0), Some(0.0), Some(0.0)];
        assert_eq!(pick_pair(&s, &texts, 0.0), Some((0, 2)));
        // All equal, or a gap not above min_gap: no pair.
        assert_eq!(pick_pair(&[Some(0.5); 4], &texts, 0.0), None);
        assert_eq!(pick_pair(&s, &texts, 1.0), None);
        // Fewer than two scored.
        assert_eq!(pick_pair(&[None, Some(1.0), None, None], &texts, 0.0), None);
        // NaN scores are not scores.
        let s = [Some(f64::NAN), Some(1.0), Some(0.0), None];
        assert_eq!(pick_pair(&s, &texts, 0.0), Some((1, 2)));
    }

    #[test]
    fn identical_texts_never_pair() {
        let texts = ["x", "x", "y"];
        // The lowest score shares the chosen text (a nondeterministic reward): the next worst
        // different text is rejected.
        let s = [Some(1.0), Some(-1.0), Some(0.0)];
        assert_eq!(pick_pair(&s, &texts, 0.0), Some((0, 2)));
        assert_eq!(pick_pair(&s[..2], &texts[..2], 0.0), None);
    }

    #[test]
    fn rows_keep_the_prompt_format_and_columns() {
        let conv = json!({"prompt": [{"role": "user", "content": "1+1"}], "answer": "2"});
        let r = pair_row(&conv, "prompt", true, ("\\boxed{2}", 1.0), ("3", 0.0)).unwrap();
        assert_eq!(
            r["chosen"],
            json!([{"role": "assistant", "content": "\\boxed{2}"}])
        );
        assert_eq!(r["rejected"][0]["content"], "3");
        assert_eq!(r["answer"], "2");
        assert_eq!(r["chosen_reward"], 1.0);
        let std = json!({"question": "1+1=", "answer": "2"});
        // A string prompt rendered with a chat template was one user message.
        let r = pair_row(&std, "question", true, ("2", 1.0), ("3", 0.0)).unwrap();
        assert_eq!(r["prompt"], json!([{"role": "user", "content": "1+1="}]));
        assert_eq!(
            r["rejected"],
            json!([{"role": "assistant", "content": "3"}])
        );
        // Without a template: a standard row of strings.
        let r = pair_row(&std, "question", false, ("2", 1.0), ("3", 0.0)).unwrap();
        assert_eq!(r["prompt"], "1+1=");
        assert_eq!(r["chosen"], "2");
        assert!(r.get("question").is_none());
        let err = pair_row(&std, "prompt", false, ("2", 1.0), ("3", 0.0)).unwrap_err();
        assert!(err.to_string().contains("prompt_column"), "{err}");
    }
}
