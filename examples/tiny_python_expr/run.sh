#!/usr/bin/env bash
# tiny_python_expr end to end: build the dataset, train with GRPO, write the report.
# Every setting comes from an environment variable (defaults: the CPU run on the built-in
# qwen2.5-coder-0.5b with LoRA, 8-13 minutes of training on 2 cores, scored before and
# after on held-out prompts of another seed). Examples:
#
#   ./examples/tiny_python_expr/run.sh
#   MAX_STEPS=10 ./examples/tiny_python_expr/run.sh                      # a quick look
#   SKIP_DATASET_BUILD=1 RUN_NAME=lr1e-4 LEARNING_RATE=1e-4 ./examples/tiny_python_expr/run.sh
#   CONFIG=examples/tiny_python_expr/config.toml MODEL=/models/Qwen2.5-0.5B-Instruct ./examples/tiny_python_expr/run.sh
#
# Settings (empty = the config file's value):
#   ALGO                  grpo | rloo | ppo | online-dpo   (grpo; the command that trains)
#   CONFIG                config file        (examples/tiny_python_expr/cpu.toml; with ALGO=rloo
#                         cpu_rloo.toml, ALGO=ppo cpu_ppo.toml, ALGO=online-dpo
#                         cpu_online_dpo.toml; cpu_reinforce_baseline.toml is a grpo config)
#   MODEL                 HF dir, .gguf or a built-in name (qwen2.5-coder-0.5b, smollm2-135m)
#   DATA_DIR              dataset directory  (examples/tiny_python_expr/data/tiny_python_expr)
#   ARTIFACTS_DIR         runs go here       (examples/tiny_python_expr/artifacts)
#   RUN_NAME              run directory name (cpu-default)
#   SEED, TRAIN_SIZE, TEST_SIZE              dataset (42, 512, 32) and training seed
#   EVAL_SEED, EVAL_SIZE  the held-out eval set: EVAL_SIZE prompts of seed EVAL_SEED (7, 300),
#                         less any expression of the training dataset (DATA_DIR-heldout)
#   SKIP_DATASET_BUILD=1  reuse DATA_DIR instead of building it
#   MAX_STEPS, NUM_GENERATIONS, ROLLOUT_BATCH_SIZE, LEARNING_RATE, BETA, TEMPERATURE,
#   MAX_COMPLETION_LENGTH, EVAL_MAX_COMPLETION_LENGTH, USE_PEFT, LORA_R, EVAL_STEPS, SAVE_STEPS
#                         training overrides
#   DEVICE                cpu | cuda | cuda:N (cpu)
#   RESUME=1              continue the run from its latest checkpoint
#   EXTRA_ARGS            more `rlft grpo` arguments, e.g. "--set top_p=0.95"
set -euo pipefail
cd "$(dirname "$0")/../.."

ALGO=${ALGO:-grpo}
case "$ALGO" in
  grpo) CONFIG=${CONFIG:-examples/tiny_python_expr/cpu.toml} ;;
  rloo | ppo) CONFIG=${CONFIG:-examples/tiny_python_expr/cpu_$ALGO.toml} ;;
  online-dpo) CONFIG=${CONFIG:-examples/tiny_python_expr/cpu_online_dpo.toml} ;;
  *) echo "error: ALGO=$ALGO; use grpo, rloo, ppo or online-dpo" >&2; exit 2 ;;
esac
MODEL=${MODEL:-}
DATA_DIR=${DATA_DIR:-examples/tiny_python_expr/data/tiny_python_expr}
ARTIFACTS_DIR=${ARTIFACTS_DIR:-examples/tiny_python_expr/artifacts}
RUN_NAME=${RUN_NAME:-cpu-default}
SEED=${SEED:-42}
TRAIN_SIZE=${TRAIN_SIZE:-512}
TEST_SIZE=${TEST_SIZE:-32}
EVAL_SEED=${EVAL_SEED:-7}
EVAL_SIZE=${EVAL_SIZE:-300}
EVAL_DIR="$DATA_DIR-heldout"
SKIP_DATASET_BUILD=${SKIP_DATASET_BUILD:-0}
DEVICE=${DEVICE:-cpu}
RESUME=${RESUME:-0}
OUT="$ARTIFACTS_DIR/$RUN_NAME"

