//! Tiny random Llama / Qwen2 / Qwen3 models against transformers' golden log-probs
//! (`tests/golden/*.json`, made by `scripts/reference/tiny_models.py`), plus equivalences:
//! KV-cache decoding == full recompute, left-padded batches == single rows, the differentiable
//! path == the fused path, and save -> reload as an HF directory.

use candle_core::{DType, Device, Tensor};
use rlft_model::config::{Family, ModelConfig};
use rlft_model::decoder::{Batch, CausalLm};
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::tiny::{random_model, save_tiny_hf_dir, tiny_config};
use rlft_model::{generate, GenerateRequest, KvCache, SamplingParams};
use serde_json::Value;

fn golden(name: &str) -> Value {
    let path = format!("{}/tests/golden/{name}.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Per-position next-token log-probs of one unpadded row.
fn logprobs(model: &CausalLm, ids: &[u32], grad: bool) -> Vec<f32> {
    let batch = Batch::left_padded(&[ids.to_vec()], &[0], 0, 0, &Device::Cpu).unwrap();
    let hidden = model.forward(&batch, None, grad).unwrap();
    let t = ids.len();
    let h = hidden.dim(2).unwrap();
    let rows = hidden.reshape((t, h)).unwrap().narrow(0, 0, t - 1).unwrap();
    let targets = Tensor::new(&ids[1..], &Device::Cpu).unwrap();
    model
        .target_logprobs(&rows, &targets, 5)
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn check_golden(name: &str, model: &CausalLm) {
    let g = golden(name);
    for case in g["cases"].as_array().unwrap() {
        let ids = ids_of(&case["ids"]);
        let want: Vec<f64> = case["next_token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        for grad in [false, true] {
            let got = logprobs(model, &ids, grad);
            assert_eq!(got.len(), want.len());
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (*a as f64 - b).abs() < 1e-4,
                    "{name} pos {i} grad={grad}: rlft {a} vs transformers {b}"
                );
            }
        }
        // Top-5 at the last position.
        let batch =
            Batch::left_padded(std::slice::from_ref(&ids), &[0], 0, 0, &Device::Cpu).unwrap();
        let hidden = model.forward(&batch, None, false).unwrap();
        let logits: Vec<f32> = model
            .logits_at(&hidden, &[ids.len() - 1])
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let top5: Vec<u32> = order[..5].iter().map(|&i| i as u32).collect();
        assert_eq!(top5, ids_of(&case["last_top5_ids"]), "{name} top-5");
    }
    // Greedy continuation.
    let first = ids_of(&g["cases"][0]["ids"]);
    let req = GenerateRequest {
        prompts: vec![first],
        n: 1,
        max_new_tokens: g["greedy"]["max_new_tokens"].as_u64().unwrap() as usize,
        sampling: SamplingParams::greedy(),
        seed: 0,
        eos_token_ids: vec![],
        stop_strings: vec![],
        pad_token_id: 0,
    };
    let out = generate(model, &req, &|_: &[u32]| String::new()).unwrap();
    assert_eq!(
        out[0].token_ids,
        ids_of(&g["greedy"]["new_ids"]),
        "{name} greedy"
    );
}

fn golden_model(name: &str) -> CausalLm {
    let g = golden(name);
    let cfg = ModelConfig::from_hf_json(&g["config"]).unwrap();
    random_model(cfg, g["seed"].as_u64().unwrap(), DType::F32, &Device::Cpu).unwrap()
}

#[test]
fn tiny_llama_matches_transformers() {
    check_golden("tiny_llama", &golden_model("tiny_llama"));
}

#[test]
fn tiny_qwen2_matches_transformers() {
    check_golden("tiny_qwen2", &golden_model("tiny_qwen2"));
}

#[test]
fn tiny_qwen3_matches_transformers() {
    check_golden("tiny_qwen3", &golden_model("tiny_qwen3"));
}

#[test]
fn golden_models_survive_hf_dir_round_trip() {
    for name in ["tiny_llama", "tiny_qwen2", "tiny_qwen3"] {
        let g = golden(name);
        let cfg = ModelConfig::from_hf_json(&g["config"]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        save_tiny_hf_dir(cfg, g["seed"].as_u64().unwrap(), &path).unwrap();
        let loaded = load_model(&path, &LoadOptions::default()).unwrap();
        check_golden(name, &loaded.model);
        assert_eq!(loaded.generation.eos_token_ids, vec![2]);
        let ids = loaded.text.encode("héllo <|im_end|>", false).unwrap();
        assert_eq!(*ids.last().unwrap(), 2);
        assert_eq!(loaded.text.decode(&ids, false).unwrap(), "héllo <|im_end|>");
    }
}

fn all_families() -> Vec<CausalLm> {
    [Family::Llama, Family::Qwen2, Family::Qwen3]
        .into_iter()
        .map(|f| random_model(tiny_config(f), 3, DType::F32, &Device::Cpu).unwrap())
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn kv_cache_decoding_equals_full_recompute() {
    let ids: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 259).collect();
    for model in all_families() {
        let fam = model.config.family;
        // Full recompute: logits at every position.
        let batch =
            Batch::left_padded(std::slice::from_ref(&ids), &[0], 0, 0, &Device::Cpu).unwrap();
        let hidden = model.forward(&batch, None, false).unwrap();
        let full: Vec<Vec<f32>> = (0..ids.len())
            .map(|p| {
                model
                    .logits_at(&hidden, &[p])
                    .unwrap()
                    .squeeze(0)
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            })
            .collect();
        // Prefill 5 tokens, then decode one at a time.
        let mut cache = KvCache::new(model.layers.len(), ids.len());
        let pre = Batch::left_padded(&[ids[..5].to_vec()], &[0], 0, 0, &Device::Cpu).unwrap();
        let h = model.forward(&pre, Some(&mut cache), false).unwrap();
        let l: Vec<f32> = model
            .logits_at(&h, &[4])
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(max_abs_diff(&l, &full[4]) < 1e-4, "{fam:?} prefill");
        for p in 5..ids.len() {
            let b = Batch::left_padded(&[vec![ids[p]]], &[0], p, 0, &Device::Cpu).unwrap();
            let h = model.forward(&b, Some(&mut cache), false).unwrap();
            let l: Vec<f32> = model
                .logits_at(&h, &[0])
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec1()
                .unwrap();
            let d = max_abs_diff(&l, &full[p]);
            assert!(d < 1e-4, "{fam:?} decode position {p}: max diff {d}");
        }
    }
}

#[test]
fn left_padded_batch_equals_single_rows() {
    let a: Vec<u32> = (0..9).map(|i| (i * 13 + 7) % 259).collect();
    let b: Vec<u32> = (0..4).map(|i| (i * 29 + 3) % 259).collect();
    for model in all_families() {
        let single = |ids: &[u32]| -> Vec<f32> {
            let batch = Batch::left_padded(&[ids.to_vec()], &[0], 0, 0, &Device::Cpu).unwrap();
            let h = model.forward(&batch, None, false).unwrap();
            model
                .logits_at(&h, &[ids.len() - 1])
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let batch =
            Batch::left_padded(&[a.clone(), b.clone()], &[0, 5], 0, 2, &Device::Cpu).unwrap();
        let h = model.forward(&batch, None, false).unwrap();
        let l: Vec<Vec<f32>> = model.logits_at(&h, &[8, 8]).unwrap().to_vec2().unwrap();
        assert!(max_abs_diff(&l[0], &single(&a)) < 1e-4);
        assert!(
            max_abs_diff(&l[1], &single(&b)) < 1e-4,
            "{:?}",
            model.config.family
        );
    }
}

#[test]
fn generation_is_seeded_and_batch_independent() {
    let model = &all_families()[0];
    let prompts = vec![vec![5u32, 6, 7, 8, 9], vec![10u32, 11]];
    let req = |prompts: Vec<Vec<u32>>, seed| GenerateRequest {
        prompts,
        n: 3,
        max_new_tokens: 10,
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            top_k: 50,
            ..Default::default()
        },
        seed,
        eos_token_ids: vec![2],
        stop_strings: vec![],
        pad_token_id: 2,
    };
    let none = |_: &[u32]| String::new();
    let one = generate(model, &req(prompts.clone(), 7), &none).unwrap();
    let two = generate(model, &req(prompts.clone(), 7), &none).unwrap();
    let other = generate(model, &req(prompts.clone(), 8), &none).unwrap();
    let ids =
        |c: &[rlft_model::Completion]| c.iter().map(|c| c.token_ids.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&one), ids(&two));
    assert_ne!(ids(&one), ids(&other));
    assert_eq!(one.len(), 6);
    // The second prompt's samples do not depend on its batch neighbour (padding, length).
    let neighbour = vec![
        vec![1u32, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
        prompts[1].clone(),
    ];
    let with_other = generate(model, &req(neighbour, 7), &none).unwrap();
    let alone = &with_other[3..];
    let alone_ids = ids(alone);
    for s in 0..3 {
        assert_eq!(one[3 + s].token_ids, alone_ids[s]);
        for (x, y) in one[3 + s].logprobs.iter().zip(&alone[s].logprobs) {
            assert!((x - y).abs() < 1e-4);
        }
    }
    // Sampled log-probs equal a teacher-forced recompute of the same tokens.
    let c = &one[0];
    let mut full = prompts[0].clone();
    full.extend(&c.token_ids);
    let lp = logprobs(model, &full, false);
    let tail = &lp[prompts[0].len() - 1..];
    assert!(max_abs_diff(tail, &c.logprobs) < 1e-4);
}

#[test]
fn stop_strings_and_finish_reasons() {
    let model = &all_families()[1];
    let detok = |ids: &[u32]| ids.iter().map(|i| format!("<{i}>")).collect::<String>();
    let greedy = GenerateRequest {
        prompts: vec![vec![5u32, 6, 7]],
        n: 1,
        max_new_tokens: 6,
        sampling: SamplingParams::greedy(),
        seed: 0,
        eos_token_ids: vec![],
        stop_strings: vec![],
        pad_token_id: 2,
    };
    let free = generate(model, &greedy, &detok).unwrap();
    assert_eq!(free[0].finish_reason, rlft_model::FinishReason::Length);
    assert_eq!(free[0].token_ids.len(), 6);
    // Stop on the second generated token's text.
    let second = format!("<{}>", free[0].token_ids[1]);
    let stopped = generate(
        model,
        &GenerateRequest {
            stop_strings: vec![second.clone()],
            ..greedy.clone()
        },
        &detok,
    )
    .unwrap();
    assert_eq!(stopped[0].finish_reason, rlft_model::FinishReason::Stop);
    assert!(!stopped[0].text.contains(&second));
    // Stop on an eos id: the id is kept.
    let eos = free[0].token_ids[2];
    let e = generate(
        model,
        &GenerateRequest {
            eos_token_ids: vec![eos],
            ..greedy.clone()
        },
        &detok,
    )
    .unwrap();
    assert_eq!(e[0].finish_reason, rlft_model::FinishReason::Stop);
    assert_eq!(*e[0].token_ids.last().unwrap(), eos);
    assert!(e[0].token_ids.len() <= 3);
}

#[test]
fn bf16_weights_track_f32() {
    let ids: Vec<u32> = (0..10).map(|i| (i * 31 + 1) % 259).collect();
    let cfg = tiny_config(Family::Qwen3);
    let f32m = random_model(cfg.clone(), 1, DType::F32, &Device::Cpu).unwrap();
    let bf16m = random_model(cfg, 1, DType::BF16, &Device::Cpu).unwrap();
    let a = logprobs(&f32m, &ids, false);
    let b = logprobs(&bf16m, &ids, false);
    assert!(max_abs_diff(&a, &b) < 0.1, "{a:?} vs {b:?}");
}

#[test]
fn bad_inputs_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let e = load_model(dir.path().join("nope"), &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not exist"), "{e}");
    // A directory without config.json.
    let e = load_model(dir.path(), &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("config.json"), "{e}");
    // Corrupt safetensors.
    let m = dir.path().join("m");
    save_tiny_hf_dir(tiny_config(Family::Llama), 0, &m).unwrap();
    std::fs::write(
        m.join("model.safetensors"),
        b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage",
    )
    .unwrap();
    let e = load_model(&m, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("corrupt"),
        "{e}"
    );
    // Unknown architecture.
    let m2 = dir.path().join("m2");
    save_tiny_hf_dir(tiny_config(Family::Qwen2), 0, &m2).unwrap();
    let cfg = std::fs::read_to_string(m2.join("config.json")).unwrap();
    std::fs::write(
        m2.join("config.json"),
        cfg.replace("\"qwen2\"", "\"mamba\""),
    )
    .unwrap();
    let e = load_model(&m2, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("mamba") && e.contains("supported"), "{e}");
    // Missing tokenizer.
    let m3 = dir.path().join("m3");
    save_tiny_hf_dir(tiny_config(Family::Qwen3), 0, &m3).unwrap();
    std::fs::remove_file(m3.join("tokenizer.json")).unwrap();
    let e = load_model(&m3, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
    // Config that does not match the weights.
    let m4 = dir.path().join("m4");
    save_tiny_hf_dir(tiny_config(Family::Llama), 0, &m4).unwrap();
    let cfg = std::fs::read_to_string(m4.join("config.json")).unwrap();
    std::fs::write(
        m4.join("config.json"),
        cfg.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3"),
    )
    .unwrap();
    let e = load_model(&m4, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.layers.2"), "{e}");
}

#[test]
fn fused_decode_equals_tensor_decode() {
    let none = |_: &[u32]| String::new();
    // Unrelated prompts; prompts with a common prefix (prefilled once on the fused path), one
    // of them a prefix of another; a single prompt; long prompts whose tails make a prefill of
    // more than 64 rows (the fused path's gemm and row-blocked streaming products).
    let long = |seed: u32| -> Vec<u32> {
        (3..13)
            .chain((0..30).map(|i| 3 + (i * 7 + seed * 13) % 500))
            .collect()
    };
    let batches = [
        vec![long(1), long(2), long(3)],
        vec![
            vec![5u32, 6, 7, 8, 9, 10, 11],
            vec![10u32, 11],
            vec![3u32; 4],
        ],
        vec![
            vec![5u32, 6, 7, 8, 9, 10, 11],
            vec![5u32, 6, 7, 8, 20],
            vec![5u32, 6, 7, 8, 9],
        ],
        vec![vec![5u32, 6, 7], vec![5u32, 6, 7, 8, 9]],
        vec![vec![7u32, 1, 9]],
    ];
    let models = all_families();
    for (model, prompts) in models
        .iter()
        .flat_map(|m| batches.iter().map(move |b| (m, b.clone())))
    {
        let req = GenerateRequest {
            prompts,
            n: 2,
            max_new_tokens: 12,
            sampling: SamplingParams::default(),
            seed: 11,
            eos_token_ids: vec![2, 40],
            stop_strings: vec![],
            pad_token_id: 2,
        };
        let fused = rlft_model::generate::generate_with(model, &req, &none, true).unwrap();
        let tensor = rlft_model::generate::generate_with(model, &req, &none, false).unwrap();
        assert_eq!(fused.len(), req.prompts.len() * req.n);
        for (a, b) in fused.iter().zip(&tensor) {
            assert_eq!(a.token_ids, b.token_ids, "{:?}", model.config.family);
            assert_eq!(a.finish_reason, b.finish_reason);
            assert!(max_abs_diff(&a.logprobs, &b.logprobs) < 1e-4);
        }
    }
}

#[test]
fn sharded_checkpoints_round_trip() {
    use rlft_model::export::{save_hf_dir, ExportOptions};
    let model = random_model(tiny_config(Family::Llama), 2, DType::F32, &Device::Cpu).unwrap();
    let text = rlft_model::tiny::tiny_text_bundle().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sharded");
    let opts = ExportOptions {
        shard_bytes: 40_000,
        ..Default::default()
    };
    save_hf_dir(&model, &text, &Default::default(), &out, &opts).unwrap();
    let shards: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .collect();
    assert!(shards.len() > 3, "{} shards", shards.len());
    assert!(out.join("model.safetensors.index.json").exists());
    let back = load_model(&out, &LoadOptions::default()).unwrap();
    let ids: Vec<u32> = (0..9).map(|i| (i * 17 + 4) % 259).collect();
    assert_eq!(
        logprobs(&model, &ids, false),
        logprobs(&back.model, &ids, false)
    );
    // A shard listed in the index but missing is named in the error.
    std::fs::remove_file(shards[0].path()).unwrap();
    let e = load_model(&out, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing"), "{e}");
}
