"""RemoteService: train on the Tinker API with the official SDK; agents sample through Tinker's
OpenAI-compatible endpoint (``remote.inference_url``) with the latest sampler checkpoint as the
model name."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.remote.refusals import check_supported
from rllm.tinker_api import adam_params, make_custom_loss, plan_loss, split_mini_batches, to_datums
from rllm.types import TrainSequence
from rllm.types.errors import DeadlineError, InputError, NotFoundError

logger = logging.getLogger(__name__)

STATE_FILE = "tinker_remote_state.json"
# Finishing the session is a courtesy to the service; a dead service must not hang close().
CLOSE_TIMEOUT_S = 30.0


def make_service_client(config: TinkerBackendConfig) -> Any:
    """The official SDK's ServiceClient for ``remote.base_url`` / ``remote.api_key`` (falling back to
    TINKER_BASE_URL / TINKER_API_KEY). Construction does no I/O; the first call opens the session."""
    import tinker

    api_key = config.remote.resolved_api_key()
    if not api_key:
        raise InputError("the remote tinker service needs an API key: set remote.api_key or TINKER_API_KEY")
    return tinker.ServiceClient(base_url=config.remote.resolved_base_url(), api_key=api_key)


class RemoteService:
    def __init__(self, config: TinkerBackendConfig) -> None:
        if not config.model:
            raise InputError("TinkerBackendConfig.model is empty: give the Tinker base model name")
        self.config = config
        self.service_client: Any = None
        self.training_client: Any = None
        self.weight_version = 0
        self.optimizer_steps = 0
        self.sampler_path = ""
        self.lr_scale = 1.0  # set_learning_rate_scale (an SFT schedule); each optim_step sends it
        self._failed = False

    async def _result(self, what: str, future: Awaitable[Any]) -> Any:
        """Await an SDK future within ``remote.request_timeout_s``."""
        timeout = self.config.remote.request_timeout_s
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError as exc:
            raise DeadlineError(
                f"the Tinker service did not finish {what} within remote.request_timeout_s={timeout}s"
            ) from exc

    async def _submit(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call an SDK method that may block, then await the future it returns.

        The SDK opens its session (client config, auth, create_session) synchronously inside the
        first ``ServiceClient`` call, blocking the caller; on our event loop that would stall the
        gateway and every rollout, so such calls run on a worker thread.
        """
        future = await asyncio.to_thread(call, *args, **kwargs)
        return await self._result(what, future)

    async def start(self) -> None:
        if not self.config.remote.inference_url:
            raise InputError(
                "remote.inference_url is empty: set it to Tinker's OpenAI-compatible endpoint (ending in /v1)"
            )
        self.service_client = make_service_client(self.config)
        self.training_client = await self._submit(
            "create_lora_training_client",
            self.service_client.create_lora_training_client,
            base_model=self.config.model,
            rank=self.config.lora.rank,
            seed=self.config.seed,
        )
        await self._save_for_sampler(self.weight_version)

    async def _save_for_sampler(self, version: int) -> None:
        name = f"{self.config.remote.sampler_checkpoint_prefix}-v{version}"
        result = await self._result(
            "save_weights_for_sampler", self.training_client.save_weights_for_sampler(name)
        )
        self.sampler_path = result.path

    def inference_urls(self) -> list[str]:
        return [self.config.remote.inference_url]

    def served_model_name(self) -> str:
        """Tinker's OpenAI endpoint takes the sampler checkpoint path as the model name; it
        changes with every sync_weights, so callers must ask again after each sync."""
        return self.sampler_path or self.config.model

    def tokenizer_path(self) -> str | None:
        """The tokenizer the service reports for the base model (get_info), else the model name."""
        if self.training_client is not None:
            tokenizer_id = self.training_client.get_info().model_data.tokenizer_id
            if tokenizer_id:
                return str(tokenizer_id)
        return self.config.model

    def adam_params(self) -> Any:
        from tinker import types

        scaled = msgspec.structs.replace(self.config, learning_rate=self.config.learning_rate * self.lr_scale)
        return adam_params(types.AdamParams, scaled)

    def set_learning_rate_scale(self, scale: float) -> float:
        """Later optim_steps use ``learning_rate * scale`` (Tinker takes the LR with every step)."""
        self.lr_scale = scale
        return self.config.learning_rate * scale

    async def eval_loss(self, batch: list[TrainSequence]) -> dict[str, float]:
        """Held-out NLL of the loss-mask tokens (mean per token) from a forward-only pass."""
        if not batch:
            raise InputError("eval_loss got an empty batch")
        from tinker import types

        algo = AlgorithmConfig(loss="cross_entropy", tis="none")
        datums = to_datums(batch, algo, plan_loss(algo), types)
        output = await self._result("forward", self.training_client.forward(datums, "cross_entropy"))
        total, count = 0.0, 0.0
        for seq, out in zip(batch, output.loss_fn_outputs, strict=True):
            mask = np.frombuffer(seq.loss_mask, dtype=np.float32)[1:]  # datums are shifted by one
            logprobs = np.asarray(out["logprobs"].to_numpy(), dtype=np.float64)[: len(mask)]
            total -= float((logprobs * mask).sum())
            count += float(mask.sum())
        if count == 0:
            raise InputError("eval_loss got a batch without a trained token (every loss_mask is 0)")
        return {"loss": total / count, "num_tokens": count}

    async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        check_supported(algo, self.config)
        if not batch:
            raise InputError("train_step got an empty batch")
        from tinker import types

        plan = plan_loss(algo)
        groups = split_mini_batches(len(batch), self.config.mini_batches, self.config.shuffle_seed)
        # Submit every request before waiting on any: the service runs them in submission order
        # (seq_id) and pipelines them, so waiting per step would add a round trip each.
        pending = []
        try:
            for _ in range(self.config.ppo_epochs):
                for indices in groups:
                    mini_batch = [batch[i] for i in indices]
                    datums = to_datums(mini_batch, algo, plan, types)
                    if plan.loss_fn == "custom":
                        loss_fn = make_custom_loss(algo, mini_batch)
                        fb = self.training_client.forward_backward_custom(datums, loss_fn)
                    else:
                        fb = self.training_client.forward_backward(datums, plan.loss_fn, plan.loss_fn_config)
                    pending.append((fb, self.training_client.optim_step(self.adam_params())))
            outputs = [
                (await self._result("forward_backward", fb), await self._result("optim_step", opt))
                for fb, opt in pending
            ]
        except BaseException:
            self._failed = True
            raise
        self.optimizer_steps += len(pending)
        totals: dict[str, float] = {}
        for output, optim in outputs:
            metrics = {**output.metrics, **{f"optim/{k}": v for k, v in (optim.metrics or {}).items()}}
            for key, value in metrics.items():
                totals[f"tinker/{key}"] = totals.get(f"tinker/{key}", 0.0) + float(value) / len(pending)
        if "tinker/loss:sum" in totals:
            # The datums carry the aggregation weights, so the service's summed loss is the
            # aggregated loss (`rllm sft` and the metrics read it as `loss`).
            totals["loss"] = totals["tinker/loss:sum"]
        totals["optimizer_steps"] = float(len(pending))
        totals["num_sequences"] = float(len(batch))
        return totals

    async def sync_weights(self) -> int:
        """Save a sampler checkpoint; its path becomes ``served_model_name()``."""
        await self._save_for_sampler(self.weight_version + 1)
        self.weight_version += 1
        return self.weight_version

    async def save_checkpoint(self, path: Path) -> None:
        # Checkpoint names are unique within a training run, so the name carries the step count.
        prefix = self.config.remote.sampler_checkpoint_prefix
        name = f"{prefix}-state-v{self.weight_version}-s{self.optimizer_steps}"
        result = await self._result("save_state", self.training_client.save_state(name))
        path.mkdir(parents=True, exist_ok=True)
        state = {
            "state_path": result.path,
            "weight_version": self.weight_version,
            "optimizer_steps": self.optimizer_steps,
            "model": self.config.model,
        }
        (path / STATE_FILE).write_text(json.dumps(state, indent=2))

    async def load_checkpoint(self, path: Path) -> None:
        """Continue from a saved state (weights and Adam moments) in a new Tinker training run."""
        state_file = path / STATE_FILE
        if not state_file.is_file():
            raise NotFoundError(f"{path} is not a remote tinker checkpoint (no {STATE_FILE})")
        state = json.loads(state_file.read_text())
        if state.get("model") != self.config.model:
            raise InputError(
                f"{state_file} was saved from base model {state.get('model')!r}, but this backend's "
                f"model is {self.config.model!r}"
            )
        self.training_client = await self._submit(
            "create_training_client_from_state_with_optimizer",
            self.service_client.create_training_client_from_state_with_optimizer,
            state["state_path"],
        )
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        await self._save_for_sampler(int(state["weight_version"]))
        self.weight_version = int(state["weight_version"])

    async def close(self) -> None:
        """Finish the Tinker session (so the service frees it) and stop the SDK's background work."""
        client, self.service_client = self.service_client, None
        if client is None:
            return
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await client.close("errored" if self._failed else "success")
        except TimeoutError:
            logger.warning("the Tinker session did not finish within %ss; closing anyway", CLOSE_TIMEOUT_S)
