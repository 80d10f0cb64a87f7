//! What the end-to-end and golden tests share: the tiny model and small arithmetic datasets,
//! one way to run every trainer (`train`), weight comparisons, the online harness (`online`)
//! and golden-file reading (`golden`). Each test binary uses some of it, hence the `dead_code`
//! allowance.
#![allow(dead_code)]

pub mod golden;
pub mod online;
pub mod train;

use std::path::{Path, PathBuf};

use candle_core::Var;
use rlft_model::config::Family;
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config};

/// Named tensors as f32 vectors, in the trainer's order.
pub type Weights = Vec<(String, Vec<f32>)>;

/// The tiny random Qwen2 model (byte-level tokenizer) at `dir/model`, written unless there.
pub fn tiny_model(dir: &Path) -> PathBuf {
    let model = dir.join("model");
    if !model.exists() {
        save_tiny_hf_dir(tiny_config(Family::Qwen2), 1, &model).unwrap();
    }
    model
}

/// Writes `n` rows `{"prompt": "12+7=", <answer_key>: "19"}` to `path` (JSONL).
pub fn write_sums(path: &Path, n: usize, answer_key: &str) {
    let mut s = String::new();
    for i in 0..n {
        let (a, b) = (i * 7 % 23, i * 5 % 17);
        let mut row = serde_json::Map::new();
        row.insert("prompt".into(), format!("{a}+{b}=").into());
        row.insert(answer_key.into(), format!("{}", a + b).into());
        s.push_str(&serde_json::Value::Object(row).to_string());
        s.push('\n');
    }
    std::fs::write(path, s).unwrap();
}

/// Writes `n` preference rows `{"prompt": "12+7=", "chosen": "19", "rejected": "20"}` to `path`
/// (JSONL; the rejected answer is off by 1 to 3), with a `margin` column when asked.
pub fn write_sum_preferences(path: &Path, n: usize, margin: bool) {
    let mut s = String::new();
    for i in 0..n {
        let (a, b) = (i * 7 % 23, i * 5 % 17);
        let mut row = serde_json::json!({
            "prompt": format!("{a}+{b}="),
            "chosen": format!("{}", a + b),
            "rejected": format!("{}", a + b + 1 + i % 3),
        });
        if margin {
            row["margin"] = serde_json::json!((i % 4) as f64 * 0.25);
        }
        s.push_str(&row.to_string());
        s.push('\n');
    }
    std::fs::write(path, s).unwrap();
}

/// The trainable weights of `policy` as f32 vectors, by name (to compare runs bit for bit).
pub fn weights(policy: &rlft::run::Policy) -> Weights {
    var_values(&policy.vars)
}

/// Named variables (a policy's, a critic's) as f32 vectors.
pub fn var_values(vars: &[(String, Var)]) -> Weights {
    vars.iter()
        .map(|(n, v)| {
            let t = v.as_tensor().to_dtype(candle_core::DType::F32).unwrap();
            (n.clone(), t.flatten_all().unwrap().to_vec1().unwrap())
        })
        .collect()
}

/// Panics unless `a` and `b` hold the same named tensors bit for bit (so NaN equals NaN and
/// -0.0 differs from 0.0, which `==` and a max-difference check both miss), naming the first
/// element that differs: what every same-seed and resume test asserts.
pub fn assert_same_bits(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)], what: &str) {
    assert_eq!(
        a.len(),
        b.len(),
        "{what}: {} vs {} tensors",
        a.len(),
        b.len()
    );
    for ((na, x), (nb, y)) in a.iter().zip(b) {
        assert_eq!(na, nb, "{what}: tensor order");
        assert_eq!(
            x.len(),
            y.len(),
            "{what}: {na} has {} vs {} values",
            x.len(),
            y.len()
        );
        if let Some(i) = (0..x.len()).find(|&i| x[i].to_bits() != y[i].to_bits()) {
            panic!("{what}: {na}[{i}] = {:e} vs {:e}", x[i], y[i]);
        }
    }
}

/// Weights within 1e-5, k_proj biases within `bias_tol`: a k_proj bias's gradient is
/// mathematically zero (softmax ignores a per-query constant), so what it gets is rounding
/// noise, and Adam normalises noise into updates of up to ~lr * g / (|g| + eps), of either
/// sign. Any change in summation order (kernels, batch split) moves it, so the only sound bound
/// is Adam's step bound: at most 2 * lr apart per step.
pub fn assert_same_weights(
    wa: &[(String, Vec<f32>)],
    wb: &[(String, Vec<f32>)],
    bias_tol: f32,
    what: &str,
) {
    for ((n, x), (_, y)) in wa.iter().zip(wb) {
        let d = x
            .iter()
            .zip(y)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let limit = if n.contains("k_proj.bias") {
            bias_tol
        } else {
            1e-5
        };
        assert!(d < limit, "{what}: {n}: {d}");
    }
}

/// `N` fresh temporary directories (one per run of a comparison), removed when dropped.
pub fn tempdirs<const N: usize>() -> [tempfile::TempDir; N] {
    std::array::from_fn(|_| tempfile::tempdir().unwrap())
}

/// Asserts that every trained weight is a LoRA adapter's (the base stays frozen).
pub fn assert_lora_only(w: &[(String, Vec<f32>)]) {
    assert!(
        w.iter().all(|(n, _)| n.contains("lora_")),
        "LoRA only: {:?}",
        w.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
}

/// Asserts that the run writing to `output_dir` exported its LoRA adapter (PEFT's layout).
pub fn assert_adapter_exported(output_dir: &Path) {
    let config = output_dir.join("adapter/adapter_config.json");
    assert!(config.exists(), "{} missing", config.display());
}
