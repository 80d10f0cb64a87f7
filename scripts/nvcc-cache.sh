#!/bin/sh
# nvcc with a cache, for candle-kernels' build (cudaforge runs $NVCC). install-cuda.sh copies
# this file next to nvcc (cudaforge takes the CUDA root from $NVCC's location) and sets NVCC.
#
# - Object files (`-c -o X.o`): through ccache, which caches them by the preprocessed source.
# - PTX (`--ptx --output-directory DIR ... SRC.cu`), which ccache does not cache: here, under
#   ~/.cache/rlft/nvcc-ptx/, keyed by nvcc's version, the arguments and the contents of every
#   file `nvcc -M` says SRC.cu reads.
# Anything else, and any cache trouble, runs nvcc as asked.
set -eu
real="$(dirname "$0")/nvcc"
case " $* " in
  *" --ptx "*) ;;
  *) if command -v ccache >/dev/null; then exec ccache "$real" "$@"; else exec "$real" "$@"; fi ;;
esac

outdir="" src="" prev=""
for a in "$@"; do
  [ "$prev" = "--output-directory" ] && outdir="$a"
  case "$a" in *.cu) src="$a" ;; esac
  prev="$a"
done
[ -n "$outdir" ] && [ -n "$src" ] || exec "$real" "$@"

# The arguments without the output directory or --ptx, for `nvcc -M` and the key.
flags=""
skip=0
for a in "$@"; do
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  case "$a" in
    --output-directory) skip=1 ;;
    --ptx | "$src") ;;
    *) flags="$flags $a" ;;
  esac
done
cache="${RLFT_NVCC_CACHE:-$HOME/.cache/rlft/nvcc-ptx}"
# shellcheck disable=SC2086 # $flags is a list of plain nvcc options
deps="$("$real" -M $flags "$src" 2>/dev/null | sed '1s/^[^:]*://' | tr -d '\\' | tr ' ' '\n' | grep .)" ||
  exec "$real" "$@"
key="$({ "$real" --version; echo "$flags"; echo "$deps" | xargs cat; } | sha256sum | cut -c1-32)"
ptx="$(basename "$src" .cu).ptx"
if [ -f "$cache/$key.ptx" ]; then
  cp "$cache/$key.ptx" "$outdir/$ptx"
  exit 0
fi
"$real" "$@"
mkdir -p "$cache"
cp "$outdir/$ptx" "$cache/$key.ptx.tmp.$$" && mv "$cache/$key.ptx.tmp.$$" "$cache/$key.ptx"