if [[ "$SKIP_DATASET_BUILD" == 1 && ! -f "$DATA_DIR/dataset_dict.json" ]]; then
  echo "error: SKIP_DATASET_BUILD=1 but $DATA_DIR holds no dataset (no dataset_dict.json)." >&2
  echo "Build it once with:" >&2
  echo "  ./target/release/rlft data tiny-python-expr --output $DATA_DIR --seed $SEED --train-size $TRAIN_SIZE --test-size $TEST_SIZE" >&2
  echo "or run without SKIP_DATASET_BUILD=1 (or point DATA_DIR at an existing one)." >&2
  exit 2
fi

echo "== build"
if [[ "$DEVICE" == cuda* ]]; then
  cargo build --release -p rlft-cli --features cuda
else
  cargo build --release -p rlft-cli
fi
RLFT=${CARGO_TARGET_DIR:-./target}/release/rlft   # where cargo put it
# A built-in model name (the config's `model`, or MODEL) is fetched by the trainer on first use
# (`rlft fetch-model NAME`; docs/models.md), checked by sha256 and cached in ~/.cache/rlft.

if [[ "$SKIP_DATASET_BUILD" == 1 ]]; then
  echo "== dataset: reusing $DATA_DIR"
else
  echo "== dataset -> $DATA_DIR"
  "$RLFT" data tiny-python-expr --output "$DATA_DIR" --seed "$SEED" \
    --train-size "$TRAIN_SIZE" --test-size "$TEST_SIZE" --overwrite
fi
if [[ "$SKIP_DATASET_BUILD" != 1 || ! -f "$EVAL_DIR/dataset_dict.json" ]]; then
  echo "== held-out eval prompts -> $EVAL_DIR"
  "$RLFT" data tiny-python-expr --output "$EVAL_DIR" --seed "$EVAL_SEED" --train-size 0 \
    --test-size "$EVAL_SIZE" --exclude "$DATA_DIR" --overwrite
fi

SETS=(--set "dataset=$DATA_DIR" --set "eval_dataset=$EVAL_DIR" --set "output_dir=$OUT" --set "seed=$SEED")
add() { if [[ -n "${2:-}" ]]; then SETS+=(--set "$1=$2"); fi; }
add model "$MODEL"
add max_steps "${MAX_STEPS:-}"
add num_generations "${NUM_GENERATIONS:-}"
add rollout_batch_size "${ROLLOUT_BATCH_SIZE:-}"
add learning_rate "${LEARNING_RATE:-}"
add beta "${BETA:-}"
add temperature "${TEMPERATURE:-}"
add max_completion_length "${MAX_COMPLETION_LENGTH:-}"
add eval_max_completion_length "${EVAL_MAX_COMPLETION_LENGTH:-}"
add use_peft "${USE_PEFT:-}"
add lora.r "${LORA_R:-}"
add eval_steps "${EVAL_STEPS:-}"
add save_steps "${SAVE_STEPS:-}"
RESUME_ARG=()
if [[ "$RESUME" == 1 ]]; then RESUME_ARG=(--resume); fi

echo "== train -> $OUT"
# shellcheck disable=SC2086
"$RLFT" "$ALGO" --config "$CONFIG" --device "$DEVICE" "${SETS[@]}" "${RESUME_ARG[@]}" ${EXTRA_ARGS:-}

# The trainer writes the report at the end ($OUT/report/); `rlft report $OUT` redraws it any time.
# The result in one block: the held-out eval before and after, wall time and peak memory.
python3 - "$OUT/run_summary.json" <<'PY' || true
import json, sys
s = json.load(open(sys.argv[1]))
before, after = s.get("eval_initial") or {}, s.get("eval_final") or {}
print("== result (greedy, held-out eval prompts)")
for key in sorted(after):
    if key == "eval/reward" or key.endswith(("/format/mean", "/accuracy/mean")):
        name = key.removeprefix("eval/").removesuffix("/mean")
        print(f"  {name:<36} {before.get(key, float('nan')):.3f} -> {after[key]:.3f}")
print(f"  wall time {s.get('wall_time_s', 0):.0f} s, peak RSS {s.get('peak_rss_mib') or 0:.0f} MiB")
PY
