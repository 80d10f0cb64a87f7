//! Dataset rows -> SFT examples: token ids and a loss mask that covers only what the model
//! should learn to write (the completion, or the assistant turns of a conversation).
//!
//! Formats, as TRL's `SFTTrainer` accepts them:
//! - prompt-completion: `prompt` and `completion` columns, each a string or a list of chat
//!   messages; loss on the completion.
//! - conversational: a `messages` column (list of `{role, content}`); loss on every assistant
//!   turn, including the template's end-of-turn token so the model learns to stop.
//!
//! Chat text is rendered once with the model's template and tokenized once; the loss mask comes
//! from byte offsets of the rendered assistant spans. That needs each conversation prefix to
//! render as a prefix of the whole conversation, which holds for ChatML, Llama 3 and most
//! templates; a template that rewrites earlier turns gets a clear error.

use rlft_text::{ChatTemplate, Message, TextBundle};

pub use super::LengthPolicy;
use serde_json::Value;

/// Errors building SFT examples; each says how to fix the data or the config.
#[derive(Debug, thiserror::Error)]
pub enum SftDataError {
    /// A row lacks a column or has the wrong type.
    #[error("row {row}: {msg}")]
    BadRow {
        /// Row index in the dataset.
        row: usize,
        /// What is wrong.
        msg: String,
    },
    /// Neither format's columns are present.
    #[error("the dataset has columns {found:?}; SFT needs `prompt` + `completion` or `messages` (rename the columns, or set prompt_column/completion_column/messages_column in the config)")]
    UnknownFormat {
        /// Columns present.
        found: Vec<String>,
    },
    /// Chat rows but the tokenizer has no chat template.
    #[error("row {row} is conversational but the model has no chat template; use a string prompt/completion dataset or a model with a chat template")]
    NoTemplate {
        /// Row index.
        row: usize,
    },
    /// The template does not render conversation prefixes as prefixes.
    #[error("row {row}: the chat template renders the first {turns} messages differently from the start of the whole conversation, so assistant tokens cannot be located; use a prompt-completion dataset")]
    NotPrefixStable {
        /// Row index.
        row: usize,
        /// Messages in the prefix.
        turns: usize,
    },
    /// Tokenizer or template errors.
    #[error(transparent)]
    Text(#[from] rlft_text::TextError),
}

/// Result alias of this module.
pub type Result<T, E = SftDataError> = std::result::Result<T, E>;

/// Which columns hold the example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SftFormat {
    /// Prompt and completion columns.
    PromptCompletion {
        /// Prompt column name.
        prompt: String,
        /// Completion column name.
        completion: String,
    },
    /// One column of chat messages.
    Conversational {
        /// Messages column name.
        messages: String,
    },
}

impl SftFormat {
    /// Picks the format from the dataset's column names (`messages` wins over
    /// `prompt`/`completion` when both exist).
    pub fn detect(columns: &[String]) -> Result<Self> {
        let has = |c: &str| columns.iter().any(|x| x == c);
        if has("messages") {
            Ok(SftFormat::Conversational {
                messages: "messages".into(),
            })
        } else if has("prompt") && has("completion") {
            Ok(SftFormat::PromptCompletion {
                prompt: "prompt".into(),
                completion: "completion".into(),
            })
        } else {
            Err(SftDataError::UnknownFormat {
                found: columns.to_vec(),
            })
        }
    }
}

/// One tokenized training example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftExample {
    /// Token ids of the whole text.
    pub input_ids: Vec<u32>,
    /// `loss_mask[i]`: token `i` is a target (predicted from tokens `..i`).
    pub loss_mask: Vec<bool>,
}

impl SftExample {
    /// Number of target tokens.
    pub fn num_targets(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m).count()
    }
}

/// How the examples of a dataset fared against the length limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LengthReport {
    /// Examples kept whole.
    pub kept: usize,
    /// Examples cut to the limit.
    pub truncated: usize,
    /// Examples dropped (too long, or no target token left).
    pub dropped: usize,
}

