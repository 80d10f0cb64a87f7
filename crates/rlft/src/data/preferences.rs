//! Preference rows -> what the preference trainers consume (reward models now; DPO and Online
//! DPO read the same rows).
//!
//! Formats, as TRL takes them (`trl/data_utils.py`):
//! - standard: `prompt`, `chosen`, `rejected` strings; `chosen`/`rejected` are completions of
//!   the prompt, and the EOS token is appended to each when missing (`add_eos` of
//!   `RewardTrainer._prepare_dataset` / `DPOTrainer._prepare_dataset`);
//! - conversational: the same columns as lists of `{role, content}` messages, rendered with the
//!   model's chat template (`prompt` with the generation prompt, `prompt + chosen` without);
//! - implicit prompt: no `prompt` column (or one of the other kind than `chosen`), the prompt is
//!   the longest shared prefix of `chosen` and `rejected`, as TRL's `maybe_extract_prompt` /
//!   `extract_prompt` find it ([`maybe_extract_prompt`]);
//! - an optional `margin` column (a number per row): the reward model's margin term.
//!
//! Every problem names the row and the fix: a missing column, a value of the wrong type,
//! `chosen` identical to `rejected`.

use rlft_data::Dataset;
use rlft_text::{ChatTemplate, Message, TextBundle};
use serde_json::Value;

use crate::error::{Result, TrainerError};

/// One side of a preference row: plain text or a conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Turns {
    /// A string (standard format).
    Text(String),
    /// Chat messages (conversational format).
    Messages(Vec<Message>),
}

impl Turns {
    /// Whether this is a list of messages (TRL's `is_conversational`).
    pub fn is_conversational(&self) -> bool {
        matches!(self, Turns::Messages(_))
    }
}

/// A preference row with its prompt made explicit.
#[derive(Debug, Clone, PartialEq)]
pub struct Preference {
    /// Index of the row in its dataset.
    pub row_index: usize,
    /// The shared prompt (may be empty).
    pub prompt: Turns,
    /// The preferred completion.
    pub chosen: Turns,
    /// The other completion.
    pub rejected: Turns,
    /// The row's `margin` value, when the dataset has one.
    pub margin: Option<f64>,
}

fn bad(row: usize, msg: impl std::fmt::Display) -> TrainerError {
    TrainerError::Data(format!("preference row {row}: {msg}"))
}

fn turns(v: &Value, col: &str, row: usize) -> Result<Turns> {
    match v {
        Value::String(s) => Ok(Turns::Text(s.clone())),
        Value::Array(a) if a.first().is_some_and(|m| m.get("role").is_some()) => {
            serde_json::from_value(v.clone())
                .map(Turns::Messages)
                .map_err(|e| {
                    bad(
                        row,
                        format!("`{col}` is not a list of {{role, content}} messages ({e})"),
                    )
                })
        }
        other => Err(bad(
            row,
            format!(
                "`{col}` is {}; expected a string or a non-empty list of {{role, content}} \
                 messages",
                match other {
                    Value::Array(a) if a.is_empty() => "an empty list".to_string(),
                    Value::Null => "null".to_string(),
                    v => format!("`{v}`"),
                }
            ),
        )),
    }
}

/// TRL's `extract_prompt` (`trl/data_utils.py`, TRL 1.16, lines 623-633): the prompt is
/// `chosen[:idx]` where `idx` is the first position at which `chosen` and `rejected` differ
/// (characters of strings, messages of conversations), moved one back when the character
/// before it is a space; `chosen` and `rejected` keep what follows. Python's loop semantics
/// are kept: when one side is a prefix of the other, `idx` is the last index of the shorter one,
/// and a difference at index 0 of a string whose last character is a space gives `idx = -1`
/// (Python's `[:-1]` / `[-1:]`). Errors when either side is empty (TRL fails there too).
pub fn extract_prompt(chosen: &Turns, rejected: &Turns, row: usize) -> Result<Preference> {
    fn split<T: PartialEq + Clone>(
        c: &[T],
        r: &[T],
        is_space: impl Fn(&T) -> bool,
    ) -> Option<(Vec<T>, Vec<T>, Vec<T>)> {
        let n = c.len().min(r.len());
        if n == 0 {
            return None;
        }
        let mut idx = n as isize - 1;
        for i in 0..n {
            if c[i] != r[i] {
                idx = i as isize;
                // `chosen[idx - 1]`: index -1 is the last element in Python.
                let before = if i == 0 { &c[c.len() - 1] } else { &c[i - 1] };
                if is_space(before) {
                    idx -= 1;
                }
                break;
            }
        }
        let at = |len: usize| -> usize {
            if idx < 0 {
                len - 1
            } else {
                (idx as usize).min(len)
            }
        };
        Some((
            c[..at(c.len())].to_vec(),
            c[at(c.len())..].to_vec(),
            r[at(r.len())..].to_vec(),
        ))
    }
    let empty = || bad(row, "`chosen` or `rejected` is empty; both need content");
    let (prompt, chosen, rejected) = match (chosen, rejected) {
        (Turns::Text(c), Turns::Text(r)) => {
            let (c, r): (Vec<char>, Vec<char>) = (c.chars().collect(), r.chars().collect());
            let (p, c, r) = split(&c, &r, |ch| *ch == ' ').ok_or_else(empty)?;
            let s = |v: Vec<char>| Turns::Text(v.into_iter().collect());
            (s(p), s(c), s(r))
        }
        (Turns::Messages(c), Turns::Messages(r)) => {
            let (p, c, r) = split(c, r, |_| false).ok_or_else(empty)?;
            (Turns::Messages(p), Turns::Messages(c), Turns::Messages(r))
        }
        _ => {
            return Err(bad(
                row,
                "`chosen` and `rejected` must both be strings or both message lists",
            ))
        }
    };
    Ok(Preference {
        row_index: row,
        prompt,
        chosen,
        rejected,
        margin: None,
    })
}

