#!/usr/bin/env bash
# Installs what `cargo build --release -p rlft-cli --features cuda` needs on a machine WITHOUT a
# GPU or a CUDA install, from PyPI, into ~/.cache/rlft/cuda13 (or $RLFT_CUDA_PREFIX), and prints
# the environment to build with:
#
#     eval "$(scripts/install-cuda.sh)"
#     cargo build --release -p rlft-cli --features cuda
#
# What it installs (CUDA 13.0, the version of the H200 machines' driver and PyTorch wheels):
# - nvcc, ptxas, NVVM, the CRT headers, cuda_runtime.h / cuda_fp16.h / cuda_bf16.h / cuda.h and
#   libcudart.so.13 (PyPI wheels, about 270 MB). Every piece is pinned to 13.0: a newer NVVM
#   next to an older ptxas fails with "Unsupported .version 9.5".
# - Link stubs for libcuda (the driver), cuBLAS, cuBLASLt, cuRAND and NVRTC: candle links them
#   dynamically (cudarc's `dynamic-linking`), and none of them is needed to compile. Each stub is
#   a tiny shared library that defines every function cudarc declares for that library and
#   carries the real library's SONAME, so the binary asks for libcuda.so.1, libcublas.so.13, ...
#   at start-up and finds the real ones on a GPU machine (the driver's libcuda.so.1; cuBLAS etc.
#   from PyTorch's nvidia-* wheels or a CUDA install, through LD_LIBRARY_PATH; see docs/gpu.md).
#   The stubs never run: a binary started where only they are found fails at the first call.
#
# nvcc runs through scripts/nvcc-cache.sh (NVCC=.../nvcc-cache): candle-kernels' PTX and (with
# Debian's `ccache` on the machine) its static GGUF/MoE kernels, most of a cold CUDA build's
# time, compile once per machine and come from ~/.cache afterwards, in any clone.
#
# Idempotent: a second run only prints the environment. CUDA_COMPUTE_CAP (default 90, the H100 /
# H200) selects the GPU architecture of candle's precompiled kernels; set it before running.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX="${RLFT_CUDA_PREFIX:-$HOME/.cache/rlft/cuda13}"
PIP_PKGS=("nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*"
  "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*")
# library name : SONAME : cudarc module whose functions the stub defines
STUBS=("cuda:libcuda.so.1:driver" "cublas:libcublas.so.13:cublas"
  "cublasLt:libcublasLt.so.13:cublaslt" "curand:libcurand.so.10:curand"
  "nvrtc:libnvrtc.so.13:nvrtc")
CU="$PREFIX/pkgs/nvidia/cu13"
STAMP="$PREFIX/.installed"
want="${PIP_PKGS[*]} ${STUBS[*]} v2"

log() { echo "install-cuda: $*" >&2; }

if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" || ! -x "$CU/bin/nvcc" ]]; then
  log "installing the CUDA 13.0 compiler and headers from PyPI into $PREFIX"
  rm -rf "$PREFIX/pkgs"
  mkdir -p "$PREFIX"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-warn-script-location \
    --target "$PREFIX/pkgs" "${PIP_PKGS[@]}" >&2

  # cudarc's declarations are the list of functions each stub must define.
  cudarc_ver="$(grep -A1 '^name = "cudarc"$' Cargo.lock | sed -n 's/^version = "\(.*\)"$/\1/p')"
  [[ -n "$cudarc_ver" ]] || { log "cudarc is not in Cargo.lock"; exit 1; }
  cargo fetch -q >&2
  cudarc_src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$cudarc_ver" | head -1)"
  [[ -d "$cudarc_src" ]] || { log "cudarc $cudarc_ver sources not found after cargo fetch"; exit 1; }

  stubs="$CU/lib/stubs"
  mkdir -p "$stubs"
  for entry in "${STUBS[@]}"; do
    IFS=: read -r name soname module <<<"$entry"
    src="$stubs/$name.c"
    grep -oP '^pub unsafe fn \K\w+' "$cudarc_src/src/$module/sys/mod.rs" | sort -u |
      sed 's/.*/void &(void) {}/' >"$src"
    [[ -s "$src" ]] || { log "no functions found for $name in cudarc $cudarc_ver"; exit 1; }
    gcc -shared -fPIC -o "$stubs/$soname" -Wl,-soname,"$soname" "$src"
    ln -sf "$soname" "$stubs/lib$name.so"
    rm "$src"
  done
  # candle-kernels links -lcudart; the wheel ships only the versioned file.
  ln -sf ../libcudart.so.13 "$stubs/libcudart.so"
  echo "$want" >"$STAMP"
  log "done ($(du -sh "$PREFIX" | cut -f1))"
fi

# nvcc with a cache (scripts/nvcc-cache.sh: objects through ccache when there is one, PTX in
# ~/.cache/rlft/nvcc-ptx); cudaforge runs $NVCC and takes the CUDA root from its ../.
cp scripts/nvcc-cache.sh "$CU/bin/nvcc-cache"
echo "export NVCC=\"$CU/bin/nvcc-cache\""

cap="${CUDA_COMPUTE_CAP:-90}"
cat <<EOF
export CUDA_ROOT="$CU"
export CUDA_PATH="$CU"
export PATH="$CU/bin:\$PATH"
export CUDA_COMPUTE_CAP="$cap"
EOF
