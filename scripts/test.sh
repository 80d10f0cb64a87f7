#!/usr/bin/env bash
# Runs the whole test suite: fetches the default model once (cached in ~/.cache/rlft), checks
# formatting and clippy (warnings are errors; the workspace lints in Cargo.toml), builds in
# release mode and runs every crate's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$(./scripts/fetch-default-model.sh)"
export RLFT_DEFAULT_MODEL="$MODEL"
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace
