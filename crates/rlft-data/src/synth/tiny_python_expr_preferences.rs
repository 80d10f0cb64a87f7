//! Preference pairs for the `tiny_python_expr` prompts (what `rlft data tiny-python-expr
//! --preferences` writes): a reward model or DPO learns from them what the seed example's rule
//! reward scores, with no download and no model.
//!
//! Each expression row becomes one conversational preference row:
//!
//! - `prompt`: the row's user prompt (`[{"role": "user", "content": ...}]`; the example's
//!   system prompt is added by the trainer's `system_prompt`, as in GRPO);
//! - `chosen`: the right answer in the style the example's completions take,
//!   `"{expression} equals {answer}. So the answer is \boxed{answer}."`;
//! - `rejected`, drawn per row: a wrong number in the same sentence and box (`wrong_number`:
//!   the answer plus an offset in `±1..=±10`, kept non-negative) or the right number without
//!   the box (`missing_box`), half and half;
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
}

impl RejectedKind {
    /// The `extra_info.rejected_kind` value.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectedKind::WrongNumber => "wrong_number",
            RejectedKind::MissingBox => "missing_box",
        }
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

/// The preference row of `record`, drawing the rejected kind (and the wrong number) from `rng`.
pub fn preference_row(record: &ExprRecord, rng: &mut PyRandom) -> Value {
    let kind = if rng.random() < 0.5 {
        RejectedKind::WrongNumber
    } else {
        RejectedKind::MissingBox
    };
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
    };
    let msg = |role: &str, content: String| json!([{"role": role, "content": content}]);
    json!({
        "data_source": DATA_SOURCE,
        "prompt": msg("user", record.prompt()),
        "chosen": msg("assistant", completion(&record.expression, record.answer, true)),
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
/// `seed + PREFERENCE_SEED_OFFSET`).
pub fn preferences(ds: &TinyPythonExprDataset, seed: u64) -> (Dataset, Dataset) {
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
            .map(|r| preference_row(r, &mut rng))
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
        let (train, test) = preferences(&ds, 42);
        let (again, _) = preferences(&ds, 42);
        let (other, _) = preferences(&ds, 43);
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
}
