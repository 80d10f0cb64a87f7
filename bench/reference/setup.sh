#!/usr/bin/env bash
# Builds the PyTorch + transformers + TRL reference that `rlft bench --against-reference` measures
# rlft against (bench.py, grpo.py). Idempotent: every stage is skipped when its output is there.
#
#   bash bench/reference/setup.sh [MODEL]
#
# MODEL: what `rlft bench --model` is given: the default model when left out (or `default`,
# `smollm2-135m`); another built-in name (`qwen2.5-coder-0.5b`), whose GGUF `rlft fetch-model`
# fetches ($RLFT, default target/release/rlft, must be built); or a GGUF path.
#
# What it makes, under $RLFT_CACHE (default ~/.cache/rlft), where `rlft bench` looks:
#   reference/venv/                     Python venv: requirements.txt, every dependency pinned by
#                                       constraints.txt (the versions the published ratios used)
#   reference/smollm2-135m-instruct-hf/ float32 safetensors + config + tokenizer, dequantised
#                                       from the default model's GGUF (convert_gguf.py); another
#                                       built-in model's goes to reference/<its cache dir>-hf
#                                       (qwen2.5-coder-0.5b-instruct-hf, 2.5 GB), a GGUF path's
#                                       to reference/<file stem>-hf
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
MODEL="${1:-default}"
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

# 2. The model's GGUF (the file rlft itself runs), and where its HF copy goes: the name
#    `rlft bench` derives from --model (crates/rlft-cli/src/bench/reference.rs, default_model_dir).
case "$(echo "$MODEL" | tr '[:upper:]' '[:lower:]')" in
  default|smollm2-135m)
    GGUF="$("$REPO/scripts/fetch-default-model.sh")"
    MODEL_DIR="$REF/$(basename "$(dirname "$GGUF")")-hf"
    ;;
  *)
    if [ -f "$MODEL" ]; then
      GGUF="$MODEL"
      MODEL_DIR="$REF/$(basename "$GGUF" .gguf)-hf"
    else
      RLFT="${RLFT:-$REPO/target/release/rlft}"
      if [ ! -x "$RLFT" ]; then
        echo "error: $MODEL is not a file, and fetching a built-in model takes rlft: build it" \
          "(cargo build --release) or set RLFT=/path/to/rlft" >&2
        exit 1
      fi
      GGUF="$("$RLFT" fetch-model "$MODEL")"
      MODEL_DIR="$REF/$(basename "$(dirname "$GGUF")")-hf"
    fi
    ;;
esac

# 3. Its float32 HF directory, written beside and renamed into place when complete.
if [ -f "$MODEL_DIR/config.json" ]; then  # written whole, then renamed into place
  echo "model: $MODEL_DIR (already converted)"
else
  rm -rf "$MODEL_DIR.partial"
  locked env OMP_NUM_THREADS=2 "$PY" "$HERE/convert_gguf.py" "$GGUF" "$MODEL_DIR.partial"
  mv "$MODEL_DIR.partial" "$MODEL_DIR"
fi

du -sh "$VENV" "$MODEL_DIR" | sed 's/^/disk: /'
if [ "$MODEL" = default ]; then
  echo "ready: ./target/release/rlft bench --against-reference  (finds $REF by itself)"
else
  echo "ready: ./target/release/rlft bench --model $MODEL --against-reference  (finds $MODEL_DIR by itself)"
fi
