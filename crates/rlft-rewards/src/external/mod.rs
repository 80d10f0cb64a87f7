//! External rewards: a long-running process speaking JSON lines ([`command`]), a Python
//! function with TRL's signature run by such a process ([`python`]) and an HTTP endpoint
//! ([`http`]), with the wire format they share.
//!
//! A sample travels as
//! `{"prompt": "...", "completion": "...", "row": {...}, "completion_tokens": 7, "truncated": false}`
//! and is answered by a JSON number, `null` (not applicable), or an object
//! `{"score": x}` / `{"score": x, "parts": {"format": 1.0}}`.

pub mod command;
pub mod http;
pub mod python;

use serde::Serialize;
use serde_json::Value;

use crate::error::excerpt;
use crate::{RewardOutput, Sample};

/// What one answer may look like, for error messages.
pub(crate) const EXPECTED_ANSWER: &str = r#"a JSON number, null, or an object {"score": <number or null>, "parts": {"<name>": <number>}}"#;

/// A sample as external rewards receive it.
#[derive(Serialize)]
struct WireSample<'a> {
    prompt: &'a str,
    completion: &'a str,
    row: &'a Value,
    completion_tokens: usize,
    truncated: bool,
}

impl<'a> From<&Sample<'a>> for WireSample<'a> {
    fn from(s: &Sample<'a>) -> Self {
        WireSample {
            prompt: s.prompt,
            completion: s.completion,
            row: s.row,
            completion_tokens: s.completion_tokens,
            truncated: s.truncated,
        }
    }
}

