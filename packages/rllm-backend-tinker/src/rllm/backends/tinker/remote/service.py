"""RemoteService: train on the Tinker API with the official SDK; agents sample through Tinker's
OpenAI-compatible endpoint (``remote.inference_url``) with the latest sampler checkpoint as the
model name."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.local.batching import split_mini_batches
from rllm.backends.tinker.remote.custom_loss import make_custom_loss
from rllm.backends.tinker.remote.datums import to_datums
from rllm.backends.tinker.remote.losses import check_supported, plan_loss
from rllm.engine.backend import TrainSequence

STATE_FILE = "tinker_remote_state.json"


def default_service_client(config: TinkerBackendConfig) -> Any:
    """The real SDK client (network). Tests pass a fake factory instead."""
    import tinker

    api_key = config.remote.resolved_api_key()
    if not api_key:
        raise ValueError("the remote tinker service needs an API key: set remote.api_key or TINKER_API_KEY")
    return tinker.ServiceClient(base_url=config.remote.resolved_base_url(), api_key=api_key)


async def resolve(future: Any) -> Any:
    """An SDK APIFuture (awaitable) or a plain value."""
    if inspect.isawaitable(future):
        return await future
    if hasattr(future, "result"):
        return await asyncio.to_thread(future.result)
    return future


class RemoteService:
    def __init__(
        self, config: TinkerBackendConfig, client_factory: Callable[[TinkerBackendConfig], Any] | None = None
    ) -> None:
        if not config.model:
            raise ValueError("TinkerBackendConfig.model is empty: give the Tinker base model name")
        self.config = config
        self._factory = client_factory or default_service_client
        self.service_client: Any = None
        self.training_client: Any = None
        self.weight_version = 0
        self.sampler_path = ""

    async def start(self) -> None:
        if not self.config.remote.inference_url:
            raise ValueError(
                "remote.inference_url is empty: set it to Tinker's OpenAI-compatible endpoint (ending in /v1)"
            )
        self.service_client = self._factory(self.config)
        self.training_client = await resolve(
            self.service_client.create_lora_training_client(
                base_model=self.config.model, rank=self.config.lora.rank, seed=self.config.seed
            )
        )
        await self._save_for_sampler()

    async def _save_for_sampler(self) -> None:
        name = f"{self.config.remote.sampler_checkpoint_prefix}-v{self.weight_version}"
        result = await resolve(self.training_client.save_weights_for_sampler(name))
        self.sampler_path = result.path

    def inference_urls(self) -> list[str]:
        return [self.config.remote.inference_url]

    def served_model_name(self) -> str:
        """Tinker's OpenAI endpoint takes the sampler checkpoint path as the model name; it
        changes with every sync_weights."""
        return self.sampler_path or self.config.model

    def tokenizer_path(self) -> str | None:
        return self.config.model

    def adam_params(self) -> Any:
        from tinker import types

        cfg = self.config
        return types.AdamParams(
            learning_rate=cfg.learning_rate,
            beta1=cfg.betas[0],
            beta2=cfg.betas[1],
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            grad_clip_norm=max(cfg.grad_clip, 0.0),
        )

    async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        check_supported(algo, self.config)
        if not batch:
            raise ValueError("train_step got an empty batch")
        plan = plan_loss(algo)
        groups = split_mini_batches(len(batch), self.config.mini_batches, self.config.shuffle_seed)
        # Submit every request before waiting on any: the SDK pipelines them server-side.
        pending = []
        for _ in range(self.config.ppo_epochs):
            for indices in groups:
                datums = to_datums([batch[i] for i in indices], algo, plan)
                if plan.loss_fn == "custom":
                    fb = self.training_client.forward_backward_custom(datums, make_custom_loss(algo))
                else:
                    fb = self.training_client.forward_backward(datums, plan.loss_fn, plan.loss_fn_config)
                pending.append((fb, self.training_client.optim_step(self.adam_params())))
        totals: dict[str, float] = {}
        for fb, opt in pending:
            output = await resolve(fb)
            await resolve(opt)
            for key, value in (getattr(output, "metrics", None) or {}).items():
                totals[f"tinker/{key}"] = totals.get(f"tinker/{key}", 0.0) + float(value) / len(pending)
        totals["optimizer_steps"] = float(len(pending))
        totals["num_sequences"] = float(len(batch))
        return totals

    async def sync_weights(self) -> int:
        self.weight_version += 1
        await self._save_for_sampler()
        return self.weight_version

    async def save_checkpoint(self, path: Path) -> None:
        result = await resolve(
            self.training_client.save_state(
                f"{self.config.remote.sampler_checkpoint_prefix}-state-v{self.weight_version}"
            )
        )
        path.mkdir(parents=True, exist_ok=True)
        state = {"state_path": result.path, "weight_version": self.weight_version, "model": self.config.model}
        (path / STATE_FILE).write_text(json.dumps(state, indent=2))

    async def load_checkpoint(self, path: Path) -> None:
        state_file = path / STATE_FILE
        if not state_file.is_file():
            raise FileNotFoundError(f"{path} is not a remote tinker checkpoint (no {STATE_FILE})")
        state = json.loads(state_file.read_text())
        self.training_client = await resolve(
            self.service_client.create_training_client_from_state_with_optimizer(state["state_path"])
        )
        self.weight_version = int(state["weight_version"])
        await self._save_for_sampler()

    async def close(self) -> None:
        client, self.service_client = self.service_client, None
        if client is not None and hasattr(client, "close"):
            await asyncio.to_thread(client.close)
