//! Feeds arbitrary text to the rule rewards of `rlft-rewards`: the input is split at its first
//! 0xFF byte (never part of UTF-8) into a completion and a ground truth, both decoded lossily.
//! Runs the seed's `python_expr_rule` and its normalisation, `boxed_accuracy`, the format rewards
//! and the repetition penalty, directly and through `Reward` objects. Any panic is a bug.
#![no_main]

use std::sync::{LazyLock, Mutex};

use libfuzzer_sys::fuzz_target;
use rlft_rewards::format::incremental_format_score;
use rlft_rewards::normalize::normalize_answer;
use rlft_rewards::rules::{
    boxed_accuracy, candidate_answer, last_assistant_turn, python_expr_rule, repetition_penalty,
};
use rlft_rewards::{build_reward, Reward, RewardSpec, Sample};
use serde_json::json;

static REWARDS: LazyLock<Mutex<Vec<Box<dyn Reward>>>> = LazyLock::new(|| {
    let specs = [
        json!({"type": "python_expr_rule"}),
        json!({"type": "boxed_accuracy", "answer_field": "reward_model.ground_truth"}),
        json!({"type": "strict_format",
               "pattern": "<reasoning>\\n.*?\\n</reasoning>\\n<answer>\\n.*?\\n</answer>\\n?"}),
        json!({"type": "regex_format", "pattern": "\\\\boxed\\{[^{}]+\\}"}),
        json!({"type": "incremental_format"}),
        json!({"type": "repetition", "ngram": 2}),
    ];
    let rewards = specs
        .into_iter()
        .map(|s| build_reward(&serde_json::from_value::<RewardSpec>(s).unwrap()).unwrap())
        .collect();
    Mutex::new(rewards)
});

fuzz_target!(|data: &[u8]| {
    let (a, b) = match data.iter().position(|&x| x == 0xff) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let completion = String::from_utf8_lossy(a);
    let truth = String::from_utf8_lossy(b);

    let s = python_expr_rule(&completion, &truth);
    assert!(s.format == 0.0 || s.format == 1.0);
    assert!(s.accuracy == 0.0 || s.accuracy == 1.0);
    assert_eq!(s.total, 0.1 * s.format + 0.9 * s.accuracy);
    let acc = boxed_accuracy(&completion, &truth);
    assert!(acc == 0.0 || acc == 1.0);
    let _ = normalize_answer(&completion);
    let _ = normalize_answer(&truth);
    let _ = candidate_answer(last_assistant_turn(&completion));
    let ngram = 1 + data.len() % 4;
    let r = repetition_penalty(&completion, ngram, -1.0);
    assert!((-1.0..=0.0).contains(&r));
    let tags = [truth.to_string(), "</answer>".to_string()];
    if !truth.is_empty() {
        assert!(incremental_format_score(&completion, &tags, 0.5, 0.001).is_finite());
    }

    let row = json!({"reward_model": {"ground_truth": truth}});
    let batch = [Sample {
        prompt: "",
        completion: &completion,
        row: &row,
        completion_ids: &[],
        completion_tokens: completion.len(),
        truncated: false,
    }];
    for reward in REWARDS.lock().unwrap().iter_mut() {
        let out = reward.score(&batch).unwrap();
        assert_eq!(out.scores.len(), 1);
        assert!(out.scores[0].is_some_and(f64::is_finite));
    }
});
