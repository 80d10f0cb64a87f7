#!/usr/bin/env bash
# Runs the whole test suite: fetches the default model once (cached in ~/.cache/rlft), builds in
# release mode, runs every crate's tests, and checks formatting.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$(./scripts/fetch-default-model.sh)"
export RLFT_DEFAULT_MODEL="$MODEL"
cargo fmt --all -- --check
cargo test --release --workspace
