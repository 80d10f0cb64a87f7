//! The sequence-classification head against transformers' `*ForSequenceClassification`
//! (`tests/golden/score_*.json`, made by `scripts/reference/score_models.py`): per-token and
//! last-non-pad scores of tiny random Llama / Qwen2 / Qwen3 models within 1e-4; the HF
//! directory and PEFT adapter round trips; the errors for the wrong kind of model.

use candle_core::{DType, Device, Tensor};
use rlft_model::config::{Family, ModelConfig};
use rlft_model::decoder::CausalLm;
use rlft_model::export::ExportOptions;
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::lora::{attach_lora, LoraConfig};
use rlft_model::score::{
    load_score_model, save_score_adapter, save_score_model, sequence_scores, token_scores,
    ScoreBatch, ScoreHead, SCORE_WEIGHT,
};
use rlft_model::testing::det_init::det_tensor;
use rlft_model::tiny::{random_model, save_tiny_hf_dir, tiny_config, tiny_text_bundle};
use rlft_model::GenerationConfig;
use serde_json::Value;

fn golden(name: &str) -> Value {
    let path = format!(
        "{}/tests/golden/score_{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn rows_of(v: &Value) -> Vec<Vec<u32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn golden_model(g: &Value) -> (CausalLm, ScoreHead) {
    let cfg = ModelConfig::from_hf_json(&g["config"]).unwrap();
    let seed = g["seed"].as_u64().unwrap();
    let h = cfg.hidden_size;
    let model = random_model(cfg, seed, DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::from_vec(
        det_tensor(SCORE_WEIGHT, seed, &[1, h]),
        (1, h),
        &Device::Cpu,
    );
    (model, ScoreHead::new(w.unwrap()).unwrap())
}

fn check_golden(name: &str, model: &CausalLm, head: &ScoreHead) {
    let g = golden(name);
    let rows = rows_of(&g["rows"]);
    let pad = g["pad_token_id"].as_u64().unwrap() as u32;
    let sb = ScoreBatch::new(&rows, pad, &Device::Cpu).unwrap();
    let t = rows.iter().map(Vec::len).max().unwrap();
    let want_pos: Vec<usize> = g["score_pos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    for (r, row) in rows.iter().enumerate() {
        assert_eq!(
            sb.score_pos[r] - (t - row.len()),
            want_pos[r],
            "{name} row {r}"
        );
    }
    let want_seq = floats(&g["sequence_scores"]);
    for grad in [false, true] {
        let got: Vec<f32> = sequence_scores(model, head, &sb, grad)
            .unwrap()
            .to_vec1()
            .unwrap();
        for (r, (a, b)) in got.iter().zip(&want_seq).enumerate() {
            assert!(
                (*a as f64 - b).abs() < 1e-4,
                "{name} row {r} grad={grad}: rlft {a} vs transformers {b}"
            );
        }
        let tok: Vec<Vec<f32>> = token_scores(model, head, &sb.batch, grad)
            .unwrap()
            .to_vec2()
            .unwrap();
        for (r, row) in rows.iter().enumerate() {
            let want = floats(&g["token_scores"][r]);
            let off = t - row.len();
            for (j, w) in want.iter().enumerate() {
                let a = tok[r][off + j] as f64;
                assert!(
                    (a - w).abs() < 1e-4,
                    "{name} row {r} pos {j} grad={grad}: rlft {a} vs transformers {w}"
                );
            }
        }
    }
}

#[test]
fn tiny_models_score_as_transformers() {
    for name in ["tiny_llama", "tiny_qwen2", "tiny_qwen3"] {
        let (model, head) = golden_model(&golden(name));
        check_golden(name, &model, &head);
    }
}

fn generation() -> GenerationConfig {
    GenerationConfig {
        eos_token_ids: vec![2],
        bos_token_id: Some(1),
        pad_token_id: Some(2),
        ..Default::default()
    }
}

#[test]
fn hf_dir_round_trip_keeps_scores_and_drops_the_lm_head() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["tiny_llama", "tiny_qwen2", "tiny_qwen3"] {
        let g = golden(name);
        let (model, head) = golden_model(&g);
        let path = dir.path().join(name);
        let text = tiny_text_bundle().unwrap();
        let opts = ExportOptions::default();
        save_score_model(&model, &head, &text, &generation(), 2, &path, &opts).unwrap();
        let cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(path.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(cfg["architectures"], g["config"]["architectures"], "{name}");
        assert_eq!(cfg["id2label"], g["config"]["id2label"], "{name}");
        assert_eq!(cfg["pad_token_id"], 2);
        let st = std::fs::read(path.join("model.safetensors")).unwrap();
        let names: Vec<String> = safetensors::SafeTensors::deserialize(&st)
            .unwrap()
            .names()
            .into_iter()
            .map(str::to_string)
            .collect();
        assert!(names.contains(&SCORE_WEIGHT.to_string()), "{name}");
        assert!(!names.contains(&"lm_head.weight".to_string()), "{name}");
        let sm = load_score_model(&path, None, &LoadOptions::default()).unwrap();
        assert_eq!(sm.pad_id, 2);
        // Untied families come back without an LM head; tied ones keep the embeddings as it.
        let tied = sm.model.config.tie_word_embeddings;
        assert_eq!(sm.model.has_lm_head(), tied, "{name}");
        if !tied {
            let e = sm
                .model
                .logits(&Tensor::zeros((1, 64), DType::F32, &Device::Cpu).unwrap());
            assert!(e.unwrap_err().to_string().contains("no LM head"));
        }
        check_golden(name, &sm.model, &sm.head);
        // The causal-LM loader says what the directory is.
        let e = load_model(&path, &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ForSequenceClassification") && e.contains("score"),
            "{e}"
        );
    }
}

#[test]
fn a_causal_lm_is_not_a_reward_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lm");
    save_tiny_hf_dir(tiny_config(Family::Qwen3), 1, &path).unwrap();
    let e = load_score_model(&path, None, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not a reward model") && e.contains("rlft reward-model"),
        "{e}"
    );
}

#[test]
fn peft_adapter_with_score_head_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let base_dir = dir.path().join("base");
    let cfg = tiny_config(Family::Llama);
    save_tiny_hf_dir(cfg.clone(), 5, &base_dir).unwrap();
    let mut model = random_model(cfg, 5, DType::F32, &Device::Cpu).unwrap();
    let lora = LoraConfig {
        r: 4,
        lora_alpha: 8.0,
        init_lora_weights: false,
        seed: 3,
        ..LoraConfig::default()
    };
    attach_lora(&mut model, &lora).unwrap();
    let head = ScoreHead::normal(64, 0.5, 9, DType::F32, &Device::Cpu).unwrap();
    let adapter = dir.path().join("adapter");
    save_score_adapter(&model, &head, &lora, &adapter, None).unwrap();
    let ac: Value = serde_json::from_str(
        &std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(ac["task_type"], "SEQ_CLS");
    assert_eq!(ac["modules_to_save"], serde_json::json!(["score"]));
    let rows = vec![vec![1, 40, 41, 42, 2], vec![1, 50, 51]];
    let sb = ScoreBatch::new(&rows, 2, &Device::Cpu).unwrap();
    let want: Vec<f32> = sequence_scores(&model, &head, &sb, false)
        .unwrap()
        .to_vec1()
        .unwrap();
    // Without a base: the adapter names none, so the error asks for one.
    let e = load_score_model(&adapter, None, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("pass the base"), "{e}");
    let sm = load_score_model(&adapter, Some(&base_dir), &LoadOptions::default()).unwrap();
    assert!(!sm.model.has_adapters(), "merged on load");
    let got = sm.score_rows(&rows, 8).unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

#[test]
fn every_trainable_tensor_gets_a_gradient() {
    let mut model = random_model(tiny_config(Family::Qwen2), 2, DType::F32, &Device::Cpu).unwrap();
    let vars = rlft_model::trainable::make_trainable(&mut model, |_| true).unwrap();
    let mut head = ScoreHead::normal(64, 0.02, 1, DType::F32, &Device::Cpu).unwrap();
    let hv = head.make_trainable().unwrap();
    let sb = ScoreBatch::new(&[vec![1, 5, 6, 7], vec![1, 8]], 2, &Device::Cpu).unwrap();
    let loss = sequence_scores(&model, &head, &sb, true)
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    assert!(grads.get(hv.as_tensor()).is_some(), "head");
    for (name, v) in &vars {
        // The LM head (tied to the embeddings here) is reached through the embeddings.
        let g = grads.get(v.as_tensor()).unwrap_or_else(|| panic!("{name}"));
        let n = g
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(n > 0.0, "{name}");
    }
}

/// Writes the inputs of `scripts/reference/check_score_model.py` under `RLFT_SCORE_CHECK_DIR`
/// (default `/tmp/rlft-score-check`): per family a base causal-LM HF dir, a reward model saved
/// with [`save_score_model`] (`<fam>-rm`), a SEQ_CLS PEFT adapter with its head
/// (`<fam>-adapter`, non-zero B) and `expected.json` with rlft's sequence scores of each.
#[test]
#[ignore = "writes fixtures for scripts/reference/check_score_model.py"]
fn write_score_check_fixtures() {
    let root = std::env::var("RLFT_SCORE_CHECK_DIR").unwrap_or("/tmp/rlft-score-check".into());
    let root = std::path::Path::new(&root);
    if root.exists() {
        std::fs::remove_dir_all(root).unwrap();
    }
    let text = tiny_text_bundle().unwrap();
    // Row 1 ends with the pad id (= eos), row 2 has it inside.
    let rows: Vec<Vec<u32>> = vec![
        (0..20).map(|i| (i * 37 + 5) % 259 + 3).collect(),
        vec![1, 5, 9, 300, 42, 17, 250, 77, 2],
        vec![1, 60, 2, 61, 62],
    ];
    let mut cases = Vec::new();
    for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
        let fam = format!("{family:?}").to_lowercase();
        let base_dir = root.join(format!("{fam}-base"));
        save_tiny_hf_dir(tiny_config(family), 0, &base_dir).unwrap();
        let base = random_model(tiny_config(family), 0, DType::F32, &Device::Cpu).unwrap();
        let head = ScoreHead::normal(64, 0.3, 11, DType::F32, &Device::Cpu).unwrap();
        let rm_dir = root.join(format!("{fam}-rm"));
        let opts = ExportOptions::default();
        save_score_model(&base, &head, &text, &generation(), 2, &rm_dir, &opts).unwrap();
        let sb = ScoreBatch::new(&rows, 2, &Device::Cpu).unwrap();
        let scores: Vec<f32> = sequence_scores(&base, &head, &sb, false)
            .unwrap()
            .to_vec1()
            .unwrap();
        cases.push(
            serde_json::json!({"name": format!("{fam}-rm"), "kind": "dir",
            "path": rm_dir, "rows": rows, "scores": scores}),
        );
        let mut m = base.clone();
        let lora = LoraConfig {
            r: 4,
            lora_alpha: 8.0,
            target_modules: vec!["all-linear".into()],
            init_lora_weights: false,
            seed: 12,
            ..LoraConfig::default()
        };
        attach_lora(&mut m, &lora).unwrap();
        let adapter_dir = root.join(format!("{fam}-adapter"));
        let base_name = base_dir.to_str().unwrap();
        save_score_adapter(&m, &head, &lora, &adapter_dir, Some(base_name)).unwrap();
        let scores: Vec<f32> = sequence_scores(&m, &head, &sb, false)
            .unwrap()
            .to_vec1()
            .unwrap();
        cases.push(
            serde_json::json!({"name": format!("{fam}-adapter"), "kind": "adapter",
            "path": adapter_dir, "base": base_dir, "pad_token_id": 2, "rows": rows,
            "scores": scores}),
        );
    }
    std::fs::write(
        root.join("expected.json"),
        serde_json::Value::Array(cases).to_string(),
    )
    .unwrap();
    eprintln!("wrote {}", root.display());
}
