//! Preference pairs from a model's own samples (`rlft data sampled-preferences`): per prompt,
//! `num_generations` completions sampled as a rollout samples them, scored with the config's
//! rewards; the best-scored completion is `chosen`, the worst `rejected`. This is how RLHF
//! collects a reward model's pairs (Llama 2, §3.2.1: pairs of the policy's own samples) and how
//! iterative / online DPO labels them: the rejected replies are what the policy writes, so a
//! reward model trained on them has seen the replies a policy trained against it starts from.
//!
//! With reference replies (a demonstration per prompt), each prompt's best and worst samples
//! that score below its reference are also paired against it, as SPIN pairs a demonstration
//! with the model's own sample (Chen et al. 2024, "Self-Play Fine-Tuning", §4): the reward
//! model then orders what the model writes below what it should write, not only among itself.

use rlft_rewards::RewardSet;
use std::collections::HashMap;

use rlft_text::TextBundle;
use serde_json::{json, Map, Value};

use super::eval::score_samples;
use super::{rollout_model, sample_completions, RolloutSettings, Sample};
use crate::data::preferences::{parse_row, Turns};
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

/// The samples to pair against a prompt's reference reply scored `reference`: the first
/// best-scored and the first worst-scored sample whose text differs from the reference's, each
/// only when it scores below the reference by more than `min_gap` (one index when they are the
/// same sample). Unscored samples and a NaN reference give none.
pub fn reference_pairs(
    reference: (&str, Option<f64>),
    scores: &[Option<f64>],
    texts: &[&str],
    min_gap: f64,
) -> Vec<usize> {
    let Some(r) = reference.1.filter(|v| v.is_finite()) else {
        return Vec::new();
    };
    let below: Vec<(usize, f64)> = scores
        .iter()
        .enumerate()
        .filter(|&(i, _)| texts[i] != reference.0)
        .filter_map(|(i, s)| {
            s.filter(|v| v.is_finite() && r - v > min_gap)
                .map(|v| (i, v))
        })
        .collect();
    let (Some(&first), mut out) = (below.first(), Vec::new()) else {
        return Vec::new();
    };
    let (mut best, mut worst) = (first, first);
    for &(i, v) in &below {
        if v > best.1 {
            best = (i, v);
        }
        if v < worst.1 {
            worst = (i, v);
        }
    }
    out.push(best.0);
    if worst.0 != best.0 && texts[worst.0] != texts[best.0] {
        out.push(worst.0);
    }
    out
}

/// Reference replies for `items` from preference rows (`reference_rows`, e.g. the pairs of
/// `rlft data tiny-python-expr --preferences`): a row whose prompt (explicit or implicit, as
/// the preference trainers read it) equals an item's prompt gives its `chosen` reply as that
/// item's reference; the first such row wins. A string prompt rendered with a chat template
/// (`chat`) matches a one-user-message prompt, as [`pair_row`] writes it. A conversational
/// `chosen` must be one assistant message of text.
pub fn reference_replies(
    items: &[PromptItem],
    prompt_column: &str,
    chat: bool,
    reference_rows: &[Value],
) -> Result<Vec<Option<String>>> {
    let mut by_prompt: HashMap<String, String> = HashMap::new();
    for (i, row) in reference_rows.iter().enumerate() {
        let pref = parse_row(row, i)?;
        let reply = match &pref.chosen {
            Turns::Text(t) => t.clone(),
            Turns::Messages(m) => match m.as_slice() {
                [one] if one.role == "assistant" => one
                    .content
                    .as_ref()
                    .and_then(|c| c.as_text())
                    .map(str::to_string)
                    .ok_or_else(|| not_one_reply(i))?,
                _ => return Err(not_one_reply(i)),
            },
        };
        by_prompt.entry(prompt_key(&pref.prompt)?).or_insert(reply);
    }
    items
        .iter()
        .map(|item| {
            let prompt = match item.row.get(prompt_column).map(|p| pair_prompt(p, chat)) {
                Some(Value::String(s)) => Turns::Text(s),
                Some(v) => match serde_json::from_value(v) {
                    Ok(m) => Turns::Messages(m),
                    Err(_) => return Ok(None),
                },
                None => return Ok(None),
            };
            Ok(by_prompt.get(&prompt_key(&prompt)?).cloned())
        })
        .collect()
}

