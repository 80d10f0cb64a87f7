//! Reading the golden files of `tests/data/` (each made by a script in `scripts/reference/`)
//! and turning their numbers into tensors and back.

use candle_core::{DType, Device, Tensor};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The golden file `tests/data/{name}`, parsed as `T` (a typed layout or a `serde_json::Value`).
pub fn load<T: DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// A JSON array of numbers.
pub fn vec1(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// A JSON array of arrays of numbers (ragged rows).
pub fn rows(v: &Value) -> Vec<Vec<f64>> {
    v.as_array().unwrap().iter().map(vec1).collect()
}

/// Ragged rows padded with zeros to `[N, T]` with their mask, in `dtype`.
pub fn padded(rows: &[Vec<f64>], dtype: DType) -> (Tensor, Tensor) {
    let t = rows.iter().map(Vec::len).max().unwrap();
    let (mut x, mut m) = (Vec::new(), Vec::new());
    for r in rows {
        for j in 0..t {
            x.push(r.get(j).copied().unwrap_or(0.0));
            m.push(if j < r.len() { 1.0 } else { 0.0 });
        }
    }
    let f = |v: Vec<f64>| {
        Tensor::from_vec(v, (rows.len(), t), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    (f(x), f(m))
}

/// A vector tensor of any float dtype as f64s.
pub fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec1().unwrap()
}

/// A scalar tensor (a loss) of any float dtype as an f64.
pub fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar().unwrap()
}

/// A matrix tensor (a gradient) of any float dtype as f64 rows.
pub fn f64_rows(t: &Tensor) -> Vec<Vec<f64>> {
    t.to_dtype(DType::F64).unwrap().to_vec2().unwrap()
}
