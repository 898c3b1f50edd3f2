"""`rllm serve MODEL_PATH` for this backend: the local service's sampler, alone, until a signal.

Registered as the ``rllm.serve`` entry point ``tinker``, so the CLI finds it without importing
backend packages. It reuses LocalService (the same sampler engine and OpenAI-compatible server
that training samples from), with the weights shared (nothing trains here, so no second copy).

A checkpoint of a run with several policies (local/policies.py) is served whole: the base model
with every adapter, each policy under its own name and the default one under the served name
(``checkpoints=True``, which the CLI passes to a serve that takes it). Any other checkpoint is
not served here (None): the CLI merges it into its base model first, as for one policy.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

from rllm.algos.adapters import LoraConfig
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.local.checkpoint import STATE_FILE
from rllm.backends.tinker.local.policies import POLICIES_DIR, POLICIES_FILE, policy_specs
from rllm.backends.tinker.local.service import LocalService
from rllm.types.errors import InputError, NotFoundError


def serve(
    model_path: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    checkpoints: bool = False,
) -> int | None:
    """Serve ``model_path`` (a local Hugging Face model directory, or with ``checkpoints`` a
    several-policy checkpoint) until SIGINT or SIGTERM; None for a checkpoint not served so."""
    folder = Path(model_path)
    if checkpoints and not (folder / "config.json").is_file():
        if not ((folder / STATE_FILE).is_file() and (folder / POLICIES_FILE).is_file()):
            return None
        return asyncio.run(_serve(_policies_service(folder, host, port, model_name), folder))
    if not (Path(model_path) / "config.json").is_file():
        raise NotFoundError(f"{model_path} is not a local model directory (no config.json)")
    config = TinkerBackendConfig(
        model=model_path,
        served_model_name=model_name or "",
        sampler_host=host,
        sampler_port=port,
        sampler_weights="shared",
    )
    return asyncio.run(_serve(LocalService(config)))


def _adapter_lora(folder: Path) -> LoraConfig:
    """The LoRA shape a saved peft adapter was trained with."""
    saved = json.loads((folder / "adapter_config.json").read_text())
    modules = saved.get("target_modules") or "all-linear"
    if isinstance(modules, list):
        target: list[str] | Literal["all-linear"] = sorted(modules)
    elif modules == "all-linear":
        target = "all-linear"
    else:  # a regex: peft's, not a shape this backend's config can say
        raise InputError(f"{folder}: target_modules {modules!r} is not a list of module names")
    return LoraConfig(
        rank=int(saved["r"]),
        alpha=float(saved.get("lora_alpha", 16.0)),
        dropout=float(saved.get("lora_dropout", 0.0)),
        target_modules=target,
    )


def _policies_service(checkpoint: Path, host: str, port: int, model_name: str | None) -> LocalService:
    """The base model with every policy's adapter of ``checkpoint``, as its run trained them."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    config = TinkerBackendConfig(
        model=str(state["model"]),
        served_model_name=model_name or "",
        sampler_host=host,
        sampler_port=port,
        lora=_adapter_lora(checkpoint),
    )
    sections = {
        name: SimpleNamespace(
            lora=_adapter_lora(checkpoint / POLICIES_DIR / name),
            learning_rate=None,
            weight_decay=None,
            grad_clip=None,
        )
        for name in json.loads((checkpoint / POLICIES_FILE).read_text())
    }
    return LocalService(config, policy_specs(config, sections))


async def _serve(service: LocalService, checkpoint: Path | None = None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    try:
        if checkpoint is not None:
            await service.load_checkpoint(checkpoint)  # every adapter, into its sampler copy
        names = [service.served_model_name(), *(n for n in service.engines if n != "default")]
        # One parseable line: scripts and tests wait for it instead of polling the port.
        print(f"serving {', '.join(names)} at {service.inference_urls()[0]}", flush=True)
        print("stop with Ctrl-C", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await service.close()
    return 0
