#!/usr/bin/env bash
# One benchmark sitting: `rlft bench` runs each case in a fresh process and, right after it, the
# PyTorch/TRL reference's same case (bench/reference/, built once by
# `bash bench/reference/setup.sh`), on a machine with nothing else running; the whole sitting
# holds /tmp/rlft-bench.lock. The JSON result (per case: rlft and reference medians, spreads, peak
# RSS, ratio, warnings; the machine, commit and date) is printed and written to
# $OUT/bench-<UTC time>.json (default OUT=/tmp/rlft-sitting).
#
#   ./scripts/bench-sitting.sh [cases...]   cases: generate fwd_bwd lora adamw ref_pass grpo rloo ppo
#                                           (default all)
#   REPS=5 ROUNDS=2 ./scripts/bench-sitting.sh fwd_bwd lora
#
# ROUNDS (default 3): rlft and the reference alternate that many times per case, each side's
# repetitions pooled (`rlft bench --rounds`), so a slow spell of the host weighs on both sides.
#
# For the table instead of the JSON: target/release/rlft bench [cases...] --against-reference
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rlft-sitting}
REPS=${REPS:-3}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-1}
mkdir -p "$OUT"
flock /tmp/rlft-bench.lock cargo build --release -p rlft-cli
FILE="$OUT/bench-$(date -u +%Y%m%dT%H%M%SZ).json"
flock /tmp/rlft-bench.lock target/release/rlft bench "$@" --reps "$REPS" --warmup "$WARMUP" --rounds "$ROUNDS" \
  --against-reference --json --out "$FILE"
