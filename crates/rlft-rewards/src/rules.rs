//! Rule rewards: the seed example's `python_expr_rule`, `boxed_accuracy`, and the length-based
//! `length`, `overlong` and `repetition`. The text functions are public so that an evaluation
//! loop can reuse them without building a reward.

use std::collections::HashSet;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use crate::normalize::{digit_class, is_py_space, normalize_answer, py_strip};
use crate::{Reward, RewardError, RewardOutput, Sample};

const ASSISTANT: &str = "<|im_start|>assistant";
const END: &str = "<|im_end|>";

static BOXED: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\\boxed\{([^{}]*)\}").expect("valid regex"));
static NUMBER: LazyLock<Regex> = LazyLock::new(|| {
    let d = digit_class();
    Regex::new(&format!(r"-?{d}+(?:\.{d}+)?")).expect("valid regex")
});

/// The last assistant turn of a chat transcript: the stripped text after the last
/// `<|im_start|>assistant`, up to the first `<|im_end|>` after it. Text without the marker is
/// returned stripped. (The seed scores only this, so the `\boxed{answer}` of the prompt cannot
/// inflate the format score when a transcript is passed in.)
pub fn last_assistant_turn(text: &str) -> &str {
    let text = py_strip(text);
    let Some(at) = text.rfind(ASSISTANT) else {
        return text;
    };
    let turn = &text[at + ASSISTANT.len()..];
    let turn = turn.find(END).map_or(turn, |end| &turn[..end]);
    py_strip(turn)
}

/// The content of the first `\boxed{...}` without nested braces, stripped; `""` when there is none.
pub fn first_boxed(text: &str) -> &str {
    BOXED
        .captures(text)
        .and_then(|c| c.get(1))
        .map_or("", |m| py_strip(m.as_str()))
}

/// The seed's candidate answer: the first boxed content if non-empty, else the last number
/// (`-?\d+(?:\.\d+)?`) of the text with commas removed, else `""`.
pub fn candidate_answer(text: &str) -> String {
    let boxed = first_boxed(text);
    if !boxed.is_empty() {
        return boxed.to_string();
    }
    let compact = text.replace(',', "");
    NUMBER
        .find_iter(&compact)
        .last()
        .map_or_else(String::new, |m| m.as_str().to_string())
}

/// Scores of the seed's rule for one completion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PythonExprScore {
    /// 1.0 when the (last assistant turn of the) text has a non-empty `\boxed{...}`.
    pub format: f64,
    /// 1.0 when the normalised candidate answer is non-empty and equals the normalised truth.
    pub accuracy: f64,
    /// `0.1 * format + 0.9 * accuracy`.
    pub total: f64,
}

/// The seed example's reward (LightRFT `tiny_python_expr`, label `python_expr_rule`).
pub fn python_expr_rule(completion: &str, ground_truth: &str) -> PythonExprScore {
    let response = last_assistant_turn(completion);
    let format = if first_boxed(response).is_empty() {
        0.0
    } else {
        1.0
    };
    let prediction = normalize_answer(&candidate_answer(response));
    let accuracy = if !prediction.is_empty() && prediction == normalize_answer(ground_truth) {
        1.0
    } else {
        0.0
    };
    PythonExprScore {
        format,
        accuracy,
        total: 0.1 * format + 0.9 * accuracy,
    }
}

/// 1.0 when the first `\boxed{...}` of `completion` is non-empty and equals the ground truth,
/// both normalised with [`normalize_answer`]; else 0.0.
pub fn boxed_accuracy(completion: &str, ground_truth: &str) -> f64 {
    let boxed = first_boxed(completion);
    let hit = !boxed.is_empty() && normalize_answer(boxed) == normalize_answer(ground_truth);
    if hit {
        1.0
    } else {
        0.0
    }
}

/// DAPO's soft overlong punishment for a completion of `len` tokens: 0 up to
/// `max_len - buffer`, then falling linearly to -1 at `max_len`, and -1 beyond.
pub fn overlong_penalty(len: usize, max_len: usize, buffer: usize) -> f64 {
    let soft = max_len.saturating_sub(buffer);
    if len <= soft {
        0.0
    } else if len <= max_len {
        (soft as f64 - len as f64) / buffer.max(1) as f64
    } else {
        -1.0
    }
}

