//! Dataset rows -> chat-templated prompt token ids, with the length policy counted.
//!
//! `prompt` may be a string (sent as one user message) or a list of `{role, content}`
//! messages; `system_prompt` is put first when the conversation has no system message. Models
//! without a chat template get the raw string (a list of messages is then an error). Every
//! column of the row travels with the prompt to the rewards.

use rlft_data::Dataset;
use rlft_text::{Message, TextBundle};
use serde_json::Value;

use super::LengthPolicy;
use crate::error::{Result, TrainerError};

/// One training or eval prompt.
#[derive(Debug, Clone)]
pub struct PromptItem {
    /// Index of the row in its dataset.
    pub row_index: usize,
    /// Token ids of the rendered prompt (generation prompt included).
    pub ids: Vec<u32>,
    /// The rendered prompt text (what the ids encode).
    pub text: String,
    /// The conversation the prompt renders (empty for a model without a chat template): what
    /// tool answers are rendered after ([`crate::rollout::turns`]).
    pub messages: Vec<Message>,
    /// The whole dataset row (rewards read their columns from it).
    pub row: Value,
}

/// What the length policy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptReport {
    /// Rows read.
    pub rows: usize,
    /// Prompts over `max_prompt_length` that were dropped.
    pub dropped: usize,
    /// Prompts over `max_prompt_length` that kept only their last tokens.
    pub truncated: usize,
    /// Longest prompt before the policy, in tokens.
    pub longest: usize,
}

impl std::fmt::Display for PromptReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rows, longest prompt {} tokens, {} dropped and {} truncated for max_prompt_length",
            self.rows, self.longest, self.dropped, self.truncated
        )
    }
}

fn messages(row: &Value, col: &str, index: usize, system: Option<&str>) -> Result<Vec<Message>> {
    let v = row.get(col).filter(|v| !v.is_null()).ok_or_else(|| {
        let keys: Vec<String> = row
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        TrainerError::Data(format!(
            "row {index} has no `{col}` column (columns: {}); set `prompt_column` to the column \
             holding the prompt",
            keys.join(", ")
        ))
    })?;
    let mut msgs = match v {
        Value::String(s) => vec![Message::user(s.as_str())],
        Value::Array(_) => serde_json::from_value::<Vec<Message>>(v.clone()).map_err(|e| {
            TrainerError::Data(format!(
                "row {index}: `{col}` is neither a string nor a list of {{role, content}} \
                 messages ({e})"
            ))
        })?,
        other => {
            return Err(TrainerError::Data(format!(
                "row {index}: `{col}` is a {}; expected a string or a list of messages",
                json_kind(other)
            )))
        }
    };
    if let Some(s) = system {
        if msgs.first().is_none_or(|m| m.role != "system") {
            msgs.insert(0, Message::system(s));
        }
    }
    Ok(msgs)
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// How [`build_prompts`] renders a row.
#[derive(Debug, Clone, Copy)]
pub struct PromptFormat<'a> {
    /// The column holding the prompt.
    pub column: &'a str,
    /// Put first when the conversation has no system message.
    pub system_prompt: Option<&'a str>,
    /// Tool schemas for the template's `tools` variable (`None`: no tools).
    pub tools: Option<&'a [Value]>,
}

/// Renders and tokenizes every row of `ds`; applies the length policy.
pub fn build_prompts(
    ds: &Dataset,
    text: &TextBundle,
    format: PromptFormat<'_>,
    max_prompt_length: usize,
    policy: LengthPolicy,
) -> Result<(Vec<PromptItem>, PromptReport)> {
    let PromptFormat {
        column: prompt_column,
        system_prompt,
        tools,
    } = format;
    let template = text.compile_chat_template().ok();
    let mut opts = text.render_options(true);
    opts.tools = tools.map(<[Value]>::to_vec);
    let mut report = PromptReport {
        rows: ds.len(),
        ..Default::default()
    };
    let mut out = Vec::with_capacity(ds.len());
    for (i, row) in ds.iter().enumerate() {
        let msgs = messages(row, prompt_column, i, system_prompt)?;
        let rendered = match &template {
            Some(t) => t.render(&msgs, &opts)?,
            None => match (
                msgs.len(),
                msgs.last()
                    .and_then(|m| m.content.as_ref())
                    .and_then(|c| c.as_text()),
            ) {
                (1, Some(s)) => s.to_string(),
                _ => {
                    return Err(TrainerError::Data(format!(
                        "row {i}: the model has no chat template, so prompts must be plain \
                         strings without a system_prompt"
                    )))
                }
            },
        };
        let mut ids = text.encode(&rendered, false)?;
        if ids.is_empty() {
            return Err(TrainerError::Data(format!(
                "row {i}: the prompt renders to no tokens"
            )));
        }
        report.longest = report.longest.max(ids.len());
        if ids.len() > max_prompt_length {
            match policy {
                LengthPolicy::Drop => {
                    report.dropped += 1;
                    continue;
                }
                LengthPolicy::Truncate => {
                    report.truncated += 1;
                    ids.drain(..ids.len() - max_prompt_length);
                }
            }
        }
        out.push(PromptItem {
            row_index: i,
            ids,
            text: rendered,
            messages: if template.is_some() { msgs } else { Vec::new() },
            row: row.clone(),
        });
    }
    if out.is_empty() && !ds.is_empty() {
        return Err(TrainerError::Data(format!(
            "every prompt is longer than max_prompt_length = {max_prompt_length} tokens (longest \
             {}); raise max_prompt_length or set prompt_truncation = \"truncate\"",
            report.longest
        )));
    }
    Ok((out, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlft_model::tiny::tiny_text_bundle;
    use serde_json::json;

    fn fmt(system_prompt: Option<&str>) -> PromptFormat<'_> {
        PromptFormat {
            column: "prompt",
            system_prompt,
            tools: None,
        }
    }

    #[test]
    fn strings_and_messages_render_and_length_policy_counts() {
        let text = tiny_text_bundle().unwrap();
        let ds = Dataset::from_rows(vec![
            json!({"prompt": "hello", "answer": "1"}),
            json!({"prompt": [{"role": "user", "content": "hi there"}], "answer": "2"}),
            json!({"prompt": "a much longer prompt with many words in it to exceed", "answer": "3"}),
        ])
        .unwrap();
        let (p, r) = build_prompts(&ds, &text, fmt(Some("sys")), 1000, LengthPolicy::Drop).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(r.dropped, 0);
        assert!(p[0].text.contains("sys") && p[0].text.contains("hello"));
        assert_eq!(p[1].row["answer"], "2");
        let limit = p[0].ids.len().max(p[1].ids.len());
        let (p2, r2) =
            build_prompts(&ds, &text, fmt(Some("sys")), limit, LengthPolicy::Drop).unwrap();
        assert_eq!((p2.len(), r2.dropped), (2, 1));
        let (p3, r3) =
            build_prompts(&ds, &text, fmt(Some("sys")), limit, LengthPolicy::Truncate).unwrap();
        assert_eq!((p3.len(), r3.truncated), (3, 1));
        assert_eq!(p3[2].ids.len(), limit);
        assert_eq!(p3[2].ids.last(), p[2].ids.last());
    }

    #[test]
    fn missing_column_names_the_fix() {
        let text = tiny_text_bundle().unwrap();
        let ds = Dataset::from_rows(vec![json!({"question": "x"})]).unwrap();
        let e = build_prompts(&ds, &text, fmt(None), 100, LengthPolicy::Drop)
            .unwrap_err()
            .to_string();
        assert!(e.contains("prompt_column") && e.contains("question"), "{e}");
    }
}
