//! Thousands of pseudo-random strings (Unicode, braces, markers, number-like pieces) through every
//! text parser: nothing panics and the scores keep their invariants. `fuzz/` does the same with
//! coverage guidance.

use rlft_rewards::format::incremental_format_score;
use rlft_rewards::normalize::{normalize_answer, py_strip};
use rlft_rewards::rules::{boxed_accuracy, candidate_answer, python_expr_rule, repetition_penalty};
use rlft_rewards::{build_reward, RewardSpec, Sample};
use serde_json::json;

/// splitmix64: a tiny deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const PIECES: &[&str] = &[
    "\\boxed{",
    "\\boxed{",
    "}",
    "{",
    "}",
    "$",
    ",",
    ".",
    "-",
    "+",
    "e",
    "E",
    "_",
    "0",
    "1",
    "7",
    "9",
    "26",
    "000",
    " ",
    "\n",
    "\t",
    "\u{3000}",
    "\u{1c}",
    "\u{85}",
    "nan",
    "Infinity",
    "sNaN",
    "\u{663}",
    "\u{ff10}",
    "\u{1d7ce}",
    "\u{b2}",
    "é",
    "e\u{301}",
    "🦀",
    "\u{200b}",
    "<|im_start|>assistant",
    "<|im_end|>",
    "<answer>",
    "</answer>",
    "\\frac{1}{2}",
    "1e999999",
    "1e-9",
    "e+",
    "ΣΑΣ",
    "İ",
    "the",
    "the cat",
    "\u{0}",
    "\\",
];

fn random_text(rng: &mut Rng) -> String {
    let n = rng.below(24);
    let mut s = String::new();
    for _ in 0..n {
        if rng.below(8) == 0 {
            // any valid code point
            let c = char::from_u32(rng.below(0x11_0000) as u32).unwrap_or('\u{fffd}');
            s.push(c);
        } else {
            s.push_str(PIECES[rng.below(PIECES.len())]);
        }
    }
    s
}

#[test]
fn random_strings_through_every_parser() {
    let mut rng = Rng(0x5eed);
    let tags: Vec<String> = ["<answer>", "</answer>"].map(String::from).to_vec();
    for _ in 0..4000 {
        let completion = random_text(&mut rng);
        let truth = random_text(&mut rng);
        let s = python_expr_rule(&completion, &truth);
        assert!(s.format == 0.0 || s.format == 1.0, "{completion:?}");
        assert!(s.accuracy == 0.0 || s.accuracy == 1.0, "{completion:?}");
        assert_eq!(s.total, 0.1 * s.format + 0.9 * s.accuracy);
        let a = boxed_accuracy(&completion, &truth);
        assert!(a == 0.0 || a == 1.0);
        let _ = normalize_answer(&completion);
        let _ = candidate_answer(&completion);
        let ngram = 1 + rng.below(4);
        let r = repetition_penalty(&completion, ngram, -1.0);
        assert!((-1.0..=0.0).contains(&r), "{r} for {completion:?}");
        let f = incremental_format_score(&completion, &tags, 0.5, 0.001);
        assert!(f <= 1.0 && f.is_finite());

        // A boxed brace-free answer always matches itself.
        let inner: String = truth.chars().filter(|c| *c != '{' && *c != '}').collect();
        if !py_strip(&inner).is_empty() {
            let boxed = format!("\\boxed{{{inner}}}");
            assert_eq!(boxed_accuracy(&boxed, &inner), 1.0, "{inner:?}");
            if !inner.contains("<|im_start|>assistant") {
                assert_eq!(python_expr_rule(&boxed, &inner).format, 1.0, "{inner:?}");
            }
        }
    }
}

#[test]
fn random_numbers_normalise_like_decimal() {
    let mut rng = Rng(42);
    for _ in 0..3000 {
        let int_digits = 1 + rng.below(20);
        let mut int: String = (0..int_digits)
            .map(|_| char::from(b'0' + rng.below(10) as u8))
            .collect();
        int = int.trim_start_matches('0').to_string();
        let frac: String = (0..rng.below(6))
            .map(|_| char::from(b'0' + rng.below(10) as u8))
            .collect();
        let frac = frac.trim_end_matches('0');
        let zeros = "0".repeat(rng.below(4));
        let text = format!("{}.{frac}{zeros}", if int.is_empty() { "0" } else { &int });
        let want = match (int.is_empty(), frac.is_empty()) {
            (true, true) => "0".to_string(),
            (_, true) => int.clone(),
            (true, false) => format!("0.{frac}"),
            (false, false) => format!("{int}.{frac}"),
        };
        assert_eq!(normalize_answer(&text), want, "{text}");
        let negative = format!("-{text}");
        let want_negative = if want == "0" {
            want.clone()
        } else {
            format!("-{want}")
        };
        assert_eq!(normalize_answer(&negative), want_negative, "{negative}");
        // Dollar signs and commas do not matter.
        assert_eq!(normalize_answer(&format!("${text}$")), want);
        assert_eq!(
            normalize_answer(&format!("{},{}", &text[..1], &text[1..])),
            want
        );
    }
}

#[test]
fn every_kind_survives_random_batches() {
    let specs = [
        json!({"type": "python_expr_rule"}),
        json!({"type": "boxed_accuracy", "answer_field": "reward_model.ground_truth"}),
        json!({"type": "strict_format", "pattern": r"<answer>.*?</answer>"}),
        json!({"type": "regex_format", "pattern": r"\\boxed\{[^{}]+\}"}),
        json!({"type": "incremental_format"}),
        json!({"type": "length", "target": 10, "tolerance": 2}),
        json!({"type": "overlong", "max_completion_length": 20, "buffer": 5}),
        json!({"type": "repetition", "ngram": 2}),
    ];
    let mut rewards: Vec<_> = specs
        .iter()
        .map(|s| build_reward(&serde_json::from_value::<RewardSpec>(s.clone()).unwrap()).unwrap())
        .collect();
    let mut rng = Rng(7);
    for _ in 0..200 {
        let texts: Vec<(String, serde_json::Value)> = (0..8)
            .map(|_| {
                (
                    random_text(&mut rng),
                    json!({"reward_model": {"ground_truth": random_text(&mut rng)}}),
                )
            })
            .collect();
        let batch: Vec<Sample> = texts
            .iter()
            .map(|(c, row)| Sample {
                prompt: "",
                completion: c,
                row,
                completion_ids: &[],
                completion_tokens: c.chars().count(),
                truncated: false,
                environment_reward: None,
            })
            .collect();
        for r in &mut rewards {
            let out = r.score(&batch).unwrap();
            assert_eq!(out.scores.len(), batch.len());
            assert!(
                out.scores.iter().all(|s| s.is_some_and(f64::is_finite)),
                "{}",
                r.name()
            );
        }
    }
}