/// The `length` reward: 0 when `len` is within `tolerance` of `target`, else `max_penalty` times
/// the excess distance over `target`, capped at 1.
pub fn length_penalty(len: usize, target: usize, tolerance: usize, max_penalty: f64) -> f64 {
    let excess = len.abs_diff(target).saturating_sub(tolerance);
    max_penalty * (excess as f64 / target.max(1) as f64).min(1.0) + 0.0
}

/// open-r1's repetition penalty: `max_penalty` times the fraction of repeated word n-grams (words
/// split on whitespace after lowercasing); 0 for texts of fewer than `ngram` words.
pub fn repetition_penalty(text: &str, ngram: usize, max_penalty: f64) -> f64 {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower.split(is_py_space).filter(|w| !w.is_empty()).collect();
    if ngram == 0 || words.len() < ngram {
        return 0.0;
    }
    let windows = words.windows(ngram);
    let total = windows.len();
    let unique = windows.collect::<HashSet<_>>().len();
    (1.0 - unique as f64 / total as f64) * max_penalty + 0.0
}

/// Looks up a dotted path in a row: `reward_model.ground_truth`; numeric segments index arrays
/// (`answers.0`). A key that itself contains dots is found too.
pub fn lookup_path<'v>(row: &'v Value, path: &str) -> Option<&'v Value> {
    if let Some(v) = row.as_object().and_then(|m| m.get(path)) {
        return Some(v);
    }
    path.split('.').try_fold(row, |cur, segment| match cur {
        Value::Object(map) => map.get(segment),
        Value::Array(items) => items.get(segment.parse::<usize>().ok()?),
        _ => None,
    })
}

/// The ground truth at `path` as text (strings as they are, numbers as JSON prints them), or a
/// message naming the field, what the row has instead, and the fix.
pub(crate) fn ground_truth(row: &Value, path: &str) -> Result<String, String> {
    match lookup_path(row, path) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(other) => Err(format!(
            "field `{path}` holds {}, not a string or number; point `answer_field` at the ground truth",
            json_kind(other)
        )),
        None => Err(missing_field(row, path)),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn missing_field(row: &Value, path: &str) -> String {
    // Walk as far as the path exists, then say what is there.
    let mut cur = row;
    let mut walked = Vec::new();
    for segment in path.split('.') {
        let next = match cur {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        match next {
            Some(v) => {
                walked.push(segment);
                cur = v;
            }
            None => break,
        }
    }
    let at = if walked.is_empty() {
        "the row".to_string()
    } else {
        format!("`{}`", walked.join("."))
    };
    let has = match cur {
        Value::Object(map) if map.is_empty() => format!("{at} is an empty object"),
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().map(|k| format!("`{k}`")).collect();
            format!("{at} has keys {}", keys.join(", "))
        }
        Value::Array(items) => format!("{at} is an array of {} items", items.len()),
        other => format!("{at} is {}", json_kind(other)),
    };
    format!(
        "the row has no field `{path}` ({has}); set `answer_field` to the dotted path of the \
         ground truth, e.g. `answer_field = \"reward_model.ground_truth\"`"
    )
}

fn truths(name: &str, field: &str, batch: &[Sample<'_>]) -> Result<Vec<String>, RewardError> {
    batch
        .iter()
        .enumerate()
        .map(|(i, s)| {
            ground_truth(s.row, field).map_err(|message| RewardError::Row {
                reward: name.to_string(),
                sample: i,
                message,
            })
        })
        .collect()
}

/// The `python_expr_rule` reward: score = total, parts `format` and `accuracy`.
#[derive(Debug, Clone)]
pub struct PythonExprRule {
    pub(crate) name: String,
    pub(crate) answer_field: String,
}

impl Reward for PythonExprRule {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        let truths = truths(&self.name, &self.answer_field, batch)?;
        let scores: Vec<PythonExprScore> = batch
            .iter()
            .zip(&truths)
            .map(|(s, t)| python_expr_rule(s.completion, t))
            .collect();
        Ok(RewardOutput {
            scores: scores.iter().map(|s| Some(s.total)).collect(),
            parts: vec![
                (
                    "format".to_string(),
                    scores.iter().map(|s| s.format).collect(),
                ),
                (
                    "accuracy".to_string(),
                    scores.iter().map(|s| s.accuracy).collect(),
                ),
            ],
        })
    }
}

/// The `boxed_accuracy` reward.
#[derive(Debug, Clone)]
pub struct BoxedAccuracy {
    pub(crate) name: String,
    pub(crate) answer_field: String,
}

impl Reward for BoxedAccuracy {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        let truths = truths(&self.name, &self.answer_field, batch)?;
        Ok(RewardOutput::from_scores(
            batch
                .iter()
                .zip(&truths)
                .map(|(s, t)| boxed_accuracy(s.completion, t))
                .collect(),
        ))
    }
}

