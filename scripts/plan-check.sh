#!/usr/bin/env bash
# Predicted (`rlft plan`) vs measured peak RSS of short runs on the default model: prints the
# markdown table of docs/memory.md. Each case: `rlft plan --json`, then the run itself (2
# optimiser steps) under /usr/bin/time (max RSS = the process's VmHWM).
#
#   scripts/plan-check.sh [CASE...]     cases: grpo-lora grpo-full grpo-lora-unshared
#                                       grpo-lora-unshared-72 grpo-lora-bf16 sft-lora sft-full
#                                       sft-lora-ckpt grpo-lora-unshared-ckpt ppo-lora rloo-lora
#                                       dpo-lora rm-lora online-dpo-lora grpo-rm-lora
#                                       (default: all; grpo-rm-lora scores with rm-lora's model)
#
# Build first (cargo build --release). On a shared machine run it under
# `flock /tmp/rlft-bench.lock`. Work files go to $WORK (default /tmp/rlft-plan-check).
set -euo pipefail
cd "$(dirname "$0")/.."
RLFT=${RLFT:-./target/release/rlft}
WORK=${WORK:-/tmp/rlft-plan-check}
mkdir -p "$WORK"
CASES=("$@")
if [ ${#CASES[@]} -eq 0 ]; then
  CASES=(grpo-lora grpo-full grpo-lora-unshared grpo-lora-unshared-72 grpo-lora-bf16 sft-lora
    sft-full sft-lora-ckpt grpo-lora-unshared-ckpt ppo-lora rloo-lora dpo-lora rm-lora
    online-dpo-lora grpo-rm-lora)
fi

"$RLFT" fetch-model >/dev/null
if [ ! -f "$WORK/tpe/dataset_dict.json" ]; then
  "$RLFT" data tiny-python-expr --output "$WORK/tpe" --overwrite >/dev/null 2>&1
fi
if [ ! -f "$WORK/prefs/dataset_dict.json" ]; then
  "$RLFT" data tiny-python-expr --preferences --output "$WORK/prefs" --overwrite >/dev/null 2>&1
fi
# SFT rows of ~600 tokens, all truncated to max_length 256: every micro-batch is 8 x 256.
if [ ! -f "$WORK/sft.jsonl" ]; then
  for i in $(seq 0 63); do
    start=$(( i * 7 % 50 ))
    comp=$(seq -s ' ' "$start" $(( start + 399 )))
    printf '{"prompt": "Count upwards from %d, one number at a time.", "completion": "%s"}\n' \
      "$start" "$comp"
  done > "$WORK/sft.jsonl"
fi

GRPO=(examples/tiny_python_expr/cpu.toml --set model=smollm2-135m --set max_steps=2 --set "dataset=$WORK/tpe")
PPO=(examples/tiny_python_expr/cpu_ppo.toml --set max_steps=2 --set "dataset=$WORK/tpe")
RLOO=(examples/tiny_python_expr/cpu_rloo.toml --set max_steps=2 --set "dataset=$WORK/tpe")
DPO=(examples/tiny_python_expr/cpu_dpo.toml --set max_steps=2 --set "dataset=$WORK/prefs")
RM=(examples/preference/rm.toml --set max_steps=2 --set "dataset=$WORK/prefs")
ODPO=(examples/tiny_python_expr/cpu_online_dpo.toml --set max_steps=2 --set "dataset=$WORK/tpe")
# GRPO scored by the reward model the rm-lora case trains (its path set in a copy of the config).
sed "s|^path = .*|path = \"$WORK/out-rm-lora/final\"|" examples/preference/grpo_rm.toml \
  > "$WORK/grpo_rm.toml"
GRPO_RM=("$WORK/grpo_rm.toml" --set max_steps=2 --set "dataset=$WORK/tpe")
SFT=(examples/sft/sft.toml --set max_steps=2 --set "dataset=$WORK/sft.jsonl")

args() {
  case "$1" in
    grpo-lora) echo grpo; printf '%s\n' "${GRPO[@]}" ;;
    grpo-full) echo grpo; printf '%s\n' "${GRPO[@]}" --set use_peft=false --set beta=0.04 \
      --set learning_rate=1e-6 ;;
    grpo-lora-unshared) echo grpo; printf '%s\n' "${GRPO[@]}" --set share_prompts=false ;;
    # Every prompt truncated to 72 tokens: each micro-batch has the planned (longest) shape.
    grpo-lora-unshared-72) echo grpo; printf '%s\n' "${GRPO[@]}" --set share_prompts=false \
      --set max_prompt_length=72 --set prompt_truncation=truncate ;;
    grpo-lora-bf16) echo grpo; printf '%s\n' "${GRPO[@]}" --set bf16=true \
      --set eval_max_prompts=16 ;;
    sft-lora) echo sft; printf '%s\n' "${SFT[@]}" ;;
    sft-full) echo sft; printf '%s\n' "${SFT[@]}" --set use_peft=false \
      --set learning_rate=1e-5 ;;
    sft-lora-ckpt) echo sft; printf '%s\n' "${SFT[@]}" --set gradient_checkpointing=true ;;
    grpo-lora-unshared-ckpt) echo grpo; printf '%s\n' "${GRPO[@]}" --set share_prompts=false \
      --set gradient_checkpointing=true ;;
    # PPO's critic (its own LoRA adapters on a second copy of the model), kl_coef 0.
    ppo-lora) echo ppo; printf '%s\n' "${PPO[@]}" ;;
    # RLOO with TRL's beta 0.05: the KL in the reward, so old and reference log-prob passes.
    rloo-lora) echo rloo; printf '%s\n' "${RLOO[@]}" --set beta=0.05 ;;
    # DPO with LoRA: 8 pairs per micro-batch, each prompt run once for both sides.
    dpo-lora) echo dpo; printf '%s\n' "${DPO[@]}" ;;
    # A reward model (LoRA + score head): 8 pairs = 16 sequences per micro-batch.
    rm-lora) echo reward-model; printf '%s\n' "${RM[@]}" ;;
    # Online DPO: 8 prompts x 2 completions per micro-batch, a reference pass.
    online-dpo-lora) echo online-dpo; printf '%s\n' "${ODPO[@]}" ;;
    # A reward model as a reward: its weights and scoring pass beside GRPO's LoRA policy.
    grpo-rm-lora) echo grpo; printf '%s\n' "${GRPO_RM[@]}" ;;
    *) echo "unknown case $1" >&2; exit 2 ;;
  esac
}

echo "| case | predicted MiB (phase) | measured MiB | error |"
echo "|---|---|---|---|"
for c in "${CASES[@]}"; do
  mapfile -t a < <(args "$c")
  trainer=${a[0]}
  cfg=("${a[@]:1}")
  out="$WORK/out-$c"
  rm -rf "$out"
  plan=$("$RLFT" plan "$trainer" --config "${cfg[@]}" --set "output_dir=$out" --json)
  pred=$(printf '%s' "$plan" | python3 -c 'import json,sys; v=json.load(sys.stdin); print("%.0f %s" % (v["total_mib"], v["plan"]["peak_phase"]))')
  /usr/bin/time -f "%M" -o "$WORK/$c.time" \
    "$RLFT" "$trainer" --config "${cfg[@]}" --set "output_dir=$out" >"$WORK/$c.out" 2>"$WORK/$c.err"
  meas=$(( $(tail -1 "$WORK/$c.time") / 1024 ))
  read -r p phase <<<"$pred"
  err=$(python3 -c "print('%+.1f%%' % (($p - $meas) / $meas * 100))")
  echo "| $c | $p ($phase) | $meas | $err |"
done
