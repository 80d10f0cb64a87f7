#!/usr/bin/env bash
# rlft's GPU check: on a machine with an NVIDIA GPU, PyTorch and transformers (TRL optional, or
# carried as wheels by gpu-check-pack.sh), no Rust and no network. One command, bounded in time
# (--budget-s, default 540 s, plus a hard stop 60 s later), results as JSON:
#
#   scripts/gpu-check.sh [--rlft BIN] [--device cuda] [--out FILE] [check.py options...]
#
# (a) rlft's log-probs on tiny random Llama/Qwen2/Qwen3 models against transformers' (f32, 1e-4);
# (b) a Qwen2.5-3B-shaped random bf16 model: generation tokens/s at batch 16 x 128 and GRPO steps
#     in examples/tiny_python_expr/qwen25_3b.toml's shape, rlft vs transformers/TRL, with peaks;
# (c) `rlft plan` against the measured GRPO peak.
# Details: scripts/gpu_check/check.py and docs/gpu.md. `--device cpu` runs the same check with
# the CPU binary and tiny sizes, to test the check itself on a machine without a GPU.
#
# BIN defaults to rlft.xz (unpacked to /tmp) or rlft beside this script (a pack from
# gpu-check-pack.sh), then
# target/release/rlft. FILE defaults to $OUT/gpu-check.json when $OUT is set, else
# ./gpu-check.json. PYTHON picks the interpreter (default python3).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-python3}"
ARGS=("$@")
has() { for x in "${ARGS[@]}"; do [[ "$x" == "$1" ]] && return 0; done; return 1; }

if ! has --rlft; then
  if [[ -f "$HERE/rlft.xz" ]]; then
    # A pack keeps the binary xz-compressed (84 MiB stripped, 12 MiB packed); Python's lzma
    # unpacks it, so the machine needs no xz.
    bin="$(mktemp -d /tmp/rlft-gpu-check-bin.XXXXXX)/rlft"
    "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$HERE/rlft.xz" "$bin"
    chmod +x "$bin"
    ARGS+=(--rlft "$bin")
  elif [[ -x "$HERE/rlft" ]]; then ARGS+=(--rlft "$HERE/rlft")
  else ARGS+=(--rlft "$HERE/../target/release/rlft"); fi
fi
if ! has --out; then ARGS+=(--out "${OUT:+$OUT/}gpu-check.json"); fi
budget=540
for ((i = 0; i < ${#ARGS[@]}; i++)); do
  [[ "${ARGS[$i]}" == --budget-s ]] && budget="${ARGS[$((i + 1))]}"
done

# TRL and what it needs beyond the GPU image (datasets, dill, multiprocess), when carried.
if [[ -d "$HERE/wheels" ]] && ! "$PY" -c "import trl, datasets" 2>/dev/null; then
  site="$(mktemp -d /tmp/rlft-gpu-check-site.XXXXXX)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
    --target "$site" "$HERE"/wheels/*.whl >&2
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
rc=0
timeout -k 10 "$((${budget%.*} + 60))" "$PY" "$HERE/gpu_check/check.py" "${ARGS[@]}" || rc=$?
if [[ -n "${bin:-}" ]]; then rm -rf "$(dirname "$bin")"; fi
if [[ -n "${site:-}" ]]; then rm -rf "$site"; fi
exit "$rc"
