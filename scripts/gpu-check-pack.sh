#!/usr/bin/env bash
# Builds the stripped `--features cuda` rlft binary and packs it with the GPU check into one
# directory of at most 64 MiB, to copy to a GPU machine that has no Rust and no network:
#
#   scripts/gpu-check-pack.sh [DIR]        # default DIR: target/gpu-pack
#   # on the GPU machine:
#   DIR/gpu-check.sh --out /tmp/gpu-check.json
#
# The pack (13 MiB): rlft.xz (the stripped cuda build, xz-compressed; gpu-check.sh unpacks it),
# gpu-check.sh, gpu_check/ (check.py and its helpers, plus bench/reference's bench.py, grpo.py
# and measure.py under gpu_check/reference/),
# examples/tiny_python_expr/qwen25_3b.toml, and wheels/ with TRL and what it needs beyond the
# GPU image (datasets, dill, multiprocess; Python 3.12 wheels from PyPI, the versions of the
# reference venv). SKIP_BUILD=1 packs the binary already at target/release/rlft;
# SKIP_WHEELS=1 packs no wheels (TRL's side is then skipped unless TRL is there).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-target/gpu-pack}"
LIMIT_MIB=64
WHEELS=("trl==1.16.0" "datasets==5.2.0" "dill==0.4.1" "multiprocess==0.70.19")

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  eval "$(scripts/install-cuda.sh)"
  cargo build --release -p rlft-cli --features cuda
fi
bin=target/release/rlft
if ! readelf -d "$bin" | grep -q 'libcuda.so.1'; then
  echo "error: $bin is not a --features cuda build (it does not link libcuda.so.1)" >&2
  exit 1
fi

rm -rf "$DEST"
mkdir -p "$DEST/gpu_check/reference" "$DEST/examples/tiny_python_expr"
strip -o "$DEST/rlft" "$bin"
# 84 MiB stripped (candle's kernels for every GGUF type are in it): xz makes it about 12 MiB.
xz -T2 -6 "$DEST/rlft"
cp scripts/gpu-check.sh "$DEST/"
cp scripts/gpu_check/*.py "$DEST/gpu_check/"
cp bench/reference/{bench,grpo,measure}.py "$DEST/gpu_check/reference/"
cp examples/tiny_python_expr/qwen25_3b.toml "$DEST/examples/tiny_python_expr/"
if [[ "${SKIP_WHEELS:-0}" != 1 ]]; then
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$DEST/wheels" "${WHEELS[@]}"
fi

mib=$(( $(du -sb "$DEST" | cut -f1) >> 20 ))
if (( mib > LIMIT_MIB )); then
  echo "error: the pack is $mib MiB, over $LIMIT_MIB MiB" >&2
  exit 1
fi
echo "packed $DEST ($mib MiB): run $DEST/gpu-check.sh on the GPU machine" >&2