/// A prompt as a lookup key: equal keys for equal prompts (object keys sorted, as `Message`'s
/// equality ignores the order of its extra fields), text and conversations apart.
fn prompt_key(prompt: &Turns) -> Result<String> {
    fn sorted(v: Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut kv: Vec<(String, Value)> = m.into_iter().collect();
                kv.sort_by(|a, b| a.0.cmp(&b.0));
                Value::Object(kv.into_iter().map(|(k, v)| (k, sorted(v))).collect())
            }
            Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
            v => v,
        }
    }
    Ok(match prompt {
        Turns::Text(t) => format!("t{t}"),
        Turns::Messages(m) => {
            let v = serde_json::to_value(m).map_err(|e| TrainerError::Data(e.to_string()))?;
            format!("m{}", sorted(v))
        }
    })
}

fn not_one_reply(row: usize) -> TrainerError {
    TrainerError::Data(format!(
        "reference row {row}: `chosen` is not one assistant message of text; a reference reply \
         is a string or `[{{\"role\": \"assistant\", \"content\": \"...\"}}]`"
    ))
}

/// A prompt row's prompt as a preference row holds it: under a chat template (`chat`) a string
/// prompt becomes one user message, as the online trainers render it; anything else is kept.
fn pair_prompt(prompt: &Value, chat: bool) -> Value {
    match prompt {
        Value::String(s) if chat => json!([{"role": "user", "content": s}]),
        p => p.clone(),
    }
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
    let prompt = pair_prompt(prompt, chat);
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
    /// Prompts that had a reference reply.
    pub references: usize,
    /// Rows pairing a reference reply with a sample (within `rows`).
    pub reference_rows: usize,
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
/// makes one pair per prompt with [`pick_pair`] and [`pair_row`]. `references` (empty, or one
/// per item) holds reference replies: each is scored with the samples, and
/// [`reference_pairs`] pairs it against the prompt's samples that score below it.
pub fn sampled_pairs(
    model: &CausalLm,
    text: &TextBundle,
    items: &[PromptItem],
    references: &[Option<String>],
    rewards: &mut RewardSet,
    ps: &PairSettings,
) -> Result<SampledPairs> {
    if !references.is_empty() && references.len() != items.len() {
        return Err(TrainerError::Data(format!(
            "{} reference replies for {} prompts: pass one (or none) per prompt",
            references.len(),
            items.len()
        )));
    }
    let (s, batch) = (&ps.rollout, ps.batch);
    let gen_model = rollout_model(model)?;
    let mut out = SampledPairs::default();
    let mut sum = 0.0;
    let mut n_scored = 0usize;
    let idx: Vec<usize> = (0..items.len()).collect();
    for chunk in idx.chunks(batch.max(1)) {
        let mut samples = sample_completions(&gen_model, text, items, chunk, s, None)?;
        let sampled = samples.len();
        let mut ref_of = vec![None; chunk.len()];
        for (k, &p) in chunk.iter().enumerate() {
            if let Some(Some(r)) = references.get(p) {
                ref_of[k] = Some(samples.len());
                samples.push(reference_sample(text, p, r, &s.eos_token_ids)?);
            }
        }
        let scores = score_samples(rewards, items, &samples)?;
        let score = |i: usize| scores.is_scored(i).then_some(scores.total[i]);
        for (k, &p) in chunk.iter().enumerate() {
            let mine: Vec<usize> = (0..sampled).filter(|&i| samples[i].prompt == p).collect();
            let sc: Vec<Option<f64>> = mine.iter().map(|&i| score(i)).collect();
            for v in sc.iter().flatten() {
                sum += v;
                n_scored += 1;
            }
            let texts: Vec<&str> = mine.iter().map(|&i| samples[i].text.as_str()).collect();
            let reference = ref_of[k].map(|ri| (samples[ri].text.as_str(), score(ri)));
            add_pairs(&mut out, &items[p].row, ps, (&texts, &sc), reference)?;
        }
        out.completions += sampled;
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

/// Adds one prompt's rows to `out`: the sampled pair ([`pick_pair`]; a tie counted) and, with a
/// scored `reference`, the reference against the samples [`reference_pairs`] picks.
fn add_pairs(
    out: &mut SampledPairs,
    row: &Value,
    ps: &PairSettings,
    (texts, scores): (&[&str], &[Option<f64>]),
    reference: Option<(&str, Option<f64>)>,
) -> Result<()> {
    let make = |c: (&str, Option<f64>), r: (&str, Option<f64>)| {
        let (c, r) = (
            (c.0, c.1.unwrap_or_default()),
            (r.0, r.1.unwrap_or_default()),
        );
        pair_row(row, &ps.prompt_column, ps.chat, c, r)
    };
    match pick_pair(scores, texts, ps.min_gap) {
        Some((c, r)) => out
            .rows
            .push(make((texts[c], scores[c]), (texts[r], scores[r]))?),
        None => out.ties += 1,
    }
    if let Some(reference) = reference {
        out.references += 1;
        for r in reference_pairs(reference, scores, texts, ps.min_gap) {
            out.rows.push(make(reference, (texts[r], scores[r]))?);
            out.reference_rows += 1;
        }
    }
    Ok(())
}

/// A reference reply as a sample of prompt `p`: its tokens (no special tokens added) and the
/// first EOS id, as a sampled completion that ended holds them; never truncated.
fn reference_sample(text: &TextBundle, p: usize, reply: &str, eos: &[u32]) -> Result<Sample> {
    let mut completion_ids = text.encode(reply, false)?;
    completion_ids.extend(eos.first());
    Ok(Sample::new(p, completion_ids, reply.to_string(), false))
}

fn progress(p: &SampledPairs) {
    eprintln!(
        "  {} prompts, {} completions, {} pairs ({} against a reference)",
        p.prompts,
        p.completions,
        p.rows.len(),
        p.reference_rows
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
    fn references_pair_with_the_best_and_worst_sample_below_them() {
        let texts = ["a", "b", "c", "d"];
        let s = [Some(0.9), Some(0.0), Some(1.0), Some(0.0)];
        // Below the reference's 1.0: a (best, 0.9) and b (first worst); c ties it.
        assert_eq!(
            reference_pairs(("ref", Some(1.0)), &s, &texts, 0.0),
            vec![0, 1]
        );
        // min_gap: 0.9 is not more than 0.5 below.
        assert_eq!(
            reference_pairs(("ref", Some(1.0)), &s, &texts, 0.5),
            vec![1]
        );
        // All samples tie among themselves (no sampled pair) but lose to the reference.
        let zeros = [Some(0.0); 4];
        assert_eq!(
            reference_pairs(("ref", Some(1.0)), &zeros, &texts, 0.0),
            vec![0]
        );
        // A sample equal to the reference's text, unscored samples, and a NaN reference.
        let same = ["ref", "b", "c", "d"];
        let s = [Some(0.0), None, Some(0.5), Some(0.5)];
        assert_eq!(reference_pairs(("ref", Some(1.0)), &s, &same, 0.0), vec![2]);
        assert!(reference_pairs(("ref", Some(f64::NAN)), &s, &texts, 0.0).is_empty());
        assert!(reference_pairs(("ref", None), &s, &texts, 0.0).is_empty());
        // A reference the samples beat pairs with nothing.
        assert!(reference_pairs(("ref", Some(0.0)), &[Some(1.0)], &["a"], 0.0).is_empty());
    }

    #[test]
    fn reference_replies_match_prompts() {
        let item = |prompt: Value| PromptItem {
            row_index: 0,
            ids: Vec::new(),
            text: String::new(),
            messages: Vec::new(),
            row: json!({ "prompt": prompt }),
        };
        let user = |t: &str| json!([{"role": "user", "content": t}]);
        let said = |t: &str| json!([{"role": "assistant", "content": t}]);
        let refs = [
            json!({"prompt": user("1+1"), "chosen": said("2"), "rejected": said("3")}),
            json!({"prompt": user("1+1"), "chosen": said("two"), "rejected": said("3")}),
            json!({"prompt": "2+2=", "chosen": "4", "rejected": "5"}),
        ];
        let items = [
            item(user("1+1")),
            item(json!("1+1")),
            item(json!("2+2=")),
            item(user("9")),
        ];
        // The first row of a prompt wins; a string prompt under a chat template is one user
        // message; without a template it matches a string prompt.
        let got = reference_replies(&items, "prompt", true, &refs).unwrap();
        assert_eq!(got, [Some("2".into()), Some("2".into()), None, None]);
        // Extra message fields match in any order.
        let named = json!({"prompt": [{"name": "u", "role": "user", "content": "9"}],
            "chosen": said("nine"), "rejected": said("0")});
        let asked = item(json!([{"role": "user", "content": "9", "name": "u"}]));
        let got = reference_replies(&[asked], "prompt", true, &[named]).unwrap();
        assert_eq!(got, [Some("nine".into())]);
        let got = reference_replies(&items, "prompt", false, &refs).unwrap();
        assert_eq!(got, [Some("2".into()), None, Some("4".into()), None]);
        // A chosen conversation of more than one assistant message is refused, naming the row.
        let two = json!({"prompt": user("1"), "chosen": [{"role": "assistant", "content": "a"},
            {"role": "user", "content": "b"}], "rejected": said("c")});
        let err = reference_replies(&items, "prompt", true, &[two]).unwrap_err();
        assert!(err.to_string().contains("reference row 0"), "{err}");
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
