//! Helpers shared by the integration tests that use the default model.

use std::sync::OnceLock;

use serde_json::Value;

#[path = "../../../../tests/fixtures.rs"]
mod fixtures;

pub use fixtures::default_model as default_model_path;

/// `tests/fixtures/smollm2/golden.json` (transformers' values for the default model).
pub fn golden() -> &'static Value {
    static G: OnceLock<Value> = OnceLock::new();
    G.get_or_init(|| {
        let text = fixtures::read_fixture(fixtures::SMOLLM2_GOLDEN);
        serde_json::from_str(&text).expect("golden.json is JSON")
    })
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}
