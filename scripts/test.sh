#!/usr/bin/env bash
# Runs the whole test suite: fetches the default model once (cached in ~/.cache/rlft), checks
# formatting and clippy (warnings are errors; the workspace lints in Cargo.toml), builds in
# release mode and runs every crate's tests, then checks that the CUDA build still compiles
# (`--features cuda` with the CUDA 13.0 compiler from PyPI; no GPU needed, nothing runs on
# one: docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$(./scripts/fetch-default-model.sh)"
export RLFT_DEFAULT_MODEL="$MODEL"
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace
(
  eval "$(./scripts/install-cuda.sh)"
  cargo check --release -p rlft-cli --features cuda
)
