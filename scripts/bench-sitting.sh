#!/usr/bin/env bash
# One benchmark sitting: rlft and the PyTorch/TRL reference (../shared/bench/trl_cpu, built by its
# setup.sh) case by case, interleaved, on a machine with nothing else running. Each timed run
# holds /tmp/rlft-bench.lock. Results (raw outputs) go to $OUT (default /tmp/rlft-sitting).
#
#   ./scripts/bench-sitting.sh [cases...]     cases: fwd_bwd lora adamw grpo generate (default all)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rlft-sitting}
REF=${REF:-../shared/bench/trl_cpu}
PY=${PY:-$HOME/.cache/rlft-baseline/venv/bin/python}
REPS=${REPS:-3}
mkdir -p "$OUT"
./scripts/fetch-default-model.sh >/dev/null
export RLFT_DEFAULT_MODEL=${RLFT_DEFAULT_MODEL:-$(./scripts/fetch-default-model.sh)}
flock /tmp/rlft-bench.lock cargo build --release -p rlft-cli -p rlft-model --example fwd_bwd_bench \
  -p rlft-train --example adamw_bench
CASES=${*:-fwd_bwd lora adamw grpo generate}
for c in $CASES; do
  echo "== $c"
  case $c in
    fwd_bwd)
      flock /tmp/rlft-bench.lock target/release/examples/fwd_bwd_bench --reps "$REPS" | tee "$OUT/rlft_fwd_bwd.txt"
      "$PY" "$REF/bench.py" --cases fwd_bwd --reps "$REPS" --out "$OUT/ref_fwd_bwd.json" >/dev/null ;;
    lora)
      flock /tmp/rlft-bench.lock target/release/examples/fwd_bwd_bench --lora all-linear --rank 16 --reps "$REPS" | tee "$OUT/rlft_lora.txt"
      "$PY" "$REF/bench.py" --cases lora --reps "$REPS" --out "$OUT/ref_lora.json" >/dev/null ;;
    adamw)
      flock /tmp/rlft-bench.lock target/release/examples/adamw_bench --fused-only | tee "$OUT/rlft_adamw.txt"
      "$PY" "$REF/bench.py" --cases adamw --reps 5 --out "$OUT/ref_adamw.json" >/dev/null ;;
    grpo)
      flock /tmp/rlft-bench.lock target/release/rlft bench grpo --reps 5 --against-reference --json | tee "$OUT/grpo.json" ;;
    generate)
      flock /tmp/rlft-bench.lock target/release/rlft bench generate --against-reference --json | tee "$OUT/generate.json" ;;
    *) echo "unknown case $c" >&2; exit 2 ;;
  esac
done
echo "raw results in $OUT"
