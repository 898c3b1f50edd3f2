"""LocalService: the embedded Tinker-style service — trainer, sampler engine and HTTP server in
one process, sharing the device."""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.local import checkpoint
from rllm.backends.tinker.local import policies as multi
from rllm.backends.tinker.local.generation import SamplerEngine
from rllm.backends.tinker.local.model import (
    configure_threads,
    load_policy,
    load_pretrained,
    load_tokenizer,
    model_source,
    resolve_device,
    resolve_dtype,
)
from rllm.backends.tinker.local.server import SamplerServer
from rllm.backends.tinker.local.trainer import LocalTrainer
from rllm.backends.tinker.local.vision import load_vision
from rllm.types import TrainSequence
from rllm.types.errors import InputError, StateError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def sampler_copy(model: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """The sampler's own copy of the policy. Weights that never train (LoRA's frozen base) are the
    same tensors in both: only the trainable ones, which sync_weights copies, are duplicated. With
    ``dtype`` (``sampler_dtype``) every weight is the copy's own, in that dtype."""
    frozen = {} if dtype is not None else {id(p): p for p in model.parameters() if not p.requires_grad}
    copied = copy.deepcopy(model, memo=dict(frozen)).eval()
    for p in copied.parameters():
        p.requires_grad_(False)
        if dtype is not None and p.is_floating_point():
            # Parameters only: buffers such as RoPE's inverse frequencies keep their precision.
            p.data = p.data.to(dtype)
    return copied


def sampler_models(
    model: torch.nn.Module,
    config: TinkerBackendConfig,
    specs: list[multi.PolicySpec],
    adapter_names: dict[str, list[str]],
    device: torch.device,
    trainer_dtype: torch.dtype,
) -> dict[str, torch.nn.Module]:
    """Each policy's sampler model: its copy (in ``sampler_dtype`` where that is not the
    trainer's), or the trained module itself with ``sampler_weights = "shared"``."""
    wanted = trainer_dtype if config.sampler_dtype == "same" else resolve_dtype(config.sampler_dtype, device)
    cast = wanted if wanted != trainer_dtype else None
    if specs:
        return multi.sampler_copies(model, [s.name for s in specs], adapter_names, cast)
    return {multi.DEFAULT_POLICY: sampler_copy(model, cast) if config.sampler_weights == "copy" else model}


class LocalService:
    """Trains with torch in-process and serves the synced weights over OpenAI-compatible HTTP."""

    def __init__(self, config: TinkerBackendConfig, policies: list[multi.PolicySpec] | None = None) -> None:
        self.config = config
        # Several policies (local/policies.py): the default first; empty for a one-policy run.
        self.specs = list(policies or [])
        self.trainers: dict[str, LocalTrainer] = {}
        self.engines: dict[str, SamplerEngine] = {}
        self._adapter_names: dict[str, list[str]] = {}
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.trainer: LocalTrainer | None = None
        self.engine: SamplerEngine | None = None
        self.server: SamplerServer | None = None
        self._url = ""
        # sampler_weights = "none" (`rllm sft`): no sampler, so the version is counted here.
        self._weight_version = 0
        # Serialises train_step / sync / checkpoint work (they run on worker threads).
        self._work_lock = threading.Lock()

    # lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(self._start_sync)

    def _start_sync(self) -> None:
        cfg = self.config
        if not cfg.model:
            raise InputError("TinkerBackendConfig.model is empty: give a local model directory or a hub name")
        threads = configure_threads(cfg.torch_threads, self.device)
        source = model_source(cfg.model)
        self.tokenizer = tokenizer = load_tokenizer(source)
        model = load_policy(cfg, self.device, self.dtype)
        # A vision-language model also ships its image processor: the sampler renders image
        # blocks with it and the trainer turns each sequence's images into the same pixels.
        vision = load_vision(source)
        # load_tokenizer falls back to the eos token; a tokenizer with neither pads with 0, as the
        # sampler does (padded positions are masked out, so any id works).
        pad_id = tokenizer.pad_token_id
        if self.specs:
            self._adapter_names = multi.add_adapters(model, self.specs)
        for spec in self.specs or [multi.PolicySpec(name=multi.DEFAULT_POLICY, lora=cfg.lora, config=cfg)]:
            if self.specs:
                multi.activate(model, spec.name)  # its trainer's parameters: its adapter's
            self.trainers[spec.name] = LocalTrainer(
                model,
                spec.config,
                self.device,
                pad_id if isinstance(pad_id, int) else 0,
                self._load_reference,
                vision=vision,
            )
        if self.specs:
            multi.activate(model, multi.DEFAULT_POLICY)
        self.trainer = self.trainers[multi.DEFAULT_POLICY]
        if cfg.sampler_weights == "none":
            # Supervised training samples nothing: no second copy of the weights, no sampler
            # thread, no HTTP server (what `rllm sft` asks for; it used to start all three).
            logger.info("local tinker service: %s on %s (%s, %d threads), no sampler", cfg.model,
                        self.device, self.dtype, threads)  # fmt: skip
            return
        copies = sampler_models(model, cfg, self.specs, self._adapter_names, self.device, self.dtype)
        for name, sampler_model in copies.items():
            self.engines[name] = SamplerEngine(
                sampler_model,
                tokenizer,
                self.device,
                cfg.sampler_max_batch,
                batch_window_s=cfg.sampler_batch_window_ms / 1000.0,
                max_queued=cfg.sampler_max_queued,
                # Its packed weights are rebuilt per version: "shared" weights change in between.
                fast_decode=cfg.sampler_fast_decode and cfg.sampler_weights == "copy",
            )
            self.engines[name].start()
        self.engine = self.engines[multi.DEFAULT_POLICY]
        self.server = SamplerServer(
            self.engine,
            self.served_model_name(),
            host=cfg.sampler_host,
            port=cfg.sampler_port,
            default_max_tokens=cfg.sampler_max_tokens,
            image_processor=vision.image_processor if vision is not None else None,
            in_process=cfg.sampler_in_process,
            policy_engines={n: e for n, e in self.engines.items() if n != multi.DEFAULT_POLICY},
        )
        self._url = self.server.start()
        logger.info(
            "local tinker service: %s on %s (%s, %d threads), sampler at %s",
            cfg.model,
            self.device,
            self.dtype,
            threads,
            self._url,
        )

    def _load_reference(self) -> torch.nn.Module:
        """The initial weights for KL: reloaded from the model path (full fine-tuning only)."""
        reference = load_pretrained(model_source(self.config.model), self.dtype, self.device).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
        return reference

    async def close(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
            self.server = None
        for engine in self.engines.values():
            await asyncio.to_thread(engine.stop)
        self.engines = {}
        self.engine = None
        self.trainer = None  # drop the model and optimizer state
        self.trainers = {}

    # endpoints -------------------------------------------------------------------------------
    def inference_urls(self) -> list[str]:
        if self.config.sampler_weights == "none":
            raise StateError(
                "the local service runs without a sampler (sampler_weights='none'): nothing to sample from"
            )
        if not self._url:
            raise StateError("the local service is not started: await backend.start() first")
        return [self._url]

    def served_model_name(self) -> str:
        return self.config.served_model_name or Path(self.config.model).name or self.config.model

    def tokenizer_path(self) -> str | None:
        return model_source(self.config.model)  # a .gguf file's imported folder

    # training --------------------------------------------------------------------------------
    def _require_started(self) -> tuple[LocalTrainer, SamplerEngine]:
        if self.trainer is None or self.engine is None:
            raise StateError("the local service is not started: await backend.start() first")
        return self.trainer, self.engine

    def _require_trainer(self) -> tuple[LocalTrainer, SamplerEngine | None]:
        """The trainer, and the sampler unless the service runs without one (sampler_weights='none')."""
        if self.trainer is None or (self.engine is None and self.config.sampler_weights != "none"):
            raise StateError("the local service is not started: await backend.start() first")
        return self.trainer, self.engine

    async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        trainer, engine = self._require_trainer()
        # With shared weights, optimizer steps must not run while a batch is being sampled.
        guard = engine.paused if engine is not None and self.config.sampler_weights == "shared" else None

        def work() -> dict[str, float]:
            with self._work_lock:
                return trainer.train_step(batch, algo, guard)

        return await asyncio.to_thread(work)

    async def check_step_memory(self, rows: int, row_tokens: int, algo: AlgorithmConfig) -> str:
        """Plan a step of ``rows`` sequences of ``row_tokens`` tokens before the first rollout:
        its line (InputError naming the estimate, the memory available and the knobs when it
        cannot fit)."""
        trainer, _ = self._require_trainer()

        def work() -> str:
            with self._work_lock:
                return trainer.plan_memory_at_start(rows, row_tokens, algo).line()

        return await asyncio.to_thread(work)

    async def train_policy_step(
        self, policy: str, batch: list[TrainSequence], algo: AlgorithmConfig
    ) -> dict[str, float]:
        """One policy's update (local/policies.py): its adapter active, its own optimizer."""
        trainer, _ = self._require_trainer()
        if policy not in self.trainers:
            raise InputError(f"unknown policy {policy!r} (policies: {', '.join(self.trainers)})")
        if not self.specs:
            return await self.train_step(batch, algo)
        chosen = self.trainers[policy]

        def work() -> dict[str, float]:
            with self._work_lock:
                multi.activate(trainer.model, policy)
                try:
                    return chosen.train_step(batch, algo)
                finally:
                    multi.activate(trainer.model, multi.DEFAULT_POLICY)

        return await asyncio.to_thread(work)

    async def eval_loss(self, batch: list[TrainSequence]) -> dict[str, float]:
        """Held-out loss; of several policies, each sequence with its policy's adapter
        (local/policies.py, ``eval_loss_by_policy``)."""
        trainer, _ = self._require_trainer()

        def work() -> dict[str, float]:
            with self._work_lock:
                if self.specs:
                    return multi.eval_loss_by_policy(trainer.model, self.trainers, batch)
                return trainer.eval_loss(batch)

        return await asyncio.to_thread(work)

    def set_learning_rate_scale(self, scale: float) -> float:
        """A schedule's factor: every policy's optimizer at its own learning rate times
        ``scale``; returns the default policy's LR."""
        self._require_trainer()
        with self._work_lock:
            lrs = {name: t.set_learning_rate_scale(scale) for name, t in self.trainers.items()}
        return lrs[multi.DEFAULT_POLICY]

    async def sync_weights(self) -> int:
        _, engine = self._require_trainer()
        if engine is None:  # no sampler to copy to: the version still counts the syncs
            self._weight_version += 1
            return self._weight_version

        def work() -> int:
            with self._work_lock:
                if self.specs:
                    return self._sync_policies()
                return engine.update_weights(self._copy_weights_to_sampler)

        return await asyncio.to_thread(work)

    def _copy_weights_to_sampler(self) -> None:
        """Copy the trainable tensors (all of them for full fine-tuning, the adapters for LoRA)."""
        trainer, engine = self._require_started()
        if engine.model is trainer.model:
            return
        target = dict(engine.model.named_parameters())
        with torch.no_grad():
            for name, param in trainer.model.named_parameters():
                if param.requires_grad:
                    target[name].copy_(param)

    def _sync_policies(self, version: int | None = None) -> int:
        """Every policy's adapter into its sampler copy, all at one version (``version``: that
        one, else the next); returns it."""
        trainer, _ = self._require_started()
        for name, engine in self.engines.items():
            sampler = engine

            def apply(sampler: SamplerEngine = sampler, name: str = name) -> None:
                multi.copy_adapter(trainer.model, sampler.model, self._adapter_names[name])
                if version is not None:
                    sampler.weight_version = version - 1  # update_weights adds one

            engine.update_weights(apply)
        return self.engines[multi.DEFAULT_POLICY].weight_version

    async def save_checkpoint(self, path: Path) -> None:
        trainer, engine = self._require_trainer()

        def work() -> None:
            with self._work_lock:
                state = {
                    "weight_version": engine.weight_version if engine is not None else self._weight_version,
                    "optimizer_steps": trainer.optimizer_steps,
                    "model": self.config.model,
                }
                processor = trainer.vision.image_processor if trainer.vision is not None else None
                checkpoint.save(
                    Path(path), trainer.model, trainer.optimizer, self.tokenizer, state, processor
                )
                if self.specs:
                    multi.save_policies(Path(path), trainer.model, self._policy_optimizers())

        await asyncio.to_thread(work)

    async def load_checkpoint(self, path: Path) -> None:
        trainer, engine = self._require_trainer()

        def work() -> None:
            with self._work_lock:
                state = checkpoint.load(Path(path), trainer.model, trainer.optimizer)
                trainer.optimizer_steps = int(state.get("optimizer_steps", 0))
                version = int(state.get("weight_version", 0))
                if self.specs:
                    multi.load_policies(Path(path), trainer.model, self._policy_optimizers())
                    self._sync_policies(version)
                    return
                if engine is None:
                    self._weight_version = version
                    return
                sampler = engine

                def apply() -> None:
                    self._copy_weights_to_sampler()
                    sampler.weight_version = version - 1  # update_weights adds one

                sampler.update_weights(apply)

        await asyncio.to_thread(work)

    def _policy_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {n: t.optimizer for n, t in self.trainers.items() if n != multi.DEFAULT_POLICY}
