//! Scoring dataset rows with a reward model (`rlft score`): which text of a row is scored, and
//! the batched scores.
//!
//! A row is scored as the reward model was trained to read it:
//! - `chosen` + `rejected` (a preference row, any format [`crate::data::preferences`] reads):
//!   both sequences, as in training;
//! - `prompt` + `completion`: the prompt followed by the completion (strings: EOS appended when
//!   missing, as preference training does; message lists: the chat template, the completion as
//!   the assistant turn when it is a string);
//! - `messages`: the conversation through the chat template;
//! - `text`: the string as it is.

use rlft_data::Dataset;
use rlft_model::score::ScoreModel;
use rlft_text::{ChatTemplate, Message};
use serde_json::{json, Value};

use crate::data::preferences;
use crate::error::{Result, TrainerError};

/// What a row asks to score.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScoreItem {
    /// One sequence.
    Single(Vec<u32>),
    /// A preference pair: chosen, rejected.
    Pair(Vec<u32>, Vec<u32>),
}

fn messages(v: &Value, col: &str, row: usize) -> Result<Vec<Message>> {
    match v {
        Value::String(s) => Ok(vec![Message::assistant(s.as_str())]),
        _ => serde_json::from_value(v.clone()).map_err(|e| {
            TrainerError::Data(format!(
                "row {row}: `{col}` is not a string or a list of {{role, content}} messages ({e})"
            ))
        }),
    }
}

/// The sequences row `index` asks to score (see the module docs); `system_prompt` goes first in
/// conversations without a system message.
pub fn row_item(
    sm: &ScoreModel,
    template: Option<&ChatTemplate>,
    row: &Value,
    index: usize,
    system_prompt: Option<&str>,
) -> Result<ScoreItem> {
    let text = &sm.text;
    let has = |c: &str| row.get(c).is_some_and(|v| !v.is_null());
    if has("chosen") || has("rejected") {
        let p = preferences::parse_row(row, index)?;
        let r = preferences::render(&p, text, template, system_prompt)?;
        let enc = |s: &str| text.encode(s, !r.conversational);
        return Ok(ScoreItem::Pair(
            enc(&r.prompt_chosen)?,
            enc(&r.prompt_rejected)?,
        ));
    }
    let chat = |mut msgs: Vec<Message>| -> Result<ScoreItem> {
        let tpl = template.ok_or_else(|| {
            TrainerError::Data(format!(
                "row {index} is conversational but the model has no chat template"
            ))
        })?;
        if let Some(s) = system_prompt {
            if msgs.first().is_none_or(|m| m.role != "system") {
                msgs.insert(0, Message::system(s));
            }
        }
        let t = tpl.render(&msgs, &text.render_options(false))?;
        Ok(ScoreItem::Single(text.encode(&t, false)?))
    };
    if has("prompt") && has("completion") {
        let (p, c) = (&row["prompt"], &row["completion"]);
        if let (Value::String(p), Value::String(c)) = (p, c) {
            // The standard format of preference training: prompt + completion + EOS.
            let eos = text.special.eos.as_deref().unwrap_or("");
            let mut t = format!("{p}{c}");
            if !c.ends_with(eos) {
                t.push_str(eos);
            }
            return Ok(ScoreItem::Single(text.encode(&t, true)?));
        }
        let mut msgs = match p {
            Value::String(s) => vec![Message::user(s.as_str())],
            other => messages(other, "prompt", index)?,
        };
        msgs.extend(messages(c, "completion", index)?);
        return chat(msgs);
    }
    if has("messages") {
        return chat(messages(&row["messages"], "messages", index)?);
    }
    if let Some(Value::String(t)) = row.get("text") {
        return Ok(ScoreItem::Single(text.encode(t, true)?));
    }
    let cols = row
        .as_object()
        .map(|o| o.keys().cloned().collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    Err(TrainerError::Data(format!(
        "row {index} has nothing to score (columns: {cols}); give `chosen` + `rejected`, \
         `prompt` + `completion`, `messages` or `text`"
    )))
}

/// What scoring a dataset found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScoreSummary {
    /// Rows scored.
    pub rows: usize,
    /// Mean score of single rows and of both sides of pairs.
    pub mean_score: f64,
    /// Preference rows among them.
    pub pairs: usize,
    /// Share of preference rows whose chosen side scores higher.
    pub accuracy: Option<f64>,
}

/// Scores every row of `ds` (`batch_size` sequences per forward pass): one JSON object per
/// row, `{"row", "score"}` or `{"row", "chosen_score", "rejected_score"}`, and the summary.
pub fn score_dataset(
    sm: &ScoreModel,
    ds: &Dataset,
    system_prompt: Option<&str>,
    batch_size: usize,
) -> Result<(Vec<Value>, ScoreSummary)> {
    let template = sm.text.compile_chat_template().ok();
    let items: Vec<ScoreItem> = ds
        .iter()
        .enumerate()
        .map(|(i, row)| row_item(sm, template.as_ref(), row, i, system_prompt))
        .collect::<Result<_>>()?;
    let mut seqs: Vec<Vec<u32>> = Vec::new();
    for it in &items {
        match it {
            ScoreItem::Single(s) => seqs.push(s.clone()),
            ScoreItem::Pair(c, r) => {
                seqs.push(c.clone());
                seqs.push(r.clone());
            }
        }
    }
    if let Some(i) = seqs.iter().position(Vec::is_empty) {
        return Err(TrainerError::Data(format!(
            "a sequence of row {i} or later tokenizes to nothing; give it some text"
        )));
    }
    let scores = sm.score_rows(&seqs, batch_size)?;
    let mut it = scores.iter().copied();
    let mut out = Vec::with_capacity(items.len());
    let (mut sum, mut n, mut pairs, mut wins) = (0f64, 0usize, 0usize, 0usize);
    for (row, item) in items.iter().enumerate() {
        match item {
            ScoreItem::Single(_) => {
                let s = it.next().expect("one score per sequence");
                sum += s as f64;
                n += 1;
                out.push(json!({"row": row, "score": s}));
            }
            ScoreItem::Pair(..) => {
                let (c, r) = (it.next().expect("chosen"), it.next().expect("rejected"));
                sum += c as f64 + r as f64;
                n += 2;
                pairs += 1;
                wins += usize::from(c > r);
                out.push(json!({"row": row, "chosen_score": c, "rejected_score": r}));
            }
        }
    }
    let summary = ScoreSummary {
        rows: items.len(),
        mean_score: sum / n.max(1) as f64,
        pairs,
        accuracy: (pairs > 0).then(|| wins as f64 / pairs as f64),
    };
    Ok((out, summary))
}
