//! Format rewards: `strict_format` (a regex matching the whole completion), `regex_format` (a
//! regex found anywhere) and `incremental_format` (partial credit per tag, as the TRL GRPO
//! guide's `count_xml`).
//!
//! Regexes use Rust's `regex` syntax (no look-around or back-references) with `.` matching
//! newlines too (dot-all; write `(?-s)` to turn it off).

use regex::{Regex, RegexBuilder};

use crate::normalize::py_strip;
use crate::{Reward, RewardError, RewardOutput, Sample};

/// Compiles a user's pattern; `whole` anchors it to the whole text. Errors quote the regex
/// error, which points at the offending part of the pattern.
pub(crate) fn compile(reward: &str, pattern: &str, whole: bool) -> Result<Regex, RewardError> {
    let build = |p: &str| {
        RegexBuilder::new(p)
            .dot_matches_new_line(true)
            .size_limit(1 << 24)
            .build()
    };
    build(pattern).map_err(|e| {
        RewardError::config(
            reward,
            format!("`pattern` is not a valid regex (Rust `regex` syntax): {e}"),
        )
    })?;
    if whole {
        build(&format!(r"\A(?:{pattern})\z"))
            .map_err(|e| RewardError::config(reward, e.to_string()))
    } else {
        build(pattern).map_err(|e| RewardError::config(reward, e.to_string()))
    }
}

fn indicator(hit: bool) -> f64 {
    if hit {
        1.0
    } else {
        0.0
    }
}

/// `strict_format`: 1.0 if the regex matches the whole completion, else 0.0.
#[derive(Debug, Clone)]
pub struct StrictFormat {
    pub(crate) name: String,
    pub(crate) regex: Regex,
}

impl Reward for StrictFormat {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        Ok(RewardOutput::from_scores(
            batch
                .iter()
                .map(|s| indicator(self.regex.is_match(s.completion)))
                .collect(),
        ))
    }
}

/// `regex_format`: 1.0 if the regex matches anywhere in the completion, else 0.0.
#[derive(Debug, Clone)]
pub struct RegexFormat {
    pub(crate) name: String,
    pub(crate) regex: Regex,
}

impl Reward for RegexFormat {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        Ok(RewardOutput::from_scores(
            batch
                .iter()
                .map(|s| indicator(self.regex.is_match(s.completion)))
                .collect(),
        ))
    }
}

/// The `incremental_format` score of one text: `per_tag` for every tag that occurs exactly once
/// (non-overlapping occurrences, as Python's `str.count`), minus `trailing_penalty` per character
/// after the last tag of the list (when it occurs exactly once), whitespace around that text not
/// counted.
///
/// With the TRL guide's tags this is its `count_xml`, except that the guide charges the text after
/// `\n</answer>\n` and after `\n</answer>` separately and forgives exactly one newline.
pub fn incremental_format_score(
    text: &str,
    tags: &[String],
    per_tag: f64,
    trailing_penalty: f64,
) -> f64 {
    let mut score = 0.0;
    for tag in tags {
        if text.matches(tag.as_str()).count() == 1 {
            score += per_tag;
        }
    }
    if let Some(last) = tags.last() {
        let mut found = text.match_indices(last.as_str());
        if let (Some((at, _)), None) = (found.next(), found.next()) {
            let after = py_strip(&text[at + last.len()..]);
            score -= after.chars().count() as f64 * trailing_penalty;
        }
    }
    score
}

/// `incremental_format` (see [`incremental_format_score`]).
#[derive(Debug, Clone)]
pub struct IncrementalFormat {
    pub(crate) name: String,
    pub(crate) tags: Vec<String>,
    pub(crate) per_tag: f64,
    pub(crate) trailing_penalty: f64,
}

impl Reward for IncrementalFormat {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        Ok(RewardOutput::from_scores(
            batch
                .iter()
                .map(|s| {
                    incremental_format_score(
                        s.completion,
                        &self.tags,
                        self.per_tag,
                        self.trailing_penalty,
                    )
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUIDE: &str = r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$";

    fn score(r: &mut dyn Reward, texts: &[&str]) -> Vec<Option<f64>> {
        let row = serde_json::Value::Null;
        let batch: Vec<Sample> = texts
            .iter()
            .map(|t| Sample {
                prompt: "",
                completion: t,
                row: &row,
                completion_ids: &[],
                completion_tokens: 0,
                truncated: false,
                environment_reward: None,
            })
            .collect();
        r.score(&batch).unwrap().scores
    }

    #[test]
    fn strict_matches_whole_text_with_dot_all() {
        let mut r = StrictFormat {
            name: "s".into(),
            regex: compile("s", GUIDE, true).unwrap(),
        };
        let good = "<reasoning>\nline 1\nline 2\n</reasoning>\n<answer>\n26\n</answer>\n";
        let extra = "<reasoning>\nx\n</reasoning>\n<answer>\n26\n</answer>\nmore";
        let prefixed = "hi <reasoning>\nx\n</reasoning>\n<answer>\n26\n</answer>\n";
        assert_eq!(
            score(&mut r, &[good, extra, prefixed]),
            vec![Some(1.0), Some(0.0), Some(0.0)]
        );
        // An unanchored pattern must still match everything.
        let mut r = StrictFormat {
            name: "s".into(),
            regex: compile("s", "a|ab", true).unwrap(),
        };
        assert_eq!(score(&mut r, &["ab", "abc"]), vec![Some(1.0), Some(0.0)]);
    }

    #[test]
    fn regex_searches() {
        let mut r = RegexFormat {
            name: "r".into(),
            regex: compile("r", r"\\boxed\{[^{}]+\}", false).unwrap(),
        };
        assert_eq!(
            score(&mut r, &["so \\boxed{3}.", "\\boxed{}"]),
            vec![Some(1.0), Some(0.0)]
        );
    }

    #[test]
    fn bad_regex_says_why() {
        let err = compile("fmt", "(<answer>", true).unwrap_err().to_string();
        assert!(
            err.starts_with("reward `fmt`: `pattern` is not a valid regex"),
            "{err}"
        );
        assert!(err.contains("unclosed group"), "{err}");
        let err = compile("fmt", "(?=x)", false).unwrap_err().to_string();
        assert!(err.contains("look-around"), "{err}");
    }

    #[test]
    fn incremental() {
        let tags: Vec<String> = [
            "<reasoning>\n",
            "\n</reasoning>\n",
            "\n<answer>\n",
            "\n</answer>",
        ]
        .map(String::from)
        .to_vec();
        let full = "<reasoning>\nx\n</reasoning>\n<answer>\n26\n</answer>\n";
        assert_eq!(incremental_format_score(full, &tags, 0.125, 0.001), 0.5);
        let trailing = "<reasoning>\nx\n</reasoning>\n<answer>\n26\n</answer>\nabcde";
        assert!((incremental_format_score(trailing, &tags, 0.125, 0.001) - 0.495).abs() < 1e-12);
        let doubled = "<reasoning>\n<reasoning>\nx\n</reasoning>\n";
        assert_eq!(
            incremental_format_score(doubled, &tags, 0.125, 0.001),
            0.125
        );
        assert_eq!(incremental_format_score("", &tags, 0.125, 0.001), 0.0);
        // trailing characters are counted as characters, not bytes
        let tags = vec!["</a>".to_string()];
        assert!((incremental_format_score("</a>ééé", &tags, 1.0, 0.1) - 0.7).abs() < 1e-12);
    }
}
