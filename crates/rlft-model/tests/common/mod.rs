//! Helpers shared by the integration tests that use the default model.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

/// The workspace root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The default model's GGUF: `RLFT_DEFAULT_MODEL`, or fetched once by
/// `scripts/fetch-default-model.sh` into `~/.cache/rlft/models/`.
pub fn default_model_path() -> PathBuf {
    if let Ok(p) = std::env::var("RLFT_DEFAULT_MODEL") {
        return PathBuf::from(p);
    }
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/fetch-default-model.sh"))
        .output()
        .expect("run scripts/fetch-default-model.sh");
    assert!(
        out.status.success(),
        "fetching the default model failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// `../shared/fixtures/smollm2/golden.json` (transformers' values for the default model).
pub fn golden() -> &'static Value {
    static G: OnceLock<Value> = OnceLock::new();
    G.get_or_init(|| {
        let p = repo_root().join("../shared/fixtures/smollm2/golden.json");
        serde_json::from_str(&std::fs::read_to_string(&p).expect("golden.json")).unwrap()
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
