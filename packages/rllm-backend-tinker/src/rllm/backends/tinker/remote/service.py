"""RemoteService: train on the Tinker API with the official SDK; agents sample through Tinker's
OpenAI-compatible endpoint (``remote.inference_url``) with the latest sampler checkpoint as the
model name.

Several policies (rllm.engine.training.policies): one Tinker training client per policy (a LoRA
run of its own rank on the one base model, stepped with its own learning rate and optimizer
settings), each trained only on its policy's sequences and saving its own sampler checkpoint
(``PREFIX-NAME-vN``; the default policy keeps ``PREFIX-vN``) at every sync, so each policy is
sampled under its own model name. A checkpoint holds every policy's saved state.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.remote.refusals import check_supported
from rllm.tinker_api import adam_params, make_custom_loss, plan_loss, split_mini_batches, to_datums
from rllm.types import TrainSequence
from rllm.types.errors import DeadlineError, InputError, NotFoundError

if TYPE_CHECKING:
    from rllm.backends.tinker.local.policies import PolicySpec

logger = logging.getLogger(__name__)

DEFAULT_POLICY = "default"

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


@dataclass
class PolicyRun:
    """One policy's Tinker training run: its client, LoRA rank, optimizer settings (``config``)
    and latest sampler checkpoint."""

    name: str
    rank: int
    config: TinkerBackendConfig
    training_client: Any = None
    sampler_path: str = ""

    def sampler_name(self, version: int) -> str:
        prefix = self.config.remote.sampler_checkpoint_prefix
        return f"{prefix}-v{version}" if self.name == DEFAULT_POLICY else f"{prefix}-{self.name}-v{version}"


class RemoteService:
    def __init__(self, config: TinkerBackendConfig, policies: list[PolicySpec] | None = None) -> None:
        if not config.model:
            raise InputError("TinkerBackendConfig.model is empty: give the Tinker base model name")
        self.config = config
        self.service_client: Any = None
        # Every policy's run, the default first (local/policies.py's specs: the default alone
        # in a one-policy run).
        self.runs = {DEFAULT_POLICY: PolicyRun(DEFAULT_POLICY, config.lora.rank, config)} | {
            spec.name: PolicyRun(spec.name, spec.lora.rank, spec.config)
            for spec in policies or []
            if spec.name != DEFAULT_POLICY
        }
        self.weight_version = 0
        self.optimizer_steps = 0
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
        for run in self.runs.values():
            run.training_client = await self._submit(
                "create_lora_training_client",
                self.service_client.create_lora_training_client,
                base_model=self.config.model,
                rank=run.rank,
                seed=self.config.seed,
            )
        await self._save_for_sampler(self.weight_version)

    @property
    def training_client(self) -> Any:
        """The default policy's training client."""
        return self.runs[DEFAULT_POLICY].training_client

    @property
    def sampler_path(self) -> str:
        return self.runs[DEFAULT_POLICY].sampler_path

    async def _save_for_sampler(self, version: int) -> None:
        """Every policy's sampler checkpoint at ``version`` (submitted together, then awaited)."""
        futures = [
            (run, run.training_client.save_weights_for_sampler(run.sampler_name(version)))
            for run in self.runs.values()
        ]
        for run, future in futures:
            run.sampler_path = (await self._result("save_weights_for_sampler", future)).path

    def policy_model_names(self) -> dict[str, str]:
        """The model name each policy is sampled under (its latest sampler checkpoint)."""
        return {name: run.sampler_path or self.config.model for name, run in self.runs.items()}

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

    def adam_params(self, policy: str = DEFAULT_POLICY) -> Any:
        from tinker import types

        config = self.runs[policy].config
        scaled = msgspec.structs.replace(config, learning_rate=config.learning_rate * self.lr_scale)
        return adam_params(types.AdamParams, scaled)

    def set_learning_rate_scale(self, scale: float) -> float:
        """Later optim_steps use ``learning_rate * scale`` (Tinker takes the LR with every step),
        each policy's own learning rate times ``scale``; returns the default policy's."""
        self.lr_scale = scale
        return self.config.learning_rate * scale

    def _policy_run(self, policy: str) -> PolicyRun:
        if policy not in self.runs:
            raise InputError(f"unknown policy {policy!r} (policies: {', '.join(self.runs)})")
        return self.runs[policy]

    async def eval_loss(self, batch: list[TrainSequence]) -> dict[str, float]:
        """Held-out NLL of the loss-mask tokens (mean per token) from a forward-only pass, each
        sequence under its policy's run (``metadata["policy"]``, the default where unset)."""
        if not batch:
            raise InputError("eval_loss got an empty batch")
        from tinker import types

        by_policy: dict[str, list[TrainSequence]] = {}
        for seq in batch:
            by_policy.setdefault(str(seq.metadata.get("policy", DEFAULT_POLICY)), []).append(seq)
        runs = {policy: self._policy_run(policy) for policy in by_policy}  # unknown: before any work
        algo = AlgorithmConfig(loss="cross_entropy", tis="none")
        total, count = 0.0, 0.0
        for policy, sequences in by_policy.items():
            datums = to_datums(sequences, algo, plan_loss(algo), types)
            client = runs[policy].training_client
            output = await self._result("forward", client.forward(datums, "cross_entropy"))
            for seq, out in zip(sequences, output.loss_fn_outputs, strict=True):
                mask = np.frombuffer(seq.loss_mask, dtype=np.float32)[1:]  # datums are shifted by one
                logprobs = np.asarray(out["logprobs"].to_numpy(), dtype=np.float64)[: len(mask)]
                total -= float((logprobs * mask).sum())
                count += float(mask.sum())
        if count == 0:
            raise InputError("eval_loss got a batch without a trained token (every loss_mask is 0)")
        return {"loss": total / count, "num_tokens": count}

    async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        return await self.train_policy_step(DEFAULT_POLICY, batch, algo)

    async def train_policy_step(
        self, policy: str, batch: list[TrainSequence], algo: AlgorithmConfig
    ) -> dict[str, float]:
        """One policy's update: its own training client, its own optimizer settings."""
        check_supported(algo, self.config)
        if not batch:
            raise InputError("train_step got an empty batch")
        run = self._policy_run(policy)
        client = run.training_client
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
                        fb = client.forward_backward_custom(datums, loss_fn)
                    else:
                        fb = client.forward_backward(datums, plan.loss_fn, plan.loss_fn_config)
                    pending.append((fb, client.optim_step(self.adam_params(policy))))
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
        futures = {policy: run.training_client.save_state(name) for policy, run in self.runs.items()}
        paths = {policy: (await self._result("save_state", f)).path for policy, f in futures.items()}
        path.mkdir(parents=True, exist_ok=True)
        state = {
            "state_path": paths.pop(DEFAULT_POLICY),
            "policies": paths,  # every other policy's saved state
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
        saved = {DEFAULT_POLICY: state["state_path"], **state.get("policies", {})}
        if sorted(saved) != sorted(self.runs):
            raise InputError(
                f"{state_file} holds policies {', '.join(sorted(saved))}, the run has {', '.join(sorted(self.runs))}"
            )
        for policy, run in self.runs.items():
            run.training_client = await self._submit(
                "create_training_client_from_state_with_optimizer",
                self.service_client.create_training_client_from_state_with_optimizer,
                saved[policy],
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
