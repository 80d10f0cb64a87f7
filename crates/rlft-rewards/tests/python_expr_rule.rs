//! The seed's reward against Python: the seed fixture
//! `tests/fixtures/tiny_python_expr/reward_cases.jsonl` and the extra cases, both written by
//! `scripts/reference/python_expr_rule_cases.py`.

use std::path::{Path, PathBuf};

use rlft_rewards::normalize::normalize_answer;
use rlft_rewards::rules::{candidate_answer, last_assistant_turn, python_expr_rule};
use rlft_rewards::{RewardSet, RewardSpec, Sample};
use serde_json::{json, Value};

#[path = "../../../tests/fixtures.rs"]
mod fixtures;

fn read_jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn str_field<'a>(case: &'a Value, key: &str) -> &'a str {
    case[key]
        .as_str()
        .unwrap_or_else(|| panic!("case without `{key}`: {case}"))
}

/// Compares `got` with `case[key]`, or with `key_len`/`key_head`/`key_tail` for long values.
fn check_text(case: &Value, key: &str, got: &str, failures: &mut Vec<String>) {
    let ok = match case.get(key).and_then(Value::as_str) {
        Some(want) => got == want,
        None => {
            let len = case[format!("{key}_len")].as_u64().expect("stored length") as usize;
            let head = str_field(case, &format!("{key}_head"));
            let tail = str_field(case, &format!("{key}_tail"));
            got.chars().count() == len && got.starts_with(head) && got.ends_with(tail)
        }
    };
    if !ok {
        let shown: String = got.chars().take(80).collect();
        failures.push(format!("{key}: got {shown:?} for {case}"));
    }
}

#[test]
fn seed_fixture() {
    let cases = read_jsonl(&fixtures::fixture(fixtures::TINY_PYTHON_EXPR_REWARD_CASES));
    assert!(cases.len() >= 20, "only {} cases", cases.len());
    let spec: RewardSpec = serde_json::from_value(json!({"type": "python_expr_rule"})).unwrap();
    let mut set = RewardSet::new(&[spec], None).unwrap();
    let rows: Vec<Value> = cases
        .iter()
        .map(|c| json!({"reward_model": {"ground_truth": c["ground_truth"]}}))
        .collect();
    let batch: Vec<Sample> = cases
        .iter()
        .zip(&rows)
        .map(|(c, row)| Sample {
            prompt: "",
            completion: str_field(c, "completion"),
            row,
            completion_ids: &[],
            completion_tokens: 0,
            truncated: false,
            environment_reward: None,
        })
        .collect();
    let scores = set.score(&batch).unwrap();
    let out = &scores.per_function[0];
    for (i, case) in cases.iter().enumerate() {
        let want = |k: &str| case[k].as_f64().unwrap();
        let direct = python_expr_rule(
            str_field(case, "completion"),
            str_field(case, "ground_truth"),
        );
        assert_eq!(
            (direct.format, direct.accuracy, direct.total),
            (want("format"), want("accuracy"), want("total")),
            "{case}"
        );
        assert_eq!(out.scores[i], Some(want("total")), "{case}");
        assert_eq!(scores.total[i], want("total"), "{case}");
        assert_eq!(out.part("format").unwrap()[i], want("format"), "{case}");
        assert_eq!(out.part("accuracy").unwrap()[i], want("accuracy"), "{case}");
    }
}

#[test]
fn extra_cases_from_python() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/python_expr_rule_extra.jsonl");
    let cases = read_jsonl(&path);
    let mut failures = Vec::new();
    let (mut rewards, mut normalizations, mut raising) = (0, 0, 0);
    for case in &cases {
        if case.get("_meta").is_some() {
            continue;
        }
        if case["python_raises"].is_string() {
            raising += 1;
        }
        if let Some(input) = case.get("normalize").and_then(Value::as_str) {
            normalizations += 1;
            check_text(case, "expected", &normalize_answer(input), &mut failures);
            continue;
        }
        rewards += 1;
        let completion = str_field(case, "completion");
        let truth = str_field(case, "ground_truth");
        let got = python_expr_rule(completion, truth);
        let want = |k: &str| case[k].as_f64().unwrap();
        if (got.format, got.accuracy, got.total)
            != (want("format"), want("accuracy"), want("total"))
        {
            failures.push(format!("scores {got:?} for {case}"));
        }
        let prediction = candidate_answer(last_assistant_turn(completion));
        check_text(case, "prediction", &prediction, &mut failures);
        check_text(
            case,
            "prediction_normalized",
            &normalize_answer(&prediction),
            &mut failures,
        );
        check_text(
            case,
            "ground_truth_normalized",
            &normalize_answer(truth),
            &mut failures,
        );
    }
    assert!(
        rewards > 700 && normalizations > 200 && raising > 20,
        "{rewards} {normalizations} {raising}"
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
