#!/usr/bin/env bash
# Runs the whole test suite: fetches the default model once (cached in ~/.cache/rlft), checks
# formatting and clippy (warnings are errors; the workspace lints in Cargo.toml), builds in
# release mode and runs every crate's tests (the trainers' same-seed tests also on the AVX2 kernels
# and on one and two threads), then checks that the CUDA build still compiles
# (`--features cuda` with the CUDA 13.0 compiler from PyPI; no GPU needed, nothing runs on
# one: docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$(./scripts/fetch-default-model.sh)"
export RLFT_DEFAULT_MODEL="$MODEL"
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace
# The trainers' same-seed and resume tests again, on the other kernel paths: the AVX2 kernels
# (also on an AVX-512 host) on one thread, and two threads. A same-seed run must give the same
# bits whatever the SIMD level and the thread count (docs/testing.md, "Determinism").
for env in "RLFT_AVX512=0 RAYON_NUM_THREADS=1" "RAYON_NUM_THREADS=2"; do
  env $env cargo test --release -p rlft --test online_dpo --test grpo --test online \
    --test dpo --test sft --test reward_model -q
done
(
  eval "$(./scripts/install-cuda.sh)"
  cargo check --release -p rlft-cli --features cuda
)