/// One JSON line (with its newline) per sample.
pub(crate) fn sample_lines(batch: &[Sample<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in batch {
        serde_json::to_writer(&mut out, &WireSample::from(s)).expect("JSON values serialise");
        out.push(b'\n');
    }
    out
}

/// `{"samples": [...]}` without a trailing newline.
pub(crate) fn samples_body(batch: &[Sample<'_>]) -> Vec<u8> {
    #[derive(Serialize)]
    struct Body<'a> {
        samples: Vec<WireSample<'a>>,
    }
    let body = Body {
        samples: batch.iter().map(WireSample::from).collect(),
    };
    serde_json::to_vec(&body).expect("JSON values serialise")
}

/// Collects answers, one per sample, into a [`RewardOutput`].
pub(crate) struct Collector {
    n: usize,
    out: RewardOutput,
}

impl Collector {
    pub(crate) fn new(n: usize) -> Self {
        Collector {
            n,
            out: RewardOutput {
                scores: Vec::with_capacity(n),
                parts: Vec::new(),
            },
        }
    }

    /// How many answers are still missing.
    pub(crate) fn missing(&self) -> usize {
        self.n - self.out.scores.len()
    }

    /// Adds the answer of the next sample; the error says what was wrong.
    pub(crate) fn push(&mut self, answer: &Value) -> Result<(), String> {
        let i = self.out.scores.len();
        let (score, parts) = match answer {
            Value::Null => (None, None),
            Value::Number(n) => (n.as_f64(), None),
            Value::Object(map) => {
                let score = match map.get("score") {
                    Some(Value::Null) => None,
                    Some(Value::Number(n)) => n.as_f64(),
                    Some(other) => {
                        return Err(format!("`score` must be a number or null, got {other}"))
                    }
                    None => return Err("the object has no `score` key".to_string()),
                };
                let parts = match map.get("parts") {
                    None | Some(Value::Null) => None,
                    Some(Value::Object(parts)) => Some(parts),
                    Some(other) => {
                        return Err(format!("`parts` must be an object of numbers, got {other}"))
                    }
                };
                (score, parts)
            }
            other => return Err(format!("got {}", excerpt(&other.to_string(), 200))),
        };
        for (name, value) in parts.into_iter().flatten() {
            let value = match value {
                Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                Value::Null => f64::NAN,
                other => return Err(format!("part `{name}` must be a number, got {other}")),
            };
            let column = match self.out.parts.iter().position(|(n, _)| n == name) {
                Some(c) => c,
                None => {
                    self.out.parts.push((name.clone(), vec![f64::NAN; i]));
                    self.out.parts.len() - 1
                }
            };
            self.out.parts[column].1.push(value);
        }
        self.out.scores.push(score);
        for (_, values) in &mut self.out.parts {
            values.resize(i + 1, f64::NAN);
        }
        Ok(())
    }

    pub(crate) fn finish(self) -> RewardOutput {
        self.out
    }
}

/// Parses `{"scores": [...]}` holding exactly `n` answers.
pub(crate) fn parse_scores_body(text: &str, n: usize) -> Result<RewardOutput, String> {
    let expected =
        format!(r#"expected {{"scores": [...]}} with {n} entries, each {EXPECTED_ANSWER}"#);
    let value: Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "{expected}; got invalid JSON ({e}): `{}`",
            excerpt(text, 200)
        )
    })?;
    let Some(scores) = value.get("scores") else {
        let error = value
            .get("error")
            .map(|e| format!(" (it says: {e})"))
            .unwrap_or_default();
        return Err(format!("{expected}; got `{}`{error}", excerpt(text, 200)));
    };
    let Value::Array(scores) = scores else {
        return Err(format!(
            "{expected}; `scores` is not an array: `{}`",
            excerpt(text, 200)
        ));
    };
    if scores.len() != n {
        return Err(format!("{expected}; got {} entries", scores.len()));
    }
    let mut collector = Collector::new(n);
    for (i, answer) in scores.iter().enumerate() {
        collector
            .push(answer)
            .map_err(|e| format!("entry {i} of `scores`: {e}; expected {EXPECTED_ANSWER}"))?;
    }
    Ok(collector.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_and_parts() {
        let mut c = Collector::new(4);
        c.push(&json!(0.5)).unwrap();
        c.push(&json!(null)).unwrap();
        c.push(&json!({"score": 1, "parts": {"format": 1.0}}))
            .unwrap();
        c.push(&json!({"score": null, "parts": {"accuracy": 0.0}}))
            .unwrap();
        assert_eq!(c.missing(), 0);
        let out = c.finish();
        assert_eq!(out.scores, vec![Some(0.5), None, Some(1.0), None]);
        let format = out.part("format").unwrap();
        assert!(format[0].is_nan() && format[1].is_nan() && format[2] == 1.0 && format[3].is_nan());
        let accuracy = out.part("accuracy").unwrap();
        assert_eq!(accuracy.len(), 4);
        assert_eq!(accuracy[3], 0.0);

        let mut c = Collector::new(1);
        assert!(c.push(&json!("0.5")).unwrap_err().contains("got \"0.5\""));
        assert!(c
            .push(&json!({"scor": 1}))
            .unwrap_err()
            .contains("no `score`"));
        assert!(c
            .push(&json!({"score": true}))
            .unwrap_err()
            .contains("must be a number"));
    }

    #[test]
    fn bodies() {
        let row = json!({"answer": "1"});
        let batch = [Sample {
            prompt: "p",
            completion: "c",
            row: &row,
            completion_ids: &[],
            completion_tokens: 2,
            truncated: true,
            environment_reward: None,
        }];
        let line = String::from_utf8(sample_lines(&batch)).unwrap();
        assert_eq!(
            line,
            "{\"prompt\":\"p\",\"completion\":\"c\",\"row\":{\"answer\":\"1\"},\"completion_tokens\":2,\"truncated\":true}\n"
        );
        let body: Value = serde_json::from_slice(&samples_body(&batch)).unwrap();
        assert_eq!(body["samples"][0]["completion"], "c");
        assert_eq!(
            parse_scores_body(r#"{"scores": [1]}"#, 1).unwrap().scores,
            vec![Some(1.0)]
        );
        let e = parse_scores_body(r#"{"scores": [1, 2]}"#, 1).unwrap_err();
        assert!(
            e.contains("with 1 entries") && e.contains("got 2 entries"),
            "{e}"
        );
        let e = parse_scores_body(r#"{"error": "model not loaded"}"#, 1).unwrap_err();
        assert!(e.contains("model not loaded"), "{e}");
        let e = parse_scores_body("<html>", 1).unwrap_err();
        assert!(e.contains("invalid JSON") && e.contains("<html>"), "{e}");
    }
}
