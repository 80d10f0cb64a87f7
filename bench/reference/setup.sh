#!/usr/bin/env bash
# Builds the PyTorch + transformers + TRL reference that `rlft bench --against-reference` measures
# rlft against (bench.py, grpo.py). Idempotent: every stage is skipped when its output is there.
#
#   bash bench/reference/setup.sh
#
# What it makes, under $RLFT_CACHE (default ~/.cache/rlft), where `rlft bench` looks:
#   reference/venv/                     Python venv: requirements.txt, every dependency pinned by
#                                       constraints.txt (the versions the published ratios used)
#   reference/smollm2-135m-instruct-hf/ float32 safetensors + config + tokenizer, dequantised
#                                       from the default model's GGUF
#   models/smollm2-135m-instruct/       the GGUF itself (scripts/fetch-default-model.sh)
#
# torch: the CPU wheel from RLFT_TORCH_INDEX (default https://download.pytorch.org/whl/cpu) when
# that index answers, else PyPI's build (it carries CUDA libraries: about 4 GB more on disk; its
# CPU speed is the same).
#
# Downloads run without the lock; installing and converting (CPU-heavy) hold
# $RLFT_BENCH_LOCK (default /tmp/rlft-bench.lock), as every heavy job on a shared machine does.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${RLFT_CACHE:-$HOME/.cache/rlft}"
REF="$CACHE/reference"
VENV="$REF/venv"
PY="$VENV/bin/python"
MODEL_DIR="$REF/smollm2-135m-instruct-hf"
LOCK="${RLFT_BENCH_LOCK:-/tmp/rlft-bench.lock}"
TORCH_INDEX="${RLFT_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
PINS=(-c "$HERE/constraints.txt")

locked() {
  if command -v flock >/dev/null; then flock "$LOCK" "$@"; else "$@"; fi
}

# A stamp of the pin files: the venv is rebuilt to new pins when they change.
stamp() { cat "$HERE/requirements.txt" "$HERE/constraints.txt" | sha256sum | cut -d' ' -f1; }

mkdir -p "$REF"

# 1. The venv.
if [ -x "$PY" ] && [ "$(cat "$VENV/.pins" 2>/dev/null)" = "$(stamp)" ]; then
  echo "venv: $VENV (up to date)"
else
  BASE_PY="$(command -v python3 || true)"
  if [ -z "$BASE_PY" ]; then
    echo "error: python3 (3.10 or newer, with the venv module) is needed" >&2
    exit 1
  fi
  [ -x "$PY" ] || "$BASE_PY" -m venv "$VENV"
  WHEELS="$REF/wheels"
  mkdir -p "$WHEELS"
  TORCH_FROM=()
  if "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=15)" \
      "$TORCH_INDEX" 2>/dev/null; then
    echo "torch: CPU wheel from $TORCH_INDEX"
    TORCH_FROM=(--index-url "$TORCH_INDEX")
  else
    echo "torch: $TORCH_INDEX does not answer; taking PyPI's torch (with its CUDA libraries)"
  fi
  echo "downloading wheels into $WHEELS ..."
  "$PY" -m pip download --quiet --dest "$WHEELS" "${PINS[@]}" "${TORCH_FROM[@]}" torch
  "$PY" -m pip download --quiet --dest "$WHEELS" --find-links "$WHEELS" "${PINS[@]}" \
    -r "$HERE/requirements.txt"
  echo "installing (holding $LOCK) ..."
  locked "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" "${PINS[@]}" \
    -r "$HERE/requirements.txt"
  rm -rf "$WHEELS"
  stamp > "$VENV/.pins"
fi
"$PY" - <<'EOF'
from importlib.metadata import version
names = ["torch", "transformers", "trl", "peft", "datasets", "accelerate", "gguf"]
print("versions: " + ", ".join(f"{n} {version(n)}" for n in names))
EOF

# 2. The default model's GGUF (the file rlft itself runs).
GGUF="$("$REPO/scripts/fetch-default-model.sh")"

# 3. Its float32 HF directory, written beside and renamed into place when complete.
if [ -f "$MODEL_DIR/model.safetensors" ]; then
  echo "model: $MODEL_DIR (already converted)"
else
  rm -rf "$MODEL_DIR.partial"
  locked env OMP_NUM_THREADS=2 "$PY" "$HERE/convert_gguf.py" "$GGUF" "$MODEL_DIR.partial"
  mv "$MODEL_DIR.partial" "$MODEL_DIR"
fi

du -sh "$VENV" "$MODEL_DIR" | sed 's/^/disk: /'
echo "ready: ./target/release/rlft bench --against-reference  (finds $REF by itself)"
