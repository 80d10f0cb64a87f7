//! What the trainers' end-to-end tests share: small arithmetic datasets (each test binary
//! uses some of them, hence the `dead_code` allowances).

pub mod online;

use std::path::Path;

/// Writes `n` rows `{"prompt": "12+7=", <answer_key>: "19"}` to `path` (JSONL).
#[allow(dead_code)]
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

/// The trainable weights of `policy` as f32 vectors, by name (to compare runs bit for bit).
pub fn weights(policy: &rlft::run::Policy) -> Vec<(String, Vec<f32>)> {
    policy
        .vars
        .iter()
        .map(|(n, v)| {
            let t = v.as_tensor().to_dtype(candle_core::DType::F32).unwrap();
            (n.clone(), t.flatten_all().unwrap().to_vec1().unwrap())
        })
        .collect()
}

/// Panics unless `a` and `b` hold the same named tensors bit for bit (so NaN equals NaN and
/// -0.0 differs from 0.0, which `==` and a max-difference check both miss), naming the first
/// element that differs: what every same-seed and resume test asserts.
#[allow(dead_code)]
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

/// Writes `n` preference rows `{"prompt": "12+7=", "chosen": "19", "rejected": "20"}` to `path`
/// (JSONL; the rejected answer is off by 1 to 3), with a `margin` column when asked.
#[allow(dead_code)]
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
