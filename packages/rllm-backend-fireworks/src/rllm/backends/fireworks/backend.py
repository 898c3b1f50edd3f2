"""FireworksBackend: the ``fireworks`` entry point. Trains on a Fireworks RLOR trainer job through
the official ``fireworks-ai`` training SDK and serves each new version from a hot-loaded
deployment, which agents reach through the gateway (via ``upstream.DeploymentUpstream``)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rllm.algos.config import AlgorithmConfig
from rllm.backends.fireworks.config import OPTIONS, FireworksBackendConfig, api_key, parse_config
from rllm.backends.fireworks.provision import Resources, provision, release
from rllm.backends.fireworks.refusals import check_supported
from rllm.backends.fireworks.upstream import DeploymentUpstream
from rllm.engine.backend_base import BackendBase
from rllm.engine.modality import refuse_images
from rllm.tinker_api import LossPlan, adam_params, make_custom_loss, split_mini_batches, to_datums
from rllm.types import TrainSequence
from rllm.types.errors import DeadlineError, InputError, NotFoundError

logger = logging.getLogger(__name__)

STATE_FILE = "fireworks_state.json"
# Every loss runs client-side as rllm.algos' loss: the SDK's forward_backward_custom.
CUSTOM = LossPlan("custom", None)


class FireworksBackend(BackendBase[FireworksBackendConfig]):
    """Implements rllm.engine's Backend protocol on Fireworks (see README.md)."""

    policies_refusal = "a run holds one training client and one deployment (one per policy is not built)"

    name = "fireworks"
    scores_prompts = False  # a deployment's completions take no prompt_logprobs batch
    options_type = FireworksBackendConfig

    def __init__(
        self, options: FireworksBackendConfig | Mapping[str, Any] | None = None, **overrides: Any
    ) -> None:
        super().__init__(options, **overrides)
        self.resources: Resources | None = None
        self.service_client: Any = None
        self.training_client: Any = None
        self.syncer: Any = None
        self.upstream: DeploymentUpstream | None = None
        self.weight_version = 0
        self.optimizer_steps = 0

    # Backend protocol ------------------------------------------------------------------------
    def validate(self, algo: AlgorithmConfig) -> None:
        check_supported(algo)

    async def start(self) -> None:
        from fireworks.training.sdk import FiretitanServiceClient, WeightSyncer

        key = api_key()
        cfg = self.config
        self.resources = res = await asyncio.to_thread(provision, cfg, key)
        try:
            self.service_client = FiretitanServiceClient(base_url=res.trainer_url, api_key=key)
            self.training_client = await asyncio.to_thread(
                self.service_client.create_training_client,
                base_model=cfg.model,
                lora_rank=cfg.lora_rank,
                seed=cfg.seed,
            )
            self.syncer = WeightSyncer(
                policy_client=self.training_client,
                deploy_mgr=res.deploy_mgr,
                deployment_id=res.deployment_id,
                base_model=cfg.model,
                hotload_timeout=cfg.hot_load_timeout_s,
                lora_rank=cfg.lora_rank,
                # The first rollout warms the deployment; a separate warmup call would be billed.
                warmup_after_hotload=False,
            )
            # The deployment serves exactly the trainer's weights from version 0 on.
            await self._hotload(f"{cfg.checkpoint_prefix}-v0")
            self.upstream = DeploymentUpstream(cfg.resolved_inference_url(), key, res.deployment_model)
            self.upstream.start()
        except BaseException:
            await self.close()
            raise

    @classmethod
    def parse_options(
        cls, options: FireworksBackendConfig | Mapping[str, Any] | None = None, **overrides: Any
    ) -> FireworksBackendConfig:
        return parse_config(options, **overrides)  # refuses an api_key option first

    def _started(self) -> Resources:
        self.require_started(self.training_client)
        return self.require_started(self.resources)

    def inference_urls(self) -> list[str]:
        self._started()
        assert self.upstream is not None
        return [self.upstream.url]

    def served_model_name(self) -> str:
        """The deployment's model name; hot-loads change its weights, not its name."""
        return self._started().deployment_model

    def tokenizer_path(self) -> str | None:
        return self.config.tokenizer or None

    def adam_params(self) -> Any:
        from fireworks.training.sdk import AdamParams

        return adam_params(AdamParams, self.config)

    async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        self._started()
        check_supported(algo)
        refuse_images(self, batch)  # no validate_images: its datums carry token ids only
        if not batch:
            raise InputError("train_step got an empty batch")
        outputs = await asyncio.to_thread(self._train_blocking, batch, algo)
        self.optimizer_steps += len(outputs)
        totals: dict[str, float] = {}
        for fb, optim in outputs:
            metrics = {
                **{
                    (f"fireworks/{k}" if ":" in k or k == "response_tokens" else k): v
                    for k, v in fb.metrics.items()
                },
                **{f"optim/{k}": v for k, v in (optim.metrics or {}).items()},
            }
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + float(value) / len(outputs)
        totals["optimizer_steps"] = float(len(outputs))
        totals["num_sequences"] = float(len(batch))
        return totals

    def _train_blocking(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> list[tuple[Any, Any]]:
        """One forward_backward_custom + optim_step per mini-batch, ``ppo_epochs`` times."""
        from fireworks.training.sdk import types

        cfg = self.config
        groups = split_mini_batches(len(batch), cfg.mini_batches, cfg.shuffle_seed)
        outputs = []
        for _ in range(cfg.ppo_epochs):
            for indices in groups:
                mini_batch = [batch[i] for i in indices]
                datums = to_datums(mini_batch, algo, CUSTOM, types)
                fb = self.training_client.forward_backward_custom(datums, make_custom_loss(algo, mini_batch))
                optim = self.training_client.optim_step(self.adam_params())
                timeout = cfg.request_timeout_s
                outputs.append((fb.result(timeout=timeout), optim.result(timeout=timeout)))
        return outputs

    async def _hotload(self, name: str) -> None:
        timeout = self.config.request_timeout_s + self.config.hot_load_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await asyncio.to_thread(self.syncer.save_and_hotload, name)
        except TimeoutError as exc:
            raise DeadlineError(f"saving and hot-loading {name!r} took longer than {timeout}s") from exc

    async def sync_weights(self) -> int:
        """Save a sampler snapshot and hot-load it to the deployment; returns the new version."""
        self._started()
        await self._hotload(f"{self.config.checkpoint_prefix}-v{self.weight_version + 1}")
        self.weight_version += 1
        return self.weight_version

    async def save_checkpoint(self, path: Path) -> None:
        """Save the training state (weights + Adam moments) on the trainer; record where."""
        res = self._started()
        name = f"{self.config.checkpoint_prefix}-state-v{self.weight_version}-s{self.optimizer_steps}"
        future = self.training_client.save_state(name)
        result = await asyncio.to_thread(future.result, self.config.request_timeout_s)
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {
            "state_path": result.path,
            "checkpoint_name": name,
            "trainer_job_id": res.job_id,
            "weight_version": self.weight_version,
            "optimizer_steps": self.optimizer_steps,
            "model": self.config.model,
            "lora_rank": self.config.lora_rank,
        }
        (path / STATE_FILE).write_text(json.dumps(state, indent=2))

    async def load_checkpoint(self, path: Path) -> None:
        """Continue from a saved state; from another trainer job through a cross-job reference.
        Call sync_weights() next to serve the restored weights."""
        res = self._started()
        state_file = Path(path) / STATE_FILE
        if not state_file.is_file():
            raise NotFoundError(f"{path} is not a fireworks checkpoint (no {STATE_FILE})")
        state = json.loads(state_file.read_text())
        for key in ("model", "lora_rank"):
            if state.get(key) != getattr(self.config, key):
                raise InputError(
                    f"{state_file} was saved with {key}={state.get(key)!r}, but {OPTIONS}.{key} is "
                    f"{getattr(self.config, key)!r}"
                )
        same_job = state["trainer_job_id"] == res.job_id
        ref = self.training_client.resolve_checkpoint_path(
            state["state_path"] if same_job else state["checkpoint_name"],
            None if same_job else state["trainer_job_id"],
        )
        future = self.training_client.load_state_with_optimizer(ref)
        await asyncio.to_thread(future.result, self.config.request_timeout_s)
        self.optimizer_steps = int(state["optimizer_steps"])
        # The deployment still serves the weights of before; sync_weights() publishes these (the
        # Trainer calls it right after a load, so loading does not hot-load twice).
        self.weight_version = int(state["weight_version"])

    async def close(self) -> None:
        """Stop the adapter, end the training session and delete what start() created."""
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream.stop()
        client, self.service_client = self.service_client, None
        self.training_client = None
        if client is not None:
            await asyncio.to_thread(client.close)
        res, self.resources = self.resources, None
        if res is not None:
            await asyncio.to_thread(release, res, self.config)
