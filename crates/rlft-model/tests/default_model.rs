//! The embedded default model (SmolLM2-135M-Instruct, GGUF Q4_1) against transformers' golden
//! values in `tests/fixtures/smollm2/golden.json`: tokenizer ids, chat template text,
//! per-token log-probs (1e-3), last-position top-5 ids and greedy continuations; then the same
//! checks after exporting to an HF directory and reloading it.
//!
//! The model is `RLFT_DEFAULT_MODEL`, else the cache of `scripts/fetch-default-model.sh`
//! (`~/.cache/rlft/models/`), which the tests run once when the file is not there.

mod common;

use std::sync::OnceLock;

use candle_core::{Device, Tensor};
use rlft_model::decoder::Batch;
use rlft_model::export::{save_hf_dir, ExportOptions};
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::{generate, GenerateRequest, LoadedModel, SamplingParams};
use rlft_text::Message;
use serde_json::Value;

use common::{default_model_path, golden, ids};

fn gguf_model() -> &'static LoadedModel {
    static M: OnceLock<LoadedModel> = OnceLock::new();
    M.get_or_init(|| load_model(default_model_path(), &LoadOptions::default()).unwrap())
}

fn messages(v: &Value) -> Vec<Message> {
    serde_json::from_value(v.clone()).unwrap()
}

fn check_all(m: &LoadedModel, label: &str) {
    let g = golden();
    // Tokenizer.
    for case in g["tokenize"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            m.text.encode(text, false).unwrap(),
            ids(&case["ids"]),
            "{label}: {text:?}"
        );
    }
    // Chat template.
    let tpl = m.text.compile_chat_template().unwrap();
    for case in g["chat_template"].as_array().unwrap() {
        let opts = m
            .text
            .render_options(case["add_generation_prompt"].as_bool().unwrap());
        let got = tpl.render(&messages(&case["messages"]), &opts).unwrap();
        assert_eq!(
            got,
            case["text"].as_str().unwrap(),
            "{label}: chat template"
        );
    }
    // Per-token log-probs and top-5.
    let model = &m.model;
    for case in g["logprobs"].as_array().unwrap() {
        let want_ids = ids(&case["ids"]);
        assert_eq!(
            m.text
                .encode(case["text"].as_str().unwrap(), false)
                .unwrap(),
            want_ids
        );
        let t = want_ids.len();
        let batch =
            Batch::left_padded(std::slice::from_ref(&want_ids), &[0], 0, 0, &Device::Cpu).unwrap();
        let hidden = model.forward(&batch, None, false).unwrap();
        let rows = hidden.squeeze(0).unwrap().narrow(0, 0, t - 1).unwrap();
        let targets = Tensor::new(&want_ids[1..], &Device::Cpu).unwrap();
        let got: Vec<f32> = model
            .target_logprobs(&rows, &targets, 8)
            .unwrap()
            .to_vec1()
            .unwrap();
        let want = case["next_token_logprobs"].as_array().unwrap();
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            let b = b.as_f64().unwrap();
            assert!(
                (*a as f64 - b).abs() < 1e-3,
                "{label}: position {i}: rlft {a} vs transformers {b}"
            );
        }
        let logits: Vec<f32> = model
            .logits_at(&hidden, &[t - 1])
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let top5: Vec<u32> = order[..5].iter().map(|&i| i as u32).collect();
        assert_eq!(top5, ids(&case["last_top5_ids"]), "{label}: top-5");
    }
    // Greedy continuations, batched (prompts of different lengths in one batch).
    let cases = g["greedy"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| {
            let text = tpl
                .render(&messages(&c["messages"]), &m.text.render_options(true))
                .unwrap();
            let p = m.text.encode(&text, false).unwrap();
            assert_eq!(p, ids(&c["prompt_ids"]), "{label}: prompt ids");
            p
        })
        .collect();
    let max_new = cases
        .iter()
        .map(|c| c["new_ids"].as_array().unwrap().len())
        .max()
        .unwrap();
    let req = GenerateRequest {
        prompts,
        n: 1,
        max_new_tokens: max_new,
        sampling: SamplingParams::greedy(),
        seed: 0,
        eos_token_ids: m.generation.eos_token_ids.clone(),
        stop_strings: vec![],
        pad_token_id: m.generation.pad_token_id.unwrap_or(0),
    };
    let detok = |ids: &[u32]| m.text.decode(ids, true).unwrap_or_default();
    let out = generate(model, &req, &detok).unwrap();
    for (c, o) in cases.iter().zip(&out) {
        let want = ids(&c["new_ids"]);
        assert_eq!(o.token_ids, want, "{label}: greedy continuation");
        let full = m.text.decode(&o.token_ids, false).unwrap();
        assert_eq!(full, c["text"].as_str().unwrap());
    }
}

#[test]
fn default_gguf_matches_transformers() {
    let m = gguf_model();
    assert_eq!(m.model.config.num_parameters(), 134_515_008);
    assert_eq!(m.generation.eos_token_ids, vec![2]);
    check_all(m, "gguf");
}

#[test]
fn converted_default_model_matches_transformers() {
    let m = gguf_model();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2-hf");
    save_hf_dir(
        &m.model,
        &m.text,
        &m.generation,
        &out,
        &ExportOptions::default(),
    )
    .unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        cfg["rope_parameters"]["rope_theta"].as_f64(),
        Some(100000.0)
    );
    assert_eq!(cfg["rope_theta"].as_f64(), Some(100000.0));
    let reloaded = load_model(&out, &LoadOptions::default()).unwrap();
    check_all(&reloaded, "converted");
}