/// Applies the length policy; `None` means the example is dropped. An example whose targets
/// were all cut away is dropped too (it would teach nothing).
pub fn fit_length(
    ex: SftExample,
    max_length: usize,
    policy: LengthPolicy,
    report: &mut LengthReport,
) -> Option<SftExample> {
    if ex.input_ids.len() <= max_length {
        report.kept += 1;
        return Some(ex);
    }
    match policy {
        LengthPolicy::Drop => {
            report.dropped += 1;
            None
        }
        LengthPolicy::Truncate => {
            let mut ex = ex;
            ex.input_ids.truncate(max_length);
            ex.loss_mask.truncate(max_length);
            // Position 0 is never a target (nothing precedes it).
            if ex.loss_mask.iter().skip(1).any(|&m| m) {
                report.truncated += 1;
                Some(ex)
            } else {
                report.dropped += 1;
                None
            }
        }
    }
}

fn messages_of(v: &Value, row: usize, col: &str) -> Result<Vec<Message>> {
    serde_json::from_value(v.clone()).map_err(|e| SftDataError::BadRow {
        row,
        msg: format!("column `{col}` is not a list of {{role, content}} messages ({e})"),
    })
}

fn column<'a>(row_v: &'a Value, col: &str, row: usize) -> Result<&'a Value> {
    row_v
        .get(col)
        .filter(|v| !v.is_null())
        .ok_or_else(|| SftDataError::BadRow {
            row,
            msg: format!("missing value in column `{col}`"),
        })
}

/// Tokenizes `text`, marking as targets the tokens that start inside one of `spans` (byte
/// ranges of `text`).
fn tokenize_with_spans(
    text_bundle: &TextBundle,
    text: &str,
    spans: &[std::ops::Range<usize>],
) -> Result<SftExample> {
    let (input_ids, offsets) = text_bundle.encode_with_offsets(text)?;
    let loss_mask = offsets
        .iter()
        .map(|&(start, _)| spans.iter().any(|s| s.contains(&start)))
        .collect();
    Ok(SftExample {
        input_ids,
        loss_mask,
    })
}

fn render(
    tpl: &ChatTemplate,
    text: &TextBundle,
    msgs: &[Message],
    generation_prompt: bool,
) -> Result<String> {
    Ok(tpl.render(msgs, &text.render_options(generation_prompt))?)
}

