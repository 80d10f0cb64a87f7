//! Chat templates render byte-identically to transformers' `apply_chat_template`.
//!
//! Golden data: tests/data/chat_golden.json, made by scripts/reference/render_chat_templates.py
//! (real SmolLM2 / Qwen2.5 / Llama 3.1 / Llama 3.2 Instruct templates over several conversations,
//! plus probe templates for individual Jinja/Python behaviours), and the `chat_template` cases of
//! tests/fixtures/smollm2/golden.json (SmolLM2-135M-Instruct).

use rlft_text::{ChatTemplate, RenderOptions, SpecialTokens, TextError};
use serde_json::Value;
use std::path::{Path, PathBuf};

#[path = "../../../tests/fixtures.rs"]
mod fixtures;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn template_file(name: &str) -> String {
    std::fs::read_to_string(data_dir().join("templates").join(name)).unwrap()
}

fn str_field(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

fn options(case: &Value) -> RenderOptions {
    let specials = &case["special_tokens"];
    let list = |key: &str| case.get(key).and_then(Value::as_array).cloned();
    RenderOptions {
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap_or(false),
        continue_final_message: case["continue_final_message"].as_bool().unwrap_or(false),
        special_tokens: SpecialTokens {
            bos: str_field(specials, "bos_token"),
            eos: str_field(specials, "eos_token"),
            unk: str_field(specials, "unk_token"),
            pad: str_field(specials, "pad_token"),
        },
        tools: list("tools"),
        documents: list("documents"),
        kwargs: case["kwargs"].as_object().cloned().unwrap_or_default(),
    }
}

/// A readable account of where two renderings first differ.
fn first_difference(want: &str, got: &str) -> String {
    let at = want
        .char_indices()
        .zip(got.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or(want.len().min(got.len()));
    let from = want[..at]
        .char_indices()
        .rev()
        .nth(30)
        .map_or(0, |(i, _)| i);
    format!(
        "first difference at byte {at}:\n  want …{:?}\n  got  …{:?}",
        &want[from..(at + 40).min(want.len())]
            .chars()
            .take(70)
            .collect::<String>(),
        got.get(from..)
            .unwrap_or("")
            .chars()
            .take(70)
            .collect::<String>(),
    )
}

#[test]
fn chat_templates_match_transformers() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(data_dir().join("chat_golden.json")).unwrap(),
    )
    .unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert!(
        cases.len() > 50,
        "golden file has only {} cases",
        cases.len()
    );
    let mut failures = Vec::new();
    for case in cases {
        let name = format!(
            "{} {}",
            str_field(case, "template").unwrap_or_default(),
            case["name"].as_str().unwrap()
        );
        let source = match str_field(case, "template") {
            Some(file) => template_file(&file),
            None => str_field(case, "template_source").unwrap(),
        };
        let template = match ChatTemplate::new(source) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: does not compile: {e}"));
                continue;
            }
        };
        let messages = case["messages"].as_array().unwrap();
        let result = template.render(messages, &options(case));
        match (str_field(case, "text"), str_field(case, "raises"), result) {
            (Some(want), _, Ok(got)) if want == got => {}
            (Some(want), _, Ok(got)) => {
                failures.push(format!("{name}: {}", first_difference(&want, &got)))
            }
            (Some(_), _, Err(e)) => failures.push(format!("{name}: failed: {e}")),
            (None, Some(want), Err(TextError::TemplateRaised { message })) if message == want => {}
            (None, Some(want), other) => {
                failures.push(format!("{name}: expected raise {want:?}, got {other:?}"))
            }
            (None, None, _) => panic!("{name}: golden case has neither text nor raises"),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from transformers:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_golden_chat_cases() {
    let golden: Value =
        serde_json::from_str(&fixtures::read_fixture(fixtures::SMOLLM2_GOLDEN)).unwrap();
    let template = ChatTemplate::new(template_file("smollm2-instruct.jinja")).unwrap();
    let cases = golden["chat_template"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let opts = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            special_tokens: SpecialTokens {
                bos: Some("<|im_start|>".into()),
                eos: Some("<|im_end|>".into()),
                unk: Some("<|endoftext|>".into()),
                pad: Some("<|im_end|>".into()),
            },
            ..Default::default()
        };
        let got = template
            .render(case["messages"].as_array().unwrap(), &opts)
            .unwrap();
        assert_eq!(got, case["text"].as_str().unwrap());
    }
}
