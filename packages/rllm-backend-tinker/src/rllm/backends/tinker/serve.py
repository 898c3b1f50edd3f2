"""`rllm serve MODEL_PATH` for this backend: the local service's sampler, alone, until a signal.

Registered as the ``rllm.serve`` entry point ``tinker``, so the CLI finds it without importing
backend packages. It reuses LocalService (the same sampler engine and OpenAI-compatible server
that training samples from), with the weights shared (nothing trains here, so no second copy).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.local.service import LocalService
from rllm.types.errors import NotFoundError


def serve(
    model_path: str, *, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None
) -> int:
    """Serve ``model_path`` (a local Hugging Face model directory) until SIGINT or SIGTERM."""
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


async def _serve(service: LocalService) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    try:
        # One parseable line: scripts and tests wait for it instead of polling the port.
        print(f"serving {service.served_model_name()} at {service.inference_urls()[0]}", flush=True)
        print("stop with Ctrl-C", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await service.close()
    return 0