/// Builds the example of dataset row `row_index`. `system_prompt`, when set, is put first in
/// conversations that have no system message.
pub fn build_example(
    text: &TextBundle,
    template: Option<&ChatTemplate>,
    format: &SftFormat,
    row: &Value,
    row_index: usize,
    system_prompt: Option<&str>,
) -> Result<SftExample> {
    let with_system = |mut m: Vec<Message>| {
        if let Some(s) = system_prompt {
            if m.first().is_none_or(|x| x.role != "system") {
                m.insert(0, Message::system(s));
            }
        }
        m
    };
    match format {
        SftFormat::Conversational { messages } => {
            let tpl = template.ok_or(SftDataError::NoTemplate { row: row_index })?;
            let msgs = with_system(messages_of(
                column(row, messages, row_index)?,
                row_index,
                messages,
            )?);
            let full = render(tpl, text, &msgs, false)?;
            let mut spans = Vec::new();
            for (i, m) in msgs.iter().enumerate() {
                if m.role != "assistant" {
                    continue;
                }
                let before = render(tpl, text, &msgs[..i], true)?;
                let through = render(tpl, text, &msgs[..=i], false)?;
                if !full.starts_with(&before) || !full.starts_with(&through) {
                    return Err(SftDataError::NotPrefixStable {
                        row: row_index,
                        turns: i + 1,
                    });
                }
                spans.push(before.len()..through.len());
            }
            if spans.is_empty() {
                return Err(SftDataError::BadRow {
                    row: row_index,
                    msg: format!("column `{messages}` has no assistant message to learn from"),
                });
            }
            tokenize_with_spans(text, &full, &spans)
        }
        SftFormat::PromptCompletion { prompt, completion } => {
            let p = column(row, prompt, row_index)?;
            let c = column(row, completion, row_index)?;
            match (p, c) {
                (Value::String(p), Value::String(c)) => {
                    let mut full = format!("{p}{c}");
                    if let Some(eos) = &text.special.eos {
                        if !c.ends_with(eos.as_str()) {
                            full.push_str(eos);
                        }
                    }
                    tokenize_with_spans(text, &full, std::slice::from_ref(&(p.len()..full.len())))
                }
                (Value::Array(_), _) => {
                    let tpl = template.ok_or(SftDataError::NoTemplate { row: row_index })?;
                    let prompt_msgs = with_system(messages_of(p, row_index, prompt)?);
                    let completion_msgs = match c {
                        Value::String(s) => vec![Message::assistant(s.as_str())],
                        other => messages_of(other, row_index, completion)?,
                    };
                    let before = render(tpl, text, &prompt_msgs, true)?;
                    let mut all = prompt_msgs;
                    all.extend(completion_msgs);
                    let full = render(tpl, text, &all, false)?;
                    if !full.starts_with(&before) {
                        return Err(SftDataError::NotPrefixStable {
                            row: row_index,
                            turns: all.len(),
                        });
                    }
                    tokenize_with_spans(
                        text,
                        &full,
                        std::slice::from_ref(&(before.len()..full.len())),
                    )
                }
                _ => Err(SftDataError::BadRow {
                    row: row_index,
                    msg: format!(
                        "`{prompt}` must be a string or a list of messages, and `{completion}` a \
                         string when `{prompt}` is a string"
                    ),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bundle() -> (TextBundle, ChatTemplate) {
        let t = rlft_model::tiny::tiny_text_bundle().unwrap();
        let tpl = t.compile_chat_template().unwrap();
        (t, tpl)
    }

    fn targets(t: &TextBundle, ex: &SftExample) -> String {
        let ids: Vec<u32> = ex
            .input_ids
            .iter()
            .zip(&ex.loss_mask)
            .filter(|(_, &m)| m)
            .map(|(&i, _)| i)
            .collect();
        t.decode(&ids, false).unwrap()
    }

    #[test]
    fn conversational_loss_covers_assistant_turns_only() {
        let (t, tpl) = bundle();
        let row = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"}]});
        let fmt = SftFormat::detect(&["messages".to_string()]).unwrap();
        let ex = build_example(&t, Some(&tpl), &fmt, &row, 0, Some("Be brief.")).unwrap();
        assert_eq!(targets(&t, &ex), "hello<|im_end|>\n4<|im_end|>\n");
        let all = t.decode(&ex.input_ids, false).unwrap();
        assert!(all.starts_with("<|im_start|>system\nBe brief.<|im_end|>"));
        assert_eq!(ex.input_ids.len(), ex.loss_mask.len());
    }

    #[test]
    fn prompt_completion_strings_and_chat() {
        let (t, tpl) = bundle();
        let cols = ["prompt".to_string(), "completion".to_string()];
        let fmt = SftFormat::detect(&cols).unwrap();
        let row = json!({"prompt": "2+2=", "completion": "4"});
        let ex = build_example(&t, Some(&tpl), &fmt, &row, 0, None).unwrap();
        assert_eq!(targets(&t, &ex), "4<|im_end|>");
        let row = json!({"prompt": [{"role": "user", "content": "2+2?"}], "completion": "4"});
        let ex = build_example(&t, Some(&tpl), &fmt, &row, 3, None).unwrap();
        assert_eq!(targets(&t, &ex), "4<|im_end|>\n");
        let bad = json!({"prompt": 5, "completion": "4"});
        let e = build_example(&t, Some(&tpl), &fmt, &bad, 7, None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("row 7"), "{e}");
        let missing = json!({"prompt": "x"});
        let e = build_example(&t, Some(&tpl), &fmt, &missing, 2, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("completion"), "{e}");
    }

    #[test]
    fn unknown_columns_are_named() {
        let e = SftFormat::detect(&["text".to_string()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("text") && e.contains("messages"), "{e}");
    }

    #[test]
    fn length_policy_counts() {
        let ex = SftExample {
            input_ids: vec![1, 2, 3, 4, 5],
            loss_mask: vec![false, false, true, true, true],
        };
        let mut r = LengthReport::default();
        assert!(fit_length(ex.clone(), 5, LengthPolicy::Drop, &mut r).is_some());
        assert!(fit_length(ex.clone(), 4, LengthPolicy::Drop, &mut r).is_none());
        let cut = fit_length(ex.clone(), 3, LengthPolicy::Truncate, &mut r).unwrap();
        assert_eq!(cut.input_ids, vec![1, 2, 3]);
        assert!(fit_length(ex, 2, LengthPolicy::Truncate, &mut r).is_none());
        assert_eq!(
            r,
            LengthReport {
                kept: 1,
                truncated: 1,
                dropped: 2
            }
        );
    }
}