/// TRL's `maybe_extract_prompt` (`trl/data_utils.py` lines 650-658): a row with a `prompt` of
/// the same kind as `chosen` (both strings or both message lists) keeps it; otherwise the
/// prompt is extracted from `chosen` and `rejected` ([`extract_prompt`]), and a `prompt` of the
/// other kind is ignored (datasets that repeat the prompt beside full conversations).
pub fn maybe_extract_prompt(
    prompt: Option<Turns>,
    chosen: Turns,
    rejected: Turns,
    row: usize,
) -> Result<Preference> {
    match prompt {
        Some(p) if p.is_conversational() == chosen.is_conversational() => {
            if chosen.is_conversational() != rejected.is_conversational() {
                return Err(bad(
                    row,
                    "`chosen` and `rejected` must both be strings or both message lists",
                ));
            }
            Ok(Preference {
                row_index: row,
                prompt: p,
                chosen,
                rejected,
                margin: None,
            })
        }
        _ => extract_prompt(&chosen, &rejected, row),
    }
}

/// Parses dataset row `row` (index `index`) into a [`Preference`]: `chosen` and `rejected`
/// required, `prompt` optional (extracted when absent), `margin` read when present.
pub fn parse_row(row: &Value, index: usize) -> Result<Preference> {
    let get = |col: &str| row.get(col).filter(|v| !v.is_null());
    let columns = || {
        row.as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>().join(", "))
            .unwrap_or_default()
    };
    let need = |col: &str| {
        get(col).ok_or_else(|| {
            bad(
                index,
                format!(
                    "missing `{col}` (columns: {}); a preference row needs `chosen` and \
                     `rejected`, and optionally `prompt` and `margin`",
                    columns()
                ),
            )
        })
    };
    let chosen = need("chosen")?;
    let rejected = need("rejected")?;
    if chosen == rejected {
        return Err(bad(
            index,
            "`chosen` is identical to `rejected`, so the pair teaches nothing; fix or drop the \
             row",
        ));
    }
    let prompt = get("prompt")
        .map(|p| turns(p, "prompt", index))
        .transpose()?;
    let (chosen, rejected) = (
        turns(chosen, "chosen", index)?,
        turns(rejected, "rejected", index)?,
    );
    let mut p = maybe_extract_prompt(prompt, chosen, rejected, index)?;
    p.margin = match row.get("margin") {
        None => None,
        Some(v) => Some(v.as_f64().ok_or_else(|| {
            bad(
                index,
                format!("`margin` is `{v}`; it must be a number (or leave the column out)"),
            )
        })?),
    };
    Ok(p)
}

/// A preference row rendered as text, as TRL's preference trainers tokenize it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedPreference {
    /// The prompt (conversations: with the generation prompt).
    pub prompt: String,
    /// Prompt followed by the chosen completion (standard: EOS appended when missing).
    pub prompt_chosen: String,
    /// Prompt followed by the rejected completion.
    pub prompt_rejected: String,
    /// Conversational rows: the template wrote the special tokens, so the text is tokenized
    /// without adding any (TRL's `apply_chat_template(tokenize=True)`); standard rows are
    /// tokenized with them (`tokenizer(text)`).
    pub conversational: bool,
}