/// The `length` reward (see [`length_penalty`]).
#[derive(Debug, Clone)]
pub struct Length {
    pub(crate) name: String,
    pub(crate) target: usize,
    pub(crate) tolerance: usize,
    pub(crate) max_penalty: f64,
}

impl Reward for Length {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        Ok(RewardOutput::from_scores(
            batch
                .iter()
                .map(|s| {
                    length_penalty(
                        s.completion_tokens,
                        self.target,
                        self.tolerance,
                        self.max_penalty,
                    )
                })
                .collect(),
        ))
    }
}

/// The `environment` reward: each sample's [`Sample::environment_reward`] (`None` where the
/// environment gave none).
#[derive(Debug, Clone)]
pub struct EnvironmentReward {
    pub(crate) name: String,
}

impl Reward for EnvironmentReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        Ok(RewardOutput {
            scores: batch.iter().map(|s| s.environment_reward).collect(),
            parts: Vec::new(),
        })
    }
}

/// The `overlong` reward (see [`overlong_penalty`]).
#[derive(Debug, Clone)]
pub struct Overlong {
    pub(crate) name: String,
    pub(crate) max_completion_length: usize,
    pub(crate) buffer: usize,
}

impl Reward for Overlong {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        Ok(RewardOutput::from_scores(
            batch
                .iter()
                .map(|s| {
                    overlong_penalty(s.completion_tokens, self.max_completion_length, self.buffer)
                })
                .collect(),
        ))
    }
}

/// The `repetition` reward (see [`repetition_penalty`]).
#[derive(Debug, Clone)]
pub struct Repetition {
    pub(crate) name: String,
    pub(crate) ngram: usize,
    pub(crate) max_penalty: f64,
}

