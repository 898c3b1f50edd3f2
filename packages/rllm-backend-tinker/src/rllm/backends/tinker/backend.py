"""TinkerBackend: the ``tinker`` entry point. Picks the local or remote service from its config."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.engine.backend_base import BackendBase
from rllm.engine.modality import refuse_images
from rllm.types import ConfigError, TrainSequence
from rllm.types.errors import StateError


class _Service(Protocol):
    async def start(self) -> None: ...
    def inference_urls(self) -> list[str]: ...
    def served_model_name(self) -> str: ...
    def tokenizer_path(self) -> str | None: ...
    async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]: ...
    async def sync_weights(self) -> int: ...
    async def save_checkpoint(self, path: Path) -> None: ...
    async def load_checkpoint(self, path: Path) -> None: ...
    async def close(self) -> None: ...


class TinkerBackend(BackendBase[TinkerBackendConfig]):
    """Implements rllm.engine's Backend protocol on a Tinker-style service.

    ``service = "local"`` (default) trains in-process with torch/transformers/peft and serves an
    OpenAI-compatible sampler on loopback; ``service = "remote"`` drives the Tinker API with the
    official ``tinker`` SDK.
    """

    name = "tinker"
    options_type = TinkerBackendConfig
    # What `rllm sft` sets unless the user did (rllm.engine.data.sft_launch): supervised training
    # samples nothing, so the local service starts without a sampler.
    sft_option_defaults: ClassVar[dict[str, Any]] = {"sampler_weights": "none"}

    def __init__(
        self, options: TinkerBackendConfig | Mapping[str, Any] | None = None, **overrides: Any
    ) -> None:
        super().__init__(options, **overrides)
        self._service: _Service | None = None
        self._policies: list[Any] = []  # local/policies.py's PolicySpecs (use_policies)

    @staticmethod
    def init_tiny_model(path: str | Path, vocab_words: Iterable[str] = (), seed: int = 0) -> Path:
        """A tiny random Llama + word-level tokenizer covering ``vocab_words`` (tests, toy tasks)."""
        from rllm.tiny import init_tiny_model

        return init_tiny_model(path, vocab_words=vocab_words, seed=seed)

    # Backend protocol ------------------------------------------------------------------------
    def validate(self, algo: AlgorithmConfig) -> None:
        if self.config.service == "remote":
            from rllm.backends.tinker.remote.refusals import check_supported

            check_supported(algo, self.config)
        elif self.config.sampler_weights == "none" and algo.loss != "cross_entropy":
            raise ConfigError.for_key(
                "backend.options.sampler_weights",
                "'none' starts no sampler, and RL samples from one: use 'copy' (or 'shared')",
            )
        # The local service honours every option: it runs rllm.algos' own loss on its own logprobs.

    def use_policies(self, policies: Mapping[str, Any]) -> None:
        """Several policies: one LoRA adapter each on the local service (local/policies.py), one
        Tinker training client each on the remote service (remote/service.py)."""
        from rllm.backends.tinker.local.policies import policy_specs

        if self.served_model_name() in policies:
            raise ConfigError.for_key(
                f"policies.{self.served_model_name()}",
                "a policy is served under its name, and this one is the default policy's model name",
            )
        if self._service is not None and getattr(self._service, "trainer", None) is not None:
            raise StateError("use_policies comes before start: the service is built with its policies")
        self._policies = policy_specs(self.config, dict(policies))
        if self.config.service == "remote":
            for spec in self._policies:
                if spec.lora.target_modules != "all-linear":
                    raise ConfigError.for_key(
                        f"policies.{spec.name}.lora.target_modules",
                        "Tinker chooses its LoRA targets itself; leave it 'all-linear'",
                    )
        self._service = None  # built again, with the policies, by start (served_model_name built one)

    def policy_model_names(self) -> dict[str, str]:
        """The model name each policy is sampled under: on the local service the default under
        the served model name, every other under its own name; on the remote service each
        policy's latest sampler checkpoint (they change at every sync)."""
        names = getattr(self._get_service(), "policy_model_names", None)
        if names is not None:
            return names()
        return {spec.name: spec.name for spec in self._policies} | {"default": self.served_model_name()}

    async def train_policy_step(
        self, policy: str, batch: list[TrainSequence], algo: AlgorithmConfig
    ) -> dict[str, float]:
        """One policy's update: its adapter and optimizer (local), its training client (remote)."""
        refuse_images(self, batch)
        from rllm.backends.tinker.local.service import LocalService
        from rllm.backends.tinker.remote.service import RemoteService

        service = self._started()
        assert isinstance(service, LocalService | RemoteService)
        return await service.train_policy_step(policy, batch, algo)

    def validate_images(self) -> None:
        """Images train on the local service (its vision path puts their pixels beside the
        placeholder tokens); the remote service's datums carry tokens only."""
        if self.config.service == "remote":
            raise ConfigError(
                "the remote Tinker service's datums carry token ids only, not images; train vision "
                "models with service='local' or the verl backend"
            )

    def validate_async(self, max_staleness: int) -> None:
        """``rollout.max_staleness`` > 0: the local service samples while it trains (separate
        sampler weights); the remote service and shared sampler weights cannot keep the bound."""
        if self.config.service == "remote":
            raise ConfigError(
                "the remote Tinker service is not supported with max_staleness > 0 yet (its sampler "
                "checkpoints are not versioned per call); set rollout.max_staleness=0"
            )
        if self.config.sampler_weights == "shared":
            raise ConfigError(
                "sampler_weights='shared' changes the sampler's weights during every optimizer step, "
                "so no call has one weight version; use sampler_weights='copy'"
            )

    def validate_partial(self) -> None:
        """``rollout.partial``: the local sampler aborts its calls at a sync with their tokens so
        far (``POST /v1/abort``) and continues them from token ids; the remote service cannot."""
        if self.config.service == "remote":
            raise ConfigError(
                "the remote Tinker service cannot abort a call in flight and continue it token for "
                "token; set rollout.partial=false"
            )

    async def check_step_memory(self, rows: int, max_tokens: int | None, algo: AlgorithmConfig) -> str | None:
        """Before the first rollout (the engine's Trainer asks): the local service plans a step of
        ``rows`` sequences of ``max_tokens`` + 1 tokens (None: ``sampler_max_tokens``) and returns
        its memory line, or refuses one that cannot fit (InputError: the estimate, the memory
        available, the knobs); None on the remote service, whose trainer's memory is its own."""
        check = getattr(self._started(), "check_step_memory", None)
        if check is None:
            return None
        return await check(rows, (max_tokens or self.config.sampler_max_tokens) + 1, algo)

    def _get_service(self) -> _Service:
        if self._service is None:
            if self.config.service == "local":
                from rllm.backends.tinker.local.service import LocalService

                self._service = LocalService(self.config, self._policies)
            else:
                from rllm.backends.tinker.remote.service import RemoteService

                self._service = RemoteService(self.config, self._policies)
        return self._service

    def _started(self) -> _Service:
        return self.require_started(self._service)

    async def start(self) -> None:
        await self._get_service().start()

    def inference_urls(self) -> list[str]:
        return self._started().inference_urls()

    def served_model_name(self) -> str:
        return self._get_service().served_model_name()

    def tokenizer_path(self) -> str | None:
        return self._get_service().tokenizer_path()

    async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        refuse_images(self, batch)
        return await self._started().train_step(batch, algo)

    async def sync_weights(self) -> int:
        return await self._started().sync_weights()

    # Supervised fine-tuning (rllm.engine.data.sft): held-out loss and the LR schedule. The local
    # service runs them itself; the remote one with a forward-only pass and the LR it sends with
    # every optim_step.
    def supports_sft_extras(self) -> str | None:
        """None: eval_loss and set_learning_rate_scale work on both services."""
        return None

    async def eval_loss(self, batch: list[TrainSequence]) -> dict[str, float]:
        return await self._sft_service().eval_loss(batch)

    def set_learning_rate_scale(self, scale: float) -> float:
        return self._sft_service().set_learning_rate_scale(scale)

    def _sft_service(self) -> Any:
        # Both services define eval_loss and set_learning_rate_scale (not part of _Service).
        return self._started()

    async def save_checkpoint(self, path: Path) -> None:
        await self._started().save_checkpoint(Path(path))

    async def load_checkpoint(self, path: Path) -> None:
        await self._started().load_checkpoint(Path(path))

    async def close(self) -> None:
        if self._service is not None:
            await self._service.close()
            self._service = None

    @property
    def service(self) -> _Service:
        """The running service (LocalService or RemoteService), for tests and diagnostics."""
        return self._started()