/// Renders `p` with the model's tokenizer and template. `system_prompt`, when set, is put first
/// in conversations that have no system message. Standard rows get the EOS token appended to
/// each completion when missing (TRL's `add_eos`).
pub fn render(
    p: &Preference,
    text: &TextBundle,
    template: Option<&ChatTemplate>,
    system_prompt: Option<&str>,
) -> Result<RenderedPreference> {
    match (&p.prompt, &p.chosen, &p.rejected) {
        (Turns::Text(pr), Turns::Text(c), Turns::Text(r)) => {
            let eos = text.special.eos.as_deref().unwrap_or("");
            let with_eos = |s: &str| {
                if s.ends_with(eos) {
                    s.to_string()
                } else {
                    format!("{s}{eos}")
                }
            };
            Ok(RenderedPreference {
                prompt: pr.clone(),
                prompt_chosen: format!("{pr}{}", with_eos(c)),
                prompt_rejected: format!("{pr}{}", with_eos(r)),
                conversational: false,
            })
        }
        (Turns::Messages(pr), Turns::Messages(c), Turns::Messages(r)) => {
            let tpl = template.ok_or_else(|| {
                bad(
                    p.row_index,
                    "is conversational but the model has no chat template; use string \
                     prompt/chosen/rejected columns or a model with a chat template",
                )
            })?;
            let mut prompt = pr.clone();
            if let Some(s) = system_prompt {
                if prompt.first().is_none_or(|m| m.role != "system") {
                    prompt.insert(0, Message::system(s));
                }
            }
            let draw = |msgs: &[Message], gen: bool| -> Result<String> {
                Ok(tpl.render(msgs, &text.render_options(gen))?)
            };
            let join = |tail: &[Message]| [prompt.as_slice(), tail].concat();
            Ok(RenderedPreference {
                prompt: draw(&prompt, true)?,
                prompt_chosen: draw(&join(c), false)?,
                prompt_rejected: draw(&join(r), false)?,
                conversational: true,
            })
        }
        _ => Err(bad(
            p.row_index,
            "`prompt`, `chosen` and `rejected` must all be strings or all message lists",
        )),
    }
}

/// A tokenized preference pair for a reward model: the whole chosen and rejected sequences.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardPair {
    /// Index of the row in its dataset.
    pub row_index: usize,
    /// Token ids of prompt + chosen.
    pub chosen_ids: Vec<u32>,
    /// Token ids of prompt + rejected.
    pub rejected_ids: Vec<u32>,
    /// The row's margin (0 when the dataset has no `margin` column).
    pub margin: f64,
}

/// How the rows of a dataset fared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PairReport {
    /// Pairs kept.
    pub kept: usize,
    /// Pairs dropped because a side is longer than `max_length` (TRL filters them out).
    pub too_long: usize,
    /// Longest sequence seen, in tokens.
    pub longest: usize,
}

