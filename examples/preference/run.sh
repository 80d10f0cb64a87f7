#!/usr/bin/env bash
# Preferences end to end on the seed task: build preference pairs (synthetic ones, and pairs of
# the base model's own samples labelled by the seed's rule), train a reward model, then (a) DPO
# on the pairs and (b) GRPO with the reward model as its only reward; the seed's rule measures
# the policies before and after. Settings from environment variables:
#
#   ./examples/preference/run.sh
#   STEPS="rm grpo" ./examples/preference/run.sh        # only these steps (data pairs rm score dpo grpo eval)
#   SEED=7 ./examples/preference/run.sh                  # other pairs and prompts
#
#   SEED                  dataset seed (42)
#   PAIRS, PAIR_TEST      preference pairs: train, test (1024, 128)
#   PROMPTS, PROMPT_TEST  GRPO prompts: train, test (PAIRS, 200: the same expressions as the
#                         pairs' train split, so the test prompts are drawn after them)
#   DEVICE                cpu | cuda | cuda:N (cpu)
#   STEPS                 which steps to run (all: data pairs rm score dpo grpo eval)
#   RLFT                  the rlft binary (cargo's target dir/release/rlft, built if missing)
set -euo pipefail
cd "$(dirname "$0")/../.."

SEED=${SEED:-42}
PAIRS=${PAIRS:-1024}
PAIR_TEST=${PAIR_TEST:-128}
PROMPTS=${PROMPTS:-$PAIRS}
PROMPT_TEST=${PROMPT_TEST:-200}
DEVICE=${DEVICE:-cpu}
STEPS=${STEPS:-data pairs rm score dpo grpo eval}
EX=examples/preference
DATA=$EX/data
ART=$EX/artifacts
SYSTEM="You are a careful arithmetic assistant. Solve the expression and respond briefly. Return the final result in the format \\boxed{answer}. Do not add unnecessary explanation."
want() { [[ " $STEPS " == *" $1 "* ]]; }

BUILT=${CARGO_TARGET_DIR:-./target}/release/rlft
RLFT=${RLFT:-$BUILT}
if [[ $RLFT == "$BUILT" && ! -x $RLFT ]]; then
  cargo build --release -p rlft-cli
fi
./scripts/fetch-default-model.sh >/dev/null

if want data; then
  echo "== preference pairs -> $DATA/prefs (DPO, held-out scoring), $DATA/prefs_rm (reward model); prompts -> $DATA/prompts"
  PAIR_ARGS=(--seed "$SEED" --train-size "$PAIRS" --test-size "$PAIR_TEST" --overwrite)
  "$RLFT" data tiny-python-expr --preferences --output "$DATA/prefs" "${PAIR_ARGS[@]}"
  # The reward model is GRPO's only reward: no_answer pairs order a reply without a number
  # below an unboxed right answer, or GRPO collapses to such a reply (README).
  "$RLFT" data tiny-python-expr --preferences --output "$DATA/prefs_rm" "${PAIR_ARGS[@]}" \
    --rejected wrong_number,missing_box,no_answer
  "$RLFT" data tiny-python-expr --output "$DATA/prompts" --seed "$SEED" \
    --train-size "$PROMPTS" --test-size "$PROMPT_TEST" --overwrite
fi

if want pairs; then
  echo "== the base model's own samples, best vs worst under the seed's rule, + $DATA/prefs_rm -> $DATA/prefs_sampled"
  # 8 samples of each train prompt (and of 100 test prompts) as GRPO samples them; prompts
  # whose 8 samples score alike give no pair.
  "$RLFT" data sampled-preferences --config examples/tiny_python_expr/cpu.toml \
    --set "dataset=$DATA/prompts" --set "seed=$SEED" --set eval_max_prompts=100 \
    --include "$DATA/prefs_rm" --output "$DATA/prefs_sampled" --overwrite --device "$DEVICE"
fi

if want rm; then
  echo "== reward model -> $ART/rm"
  "$RLFT" reward-model --config $EX/rm.toml --device "$DEVICE" --set "seed=$SEED"
fi

if want score; then
  echo "== the seed task's held-out pairs ($DATA/prefs, test) scored by the reward model"
  "$RLFT" score --model $ART/rm/final --data "$DATA/prefs" --split test \
    --system-prompt "$SYSTEM" --device "$DEVICE" -o $ART/rm/test_scores.jsonl
fi

if want dpo; then
  echo "== DPO -> $ART/dpo"
  "$RLFT" dpo --config $EX/dpo.toml --device "$DEVICE" --set "seed=$SEED"
fi

if want grpo; then
  echo "== GRPO with the reward model as its reward -> $ART/grpo-rm"
  "$RLFT" grpo --config $EX/grpo_rm.toml --device "$DEVICE" --set "seed=$SEED"
fi

if want eval; then
  # The seed's rule (python_expr_rule), greedy, on every test prompt: before and after.
  RULE=(--config examples/tiny_python_expr/cpu.toml --set "dataset=$DATA/prompts" --device "$DEVICE")
  echo "== rule-scored greedy eval: base model"
  "$RLFT" eval "${RULE[@]}" --output $ART/eval_base.jsonl
  for run in dpo grpo-rm; do
    if [[ -d $ART/$run/final ]]; then
      echo "== rule-scored greedy eval: after $run"
      "$RLFT" eval "${RULE[@]}" --model $ART/$run/final --output "$ART/eval_${run//-/_}.jsonl"
    fi
  done
fi
