//! Preference pairs for the `tiny_python_expr` prompts (what `rlft data tiny-python-expr
//! --preferences` writes): a reward model or DPO learns from them what the seed example's rule
//! reward scores, with no download and no model.
//!
//! Each expression row becomes one conversational preference row:
//!
//! - `prompt`: the row's user prompt (`[{"role": "user", "content": ...}]`; the example's
//!   system prompt is added by the trainer's `system_prompt`, as in GRPO);
//! - `chosen`: the right answer in the style the example's completions take,
//!   `"{expression} equals {answer}. So the answer is \boxed{answer}."` (for `no_answer`
//!   rows the same sentence without the box, see below);
//! - `rejected`, its kind drawn per row, uniformly among the kinds asked for
//!   ([`RejectedKind::DEFAULT`]: the first two): a wrong number in the same sentence and box
//!   (`wrong_number`: the answer plus an offset in `±1..=±10`, kept non-negative), the right
//!   number without the box (`missing_box`), or a reply with no number at all (`no_answer`:
//!   a start without a result, an empty box, an empty code block or a refusal; its `chosen`
//!   is the right number *without* the box). The kinds then chain into the seed rule's order
//!   (boxed right 1.0 > unboxed right 0.9 > no number 0): Bradley-Terry only orders each
//!   rejected reply below its own chosen one, so with a boxed chosen a reward model may score
//!   a reply without a number above an unboxed right one, and a policy trained against it
//!   finds that reply (measured: examples/preference/README.md);
//! - `reward_model.ground_truth` and `extra_info` (`expression`, `split`, `index`,
//!   `rejected_kind`, `wrong_answer`) so rewards and reports can read them.
//!
//! The draws come from one [`PyRandom`] stream seeded from the dataset's seed (train rows then
//! test rows), so the same options give the same file.

use serde_json::{json, Value};

use crate::dataset::Dataset;
use crate::pyrandom::PyRandom;
use crate::synth::tiny_python_expr::{ExprRecord, Split, TinyPythonExprDataset, DATA_SOURCE};

/// Added to the dataset's seed for the preference draws (a stream apart from the expressions').
pub const PREFERENCE_SEED_OFFSET: u64 = 0x5052_4546; // "PREF"

/// Largest offset of a wrong answer.
pub const MAX_WRONG_OFFSET: i64 = 10;

/// How a rejected completion is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectedKind {
    /// A wrong number, boxed.
    WrongNumber,
    /// The right number, not boxed.
    MissingBox,
    /// No number at all (against the right number, not boxed).
    NoAnswer,
}

/// The replies of a `no_answer` rejection, one drawn per row. None holds a digit: restating
/// the expression could (a bare number is its own value).
const NO_ANSWER_REPLIES: [&str; 4] = [
    "Let me compute this expression.",
    "So the answer is \\boxed{}.",
    "```\n```",
    "I cannot compute this expression.",
];

impl RejectedKind {
    /// The `extra_info.rejected_kind` value.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectedKind::WrongNumber => "wrong_number",
            RejectedKind::MissingBox => "missing_box",
            RejectedKind::NoAnswer => "no_answer",
        }
    }

    /// The kinds `rlft data tiny-python-expr --preferences` draws when none are named.
    pub const DEFAULT: [RejectedKind; 2] = [RejectedKind::WrongNumber, RejectedKind::MissingBox];

    /// Every kind, in `--rejected` order.
    pub const ALL: [RejectedKind; 3] = [
        RejectedKind::WrongNumber,
        RejectedKind::MissingBox,
        RejectedKind::NoAnswer,
    ];

    /// Parses a comma-separated list of kinds (`wrong_number,missing_box,no_answer`).
    pub fn parse_list(s: &str) -> Result<Vec<RejectedKind>, String> {
        let mut kinds = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let kind = Self::ALL
                .into_iter()
                .find(|k| k.as_str() == name)
                .ok_or_else(|| {
                    format!(
                        "unknown rejected kind {name:?}: use a comma-separated list of \
                         wrong_number, missing_box, no_answer"
                    )
                })?;
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        if kinds.is_empty() {
            return Err(
                "no rejected kind given: name at least one of wrong_number, \
                        missing_box, no_answer"
                    .into(),
            );
        }
        Ok(kinds)
    }
}

/// The completion in the example's style, boxed or not.
pub fn completion(expression: &str, value: i64, boxed: bool) -> String {
    if boxed {
        format!("{expression} equals {value}. So the answer is \\boxed{{{value}}}.")
    } else {
        format!("{expression} equals {value}. So the answer is {value}.")
    }
}