/// Tokenizes every row of `ds` into [`RewardPair`]s as TRL's `RewardTrainer._prepare_dataset`
/// does (prompt + completion, EOS for standard rows, the chat template for conversations), and
/// drops pairs with a side longer than `max_length` (`None`: no limit). Returns the pairs,
/// whether the dataset has a `margin` column, and the report.
pub fn reward_pairs(
    ds: &Dataset,
    text: &TextBundle,
    system_prompt: Option<&str>,
    max_length: Option<usize>,
) -> Result<(Vec<RewardPair>, bool, PairReport)> {
    let template = text.compile_chat_template().ok();
    let has_margin = ds.has_column("margin");
    let mut report = PairReport::default();
    let mut out = Vec::with_capacity(ds.len());
    for (i, row) in ds.iter().enumerate() {
        let p = parse_row(row, i)?;
        if has_margin && p.margin.is_none() {
            return Err(bad(
                i,
                "has no `margin` value but the dataset has a `margin` column; give every row \
                 a number",
            ));
        }
        let r = render(&p, text, template.as_ref(), system_prompt)?;
        let encode = |s: &str| text.encode(s, !r.conversational);
        let (chosen_ids, rejected_ids) = (encode(&r.prompt_chosen)?, encode(&r.prompt_rejected)?);
        if chosen_ids.is_empty() || rejected_ids.is_empty() {
            return Err(bad(i, "a side tokenizes to nothing; give it some text"));
        }
        let longest = chosen_ids.len().max(rejected_ids.len());
        report.longest = report.longest.max(longest);
        if max_length.is_some_and(|m| longest > m) {
            report.too_long += 1;
            continue;
        }
        report.kept += 1;
        out.push(RewardPair {
            row_index: i,
            chosen_ids,
            rejected_ids,
            margin: p.margin.unwrap_or(0.0),
        });
    }
    Ok((out, has_margin, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(s: &str) -> Turns {
        Turns::Text(s.into())
    }

    fn ex(c: &str, r: &str) -> (String, String, String) {
        let p = extract_prompt(&t(c), &t(r), 0).unwrap();
        let s = |x: Turns| match x {
            Turns::Text(s) => s,
            Turns::Messages(_) => unreachable!(),
        };
        (s(p.prompt), s(p.chosen), s(p.rejected))
    }

    #[test]
    fn extract_prompt_is_trls() {
        // Values computed with trl.data_utils.extract_prompt (TRL 1.16).
        let own = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(
            ex("The sky is blue.", "The sky is green."),
            own("The sky is", " blue.", " green.")
        );
        assert_eq!(ex("abc", "abcd"), own("ab", "c", "cd"));
        assert_eq!(ex("x y ", "z"), own("x y", " ", "z"));
        assert_eq!(
            ex("héllo wörld", "héllo world"),
            own("héllo w", "örld", "orld")
        );
        let u = |s: &str| Message::user(s);
        let a = |s: &str| Message::assistant(s);
        let p = extract_prompt(
            &Turns::Messages(vec![u("q"), a("yes")]),
            &Turns::Messages(vec![u("q"), a("no")]),
            0,
        )
        .unwrap();
        assert_eq!(p.prompt, Turns::Messages(vec![u("q")]));
        assert_eq!(p.chosen, Turns::Messages(vec![a("yes")]));
        assert!(extract_prompt(&t(""), &t("a"), 4)
            .unwrap_err()
            .to_string()
            .contains("row 4"));
    }

    #[test]
    fn explicit_prompt_of_the_same_kind_is_kept() {
        let p = parse_row(
            &json!({"prompt": "2+2=", "chosen": "4", "rejected": "5"}),
            0,
        )
        .unwrap();
        assert_eq!(p.prompt, t("2+2="));
        // A string prompt beside conversations is ignored: the prompt comes from the messages.
        let row = json!({"prompt": "q",
            "chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}]});
        let p = parse_row(&row, 0).unwrap();
        assert_eq!(p.prompt, Turns::Messages(vec![Message::user("q")]));
    }

    #[test]
    fn bad_rows_name_the_row_and_fix() {
        let e = parse_row(&json!({"prompt": "p", "rejected": "r"}), 7)
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 7") && e.contains("missing `chosen`"), "{e}");
        let e = parse_row(&json!({"prompt": "p", "chosen": "a", "rejected": "a"}), 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 3") && e.contains("identical"), "{e}");
        let e = parse_row(&json!({"chosen": "a", "rejected": "b", "margin": "big"}), 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`margin`"), "{e}");
        let e = parse_row(&json!({"chosen": 5, "rejected": "b", "prompt": "p"}), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`chosen`"), "{e}");
    }

    #[test]
    fn rendering_follows_trl() {
        let text = rlft_model::tiny::tiny_text_bundle().unwrap();
        let tpl = text.compile_chat_template().unwrap();
        let p = parse_row(
            &json!({"prompt": "2+2=", "chosen": "4", "rejected": "5"}),
            0,
        )
        .unwrap();
        let r = render(&p, &text, Some(&tpl), Some("ignored for strings")).unwrap();
        assert_eq!(r.prompt_chosen, "2+2=4<|im_end|>");
        assert!(!r.conversational);
        let row = json!({
            "prompt": [{"role": "user", "content": "2+2?"}],
            "chosen": [{"role": "assistant", "content": "4"}],
            "rejected": [{"role": "assistant", "content": "5"}]});
        let r = render(
            &parse_row(&row, 0).unwrap(),
            &text,
            Some(&tpl),
            Some("Be brief."),
        )
        .unwrap();
        assert_eq!(
            r.prompt_chosen,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
             <|im_start|>assistant\n4<|im_end|>\n"
        );
        assert!(r.prompt.ends_with("<|im_start|>assistant\n"));
        let ds = Dataset::from_rows(vec![row.clone(), row]).unwrap();
        let (pairs, margin, rep) = reward_pairs(&ds, &text, None, Some(1000)).unwrap();
        assert_eq!(
            (pairs.len(), margin, rep.kept, rep.too_long),
            (2, false, 2, 0)
        );
        let (pairs, _, rep) = reward_pairs(&ds, &text, None, Some(10)).unwrap();
        assert_eq!((pairs.len(), rep.too_long), (0, 2));
    }
}