impl Reward for Repetition {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        Ok(RewardOutput::from_scores(
            batch
                .iter()
                .map(|s| repetition_penalty(s.completion, self.ngram, self.max_penalty))
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample<'a>(completion: &'a str, row: &'a Value, tokens: usize) -> Sample<'a> {
        Sample {
            prompt: "",
            completion,
            row,
            completion_ids: &[],
            completion_tokens: tokens,
            truncated: false,
            environment_reward: None,
        }
    }

    #[test]
    fn seed_rule() {
        let s = python_expr_rule("The answer is \\boxed{26}.", "26");
        assert_eq!((s.format, s.accuracy, s.total), (1.0, 1.0, 1.0));
        let s = python_expr_rule("It is 25, no wait, 26", "26");
        assert_eq!((s.format, s.accuracy, s.total), (0.0, 1.0, 0.9));
        let s = python_expr_rule("\\boxed{\\text{26}}", "26");
        assert_eq!((s.format, s.accuracy), (0.0, 1.0));
        let s = python_expr_rule(
            "<|im_start|>user\n\\boxed{answer}<|im_end|>\n<|im_start|>assistant\n26<|im_end|>",
            "26",
        );
        assert_eq!((s.format, s.accuracy), (0.0, 1.0));
        assert_eq!(python_expr_rule("", "0").total, 0.0);
        assert_eq!(candidate_answer("1,234.50 and -7"), "-7");
        assert_eq!(
            last_assistant_turn("a<|im_start|>assistant x <|im_end|> y"),
            "x"
        );
    }

    #[test]
    fn boxed_accuracy_normalises_both_sides() {
        assert_eq!(boxed_accuracy("\\boxed{26.0}", "26"), 1.0);
        assert_eq!(boxed_accuracy("\\boxed{$1,000$}", "1000.00"), 1.0);
        assert_eq!(boxed_accuracy("26", "26"), 0.0);
        assert_eq!(boxed_accuracy("\\boxed{}", ""), 0.0);
    }

    #[test]
    fn reward_objects_read_the_row() {
        let row = json!({"reward_model": {"ground_truth": "26"}, "answer": 26});
        let batch = [sample("\\boxed{26}", &row, 3), sample("27", &row, 3)];
        let mut rule = PythonExprRule {
            name: "r".into(),
            answer_field: "reward_model.ground_truth".into(),
        };
        let out = rule.score(&batch).unwrap();
        assert_eq!(out.scores, vec![Some(1.0), Some(0.0)]);
        assert_eq!(out.part("format"), Some(&[1.0, 0.0][..]));
        let mut acc = BoxedAccuracy {
            name: "a".into(),
            answer_field: "answer".into(),
        };
        assert_eq!(
            acc.score(&batch).unwrap().scores,
            vec![Some(1.0), Some(0.0)]
        );

        let mut bad = BoxedAccuracy {
            name: "acc".into(),
            answer_field: "reward_model.truth".into(),
        };
        let err = bad.score(&batch).unwrap_err().to_string();
        assert!(
            err.contains("`reward_model.truth`") && err.contains("`ground_truth`"),
            "{err}"
        );
        assert!(err.starts_with("reward `acc`: sample 0"), "{err}");
        let row = json!({"answer": [1]});
        let err = acc.score(&[sample("x", &row, 1)]).unwrap_err().to_string();
        assert!(err.contains("an array"), "{err}");
    }

    #[test]
    fn lookup() {
        let row = json!({"a": {"b": [10, {"c": "x"}]}, "d.e": 1});
        assert_eq!(lookup_path(&row, "a.b.1.c"), Some(&json!("x")));
        assert_eq!(lookup_path(&row, "d.e"), Some(&json!(1)));
        assert_eq!(lookup_path(&row, "a.b.7"), None);
        assert_eq!(ground_truth(&row, "a.b.0").unwrap(), "10");
        let msg = ground_truth(&row, "a.z").unwrap_err();
        assert!(msg.contains("`a` has keys `b`"), "{msg}");
        let msg = ground_truth(&json!({}), "answer").unwrap_err();
        assert!(msg.contains("the row is an empty object"), "{msg}");
    }

    #[test]
    fn lengths() {
        assert_eq!(overlong_penalty(96, 128, 32), 0.0);
        assert_eq!(overlong_penalty(112, 128, 32), -0.5);
        assert_eq!(overlong_penalty(128, 128, 32), -1.0);
        assert_eq!(overlong_penalty(500, 128, 32), -1.0);
        assert_eq!(length_penalty(64, 64, 0, -1.0), 0.0);
        assert_eq!(length_penalty(80, 64, 16, -1.0), 0.0);
        assert_eq!(length_penalty(96, 64, 16, -1.0), -0.25);
        assert_eq!(length_penalty(1000, 64, 16, -1.0), -1.0);
        assert_eq!(length_penalty(0, 64, 0, -2.0), -2.0);
    }

    #[test]
    fn repetition() {
        assert_eq!(repetition_penalty("", 3, -1.0), 0.0);
        assert_eq!(repetition_penalty("a b", 3, -1.0), 0.0);
        assert_eq!(repetition_penalty("a b c d", 3, -1.0), 0.0);
        assert!(repetition_penalty("a b c d", 3, -1.0).is_sign_positive());
        // 6 trigrams, 3 unique -> half repeated
        assert_eq!(repetition_penalty("a b c a b c a b", 3, -1.0), -0.5);
        assert_eq!(repetition_penalty("A b C a B c a b", 3, -1.0), -0.5);
        assert_eq!(repetition_penalty("x x x x x", 1, -2.0), -1.6);
    }
}