/// The preference row of `record`, drawing the rejected kind among `kinds` (and the wrong
/// number or the reply) from `rng`. `kinds` must not be empty.
pub fn preference_row(record: &ExprRecord, kinds: &[RejectedKind], rng: &mut PyRandom) -> Value {
    // floor(random() * n): for the two default kinds the same draws as `random() < 0.5`.
    let pick = ((rng.random() * kinds.len() as f64) as usize).min(kinds.len() - 1);
    let kind = kinds[pick];
    let (rejected, wrong) = match kind {
        RejectedKind::WrongNumber => {
            let mut off = rng.randint(1, MAX_WRONG_OFFSET);
            if rng.random() < 0.5 && record.answer - off >= 0 {
                off = -off;
            }
            let wrong = record.answer + off;
            (completion(&record.expression, wrong, true), Some(wrong))
        }
        RejectedKind::MissingBox => (completion(&record.expression, record.answer, false), None),
        RejectedKind::NoAnswer => {
            let reply = NO_ANSWER_REPLIES[rng.choice(NO_ANSWER_REPLIES.len())];
            (reply.to_string(), None)
        }
    };
    let boxed_chosen = kind != RejectedKind::NoAnswer;
    let msg = |role: &str, content: String| json!([{"role": role, "content": content}]);
    json!({
        "data_source": DATA_SOURCE,
        "prompt": msg("user", record.prompt()),
        "chosen": msg("assistant", completion(&record.expression, record.answer, boxed_chosen)),
        "rejected": msg("assistant", rejected),
        "reward_model": {"ground_truth": record.answer.to_string()},
        "extra_info": {
            "expression": record.expression,
            "split": record.split.as_str(),
            "index": record.index,
            "rejected_kind": kind.as_str(),
            "wrong_answer": wrong,
        },
    })
}

/// The preference rows of both splits of `ds` (train then test from one stream seeded with
/// `seed + PREFERENCE_SEED_OFFSET`), rejected replies of the given `kinds` (not empty).
pub fn preferences(
    ds: &TinyPythonExprDataset,
    seed: u64,
    kinds: &[RejectedKind],
) -> (Dataset, Dataset) {
    let mut rng = PyRandom::new(seed.wrapping_add(PREFERENCE_SEED_OFFSET));
    let columns: Vec<String> = [
        "data_source",
        "prompt",
        "chosen",
        "rejected",
        "reward_model",
        "extra_info",
    ]
    .iter()
    .map(|c| c.to_string())
    .collect();
    let mut split = |s: Split| {
        let rows = ds
            .records(s)
            .iter()
            .map(|r| preference_row(r, kinds, &mut rng))
            .collect();
        Dataset::new(columns.clone(), rows)
    };
    let train = split(Split::Train);
    let test = split(Split::Test);
    (train, test)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::tiny_python_expr::{generate, TinyPythonExprOptions};

    #[test]
    fn rows_are_seeded_and_well_formed() {
        let ds = generate(&TinyPythonExprOptions {
            train_size: 40,
            test_size: 10,
            ..Default::default()
        })
        .unwrap();
        let kinds = RejectedKind::DEFAULT;
        let (train, test) = preferences(&ds, 42, &kinds);
        let (again, _) = preferences(&ds, 42, &kinds);
        let (other, _) = preferences(&ds, 43, &kinds);
        assert_eq!(train.rows, again.rows);
        assert_ne!(train.rows, other.rows);
        assert_eq!((train.len(), test.len()), (40, 10));
        let mut kinds = [0, 0];
        for (row, rec) in train.rows.iter().zip(&ds.train) {
            let chosen = row["chosen"][0]["content"].as_str().unwrap();
            let rejected = row["rejected"][0]["content"].as_str().unwrap();
            assert!(
                chosen.ends_with(&format!("\\boxed{{{}}}.", rec.answer)),
                "{chosen}"
            );
            assert_ne!(chosen, rejected);
            match row["extra_info"]["rejected_kind"].as_str().unwrap() {
                "wrong_number" => {
                    kinds[0] += 1;
                    let w = row["extra_info"]["wrong_answer"].as_i64().unwrap();
                    assert!(w >= 0 && w != rec.answer && (w - rec.answer).abs() <= 10);
                    assert!(rejected.contains(&format!("\\boxed{{{w}}}")));
                }
                "missing_box" => {
                    kinds[1] += 1;
                    assert!(!rejected.contains("\\boxed"));
                }
                k => panic!("{k}"),
            }
            assert_eq!(row["prompt"][0]["content"], rec.prompt());
        }
        assert!(kinds[0] > 5 && kinds[1] > 5, "{kinds:?}");
    }

    #[test]
    fn no_answer_replies_have_no_number_and_the_kinds_parse() {
        let ds = generate(&TinyPythonExprOptions {
            train_size: 60,
            test_size: 0,
            ..Default::default()
        })
        .unwrap();
        let (train, _) = preferences(&ds, 7, &RejectedKind::ALL);
        let mut seen = std::collections::BTreeSet::new();
        for (row, rec) in train.rows.iter().zip(&ds.train) {
            let kind = row["extra_info"]["rejected_kind"].as_str().unwrap();
            seen.insert(kind.to_string());
            let chosen = row["chosen"][0]["content"].as_str().unwrap();
            let boxed = format!("\\boxed{{{}}}.", rec.answer);
            assert_eq!(chosen.ends_with(&boxed), kind != "no_answer", "{chosen}");
            if kind == "no_answer" {
                assert!(chosen.ends_with(&format!("is {}.", rec.answer)), "{chosen}");
                let rejected = row["rejected"][0]["content"].as_str().unwrap();
                assert!(!rejected.chars().any(|c| c.is_ascii_digit()), "{rejected}");
            }
        }
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(
            RejectedKind::parse_list("no_answer, wrong_number,no_answer").unwrap(),
            vec![RejectedKind::NoAnswer, RejectedKind::WrongNumber]
        );
        let err = RejectedKind::parse_list("wrong").unwrap_err();
        assert!(
            err.contains("wrong_number, missing_box, no_answer"),
            "{err}"
        );
        assert!(RejectedKind::parse_list(" , ").is_err());
    }
}
