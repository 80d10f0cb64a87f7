#!/usr/bin/env bash
# Every trainer for a few steps on the default model (SmolLM2-135M) with fixed seeds; keeps each
# run's metrics.jsonl. A refactoring that must change no metric runs this before and after, in
# one sitting, and compares the two directories:
#
#   scripts/same-metrics.sh /tmp/before ./rlft-before
#   scripts/same-metrics.sh /tmp/after
#   python3 scripts/compare-metrics.py /tmp/before /tmp/after
#
# usage: scripts/same-metrics.sh OUT_DIR [RLFT_BIN]   (RLFT_BIN: target/release/rlft, built if missing)
#        RUNS="grpo ppo" scripts/same-metrics.sh ...     (only these runs)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/same-metrics.sh OUT_DIR [RLFT_BIN]}
BUILT=${CARGO_TARGET_DIR:-./target}/release/rlft
RLFT=${2:-$BUILT}
if [[ $RLFT == "$BUILT" && ! -x $RLFT ]]; then
  cargo build --release -p rlft-cli
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
./scripts/fetch-default-model.sh >/dev/null

DATA=$OUT/data
EX=examples/tiny_python_expr
"$RLFT" data tiny-python-expr --seed 42 --train-size 64 --test-size 8 --output "$DATA/prompts" --overwrite >/dev/null
"$RLFT" data tiny-python-expr --seed 42 --train-size 64 --test-size 8 --preferences --jsonl \
  --output "$DATA/prefs" --overwrite >/dev/null
# SFT on the preference pairs' chosen replies.
python3 - "$DATA/prefs/train.jsonl" "$DATA/sft.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        row = json.loads(line)
        out.write(json.dumps({"messages": row["prompt"] + row["chosen"]}) + "\n")
EOF

# Small shapes, few steps: every code path of each trainer runs, in a few minutes in all.
COMMON=(--set model=smollm2-135m --set seed=3 --set logging_steps=1 --set save_steps=100
  --set 'report_to=["jsonl"]')
ONLINE=(--set "dataset=$DATA/prompts" --set max_steps=3 --set max_completion_length=24
  --set eval_max_prompts=4 --set rollout_batch_size=2 --set num_generations=4
  --set per_device_train_batch_size=4 --set gradient_accumulation_steps=2)
PREFS=(--set "dataset=$DATA/prefs" --set max_steps=3 --set per_device_train_batch_size=4
  --set eval_steps=0)

run() { # NAME COMMAND ARGS...
  local name=$1; shift
  [[ -z ${RUNS:-} || " $RUNS " == *" $name "* ]] || return 0
  echo "== $name"
  "$RLFT" "$@" "${COMMON[@]}" --set "output_dir=$OUT/$name" >"$OUT/$name.log" 2>&1 ||
    { tail -20 "$OUT/$name.log"; exit 1; }
  # Only the metrics are compared: drop the checkpoints and exported models (GBs).
  find "$OUT/$name" -mindepth 1 -maxdepth 1 ! -name metrics.jsonl -exec rm -rf {} +
}

run grpo grpo --config $EX/cpu.toml "${ONLINE[@]}"
run grpo-kl grpo --config $EX/cpu.toml "${ONLINE[@]}" --set beta=0.04 --set loss_type=grpo
run rloo rloo --config $EX/cpu_rloo.toml "${ONLINE[@]}"
run reinforce-baseline grpo --config $EX/cpu_reinforce_baseline.toml "${ONLINE[@]}"
run ppo ppo --config $EX/cpu_ppo.toml "${ONLINE[@]}"
run dynamic-sampling grpo --config $EX/cpu.toml "${ONLINE[@]}" --set dynamic_sampling=true
run online-dpo online-dpo --config $EX/cpu_online_dpo.toml --set "dataset=$DATA/prompts" \
  --set max_steps=3 --set max_new_tokens=24 --set eval_max_prompts=4 --set per_device_train_batch_size=2 \
  --set gradient_accumulation_steps=2
run dpo dpo --config examples/preference/dpo.toml "${PREFS[@]}"
run reward-model reward-model --config examples/preference/rm.toml "${PREFS[@]}"
run sft sft --config examples/sft/sft.toml --set "dataset=$DATA/sft.jsonl" --set max_steps=3 \
  --set eval_size=8 --set eval_steps=2 --set max_length=96
echo "metrics of each run: $OUT/*/metrics.jsonl"
