"""VerlBackend: the ``verl`` entry point of ``rllm.backends`` (``rllm train NAME --backend verl``).

Options are parsed and checked when the backend is built, before Ray starts; every error names
its ``backend.options`` key. ``start`` brings up verl's workers and rollout servers (ray_cluster);
``train_step`` turns the Trainer's TrainSequences into a DataProto and runs one update with
rllm.algos' loss inside verl's engine; ``sync_weights`` uses verl's checkpoint engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rllm.algos.config import AlgorithmConfig
from rllm.algos.registry import get_loss
from rllm.backends.verl.config import NO_ROLLOUT, VerlBackendConfig, parse_config
from rllm.backends.verl.sft import LocalTrainer, check_no_rollout, runs_in_process
from rllm.engine.backend_base import BackendBase
from rllm.types import TrainSequence
from rllm.types.errors import InputError, NotFoundError, StateError

STATE_FILE = "rllm_verl_state.json"


class VerlBackend(BackendBase[VerlBackendConfig]):
    """Implements rllm.engine's Backend protocol on verl (Ray, FSDP/Megatron, vLLM/SGLang)."""

    policies_refusal = (
        "its actor workers hold one model and one optimizer (an adapter per policy is not built)"
    )

    name = "verl"
    options_type = VerlBackendConfig
    requires = ("verl", "tensordict")  # the `verl` extra
    install = "rllm-backend-verl[verl]"

    def __init__(
        self, options: VerlBackendConfig | Mapping[str, Any] | None = None, **overrides: Any
    ) -> None:
        super().__init__(options, **overrides)
        self._algo: AlgorithmConfig | None = None
        self._cluster: Any = None
        self._version = 0
        self._step = 0
        self._pad_id: int | None = None

    @staticmethod
    def init_tiny_model(path: str | Path, vocab_words: Iterable[str] = (), seed: int = 0) -> Path:
        """A tiny random Llama (head_dim 64, servable by vLLM) + word-level tokenizer."""
        from rllm.tiny import init_tiny_model

        return init_tiny_model(path, vocab_words=vocab_words, seed=seed)

    # Backend protocol ------------------------------------------------------------------------
    def validate(self, algo: AlgorithmConfig) -> None:
        """Every rLLM algorithm option is honoured but the top-k distillation losses: the loss is
        rllm.algos' own code running inside verl's engine, and the trainer's logprobs come back
        for ``max_mismatch``. Only the model must be named (before Ray starts)."""
        if not self.config.model:
            raise InputError("backend.options.model: name the policy model (a local path or hub name)")
        if get_loss(algo.loss).teacher_topk:
            raise InputError(
                f"`loss` = {algo.loss!r} (distill.loss=topk): the verl backend's actor computes logprobs "
                "of the sampled tokens only, not the student's logprobs of the teacher's top-k; set "
                "distill.loss=sampled"
            )
        engine = self.config.rollout.engine
        if engine == NO_ROLLOUT:
            check_no_rollout(algo)
        elif self.config.cluster.device == "cpu" and engine != "external":
            raise InputError(
                "backend.options.cluster.device: 'cpu' needs rollout.engine = 'external' (running "
                "vLLM servers), or 'none' for `rllm sft`: verl's own vLLM and SGLang rollout "
                "servers need GPUs"
            )
        # algorithm.max_mismatch is honoured: train_step records the trainer's logprobs.
        self._algo = algo

    async def start(self) -> None:
        from rllm.backends.verl.ray_cluster import RayCluster

        if self._algo is None:
            raise StateError(
                "VerlBackend.start: call validate(algo) first (it decides whether a reference policy runs)"
            )
        if runs_in_process(self.config):  # rllm sft on one CPU rank: no Ray (sft.py)
            # Built on this thread: verl's engine set-up expects the main thread, as in the CLI.
            self._cluster = LocalTrainer(self.config, self._algo)
            return
        cluster = RayCluster(self.config, self._algo)
        try:
            await cluster.start()
        except BaseException:
            cluster.close()  # a half-started cluster: its Ray, workers and weights directory
            raise
        self._cluster = cluster

    @classmethod
    def parse_options(
        cls, options: VerlBackendConfig | Mapping[str, Any] | None = None, **overrides: Any
    ) -> VerlBackendConfig:
        return parse_config(options, **overrides)  # with the cross-field checks

    def _started(self) -> Any:
        return self.require_started(self._cluster)

    def inference_urls(self) -> list[str]:
        return self._started().inference_urls()

    def served_model_name(self) -> str:
        return self.config.resolved_served_model_name()

    def tokenizer_path(self) -> str | None:
        return self.config.model if Path(self.config.model).is_dir() else None

    def validate_images(self) -> None:
        """Images train (``rllm.backends.verl.vision``: pixel inputs and M-RoPE positions)."""

    async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        from rllm.backends.verl.actor import update_policy
        from rllm.backends.verl.convert import record_trainer_logprobs, to_data_proto
        from rllm.backends.verl.loss import OLD_LOG_PROBS, RllmPolicyLoss
        from rllm.backends.verl.vision import vision_rows_for

        cluster = self._started()
        if algo != cluster.algo:
            cluster.set_loss(algo)
        await cluster.release_rollout_memory()
        data = to_data_proto(
            batch, pad_token_id=self._pad_token_id(), vision=vision_rows_for(self.config.model)
        )
        # Read back from the optimizer: verl's own "lr" is its scheduler's after the step.
        lr = await asyncio.to_thread(cluster.learning_rate)
        metrics = await asyncio.to_thread(
            update_policy,
            cluster.actor(),
            data,
            RllmPolicyLoss(algo),
            ref=cluster.reference(),
            mini_batches=self.config.mini_batches,
            epochs=self.config.ppo_epochs,
            shuffle=self.config.shuffle,
            seed=self.config.seed + self._step,
            batching=self.batching(),
        )
        # Token truth: the policy's logprobs before this update, onto the sequences (the engine
        # compares them with the sampler's: rllm.engine.training.mismatch).
        record_trainer_logprobs(batch, data.batch[OLD_LOG_PROBS])
        self._step += 1
        return {**metrics, "lr": lr}

    # Supervised fine-tuning (rllm.engine.data.sft): held-out loss and the LR schedule, on the
    # in-process trainer and on Ray workers alike (sft.py).
    def supports_sft_extras(self) -> str | None:
        """None: ``eval_loss`` and ``set_learning_rate_scale`` work on every cluster layout."""
        return None

    async def eval_loss(self, batch: list[TrainSequence]) -> dict[str, float]:
        """Held-out NLL of the loss-mask tokens (mean per token): a forward-only pass, no update."""
        from rllm.backends.verl.actor import held_out_loss
        from rllm.backends.verl.convert import to_data_proto
        from rllm.backends.verl.vision import vision_rows_for

        data = to_data_proto(
            batch, pad_token_id=self._pad_token_id(), vision=vision_rows_for(self.config.model)
        )
        return await asyncio.to_thread(held_out_loss, self._started().actor(), data, batching=self.batching())

    def set_learning_rate_scale(self, scale: float) -> float:
        """The next update's LR: ``optim.lr * scale`` on every rank's optimizer (a schedule's factor)."""
        return self._started().set_learning_rate(self.config.lr * scale)

    def batching(self) -> Any:
        """How verl's workers cut this backend's batches (actor.Batching)."""
        from rllm.backends.verl.actor import Batching

        c = self.config
        return Batching(
            dp_size=c.data_parallel_size,
            micro_batch_size=c.micro_batch_size_per_gpu,
            log_prob_micro_batch_size=c.log_prob_micro_batch_size_per_gpu,
            dynamic=c.use_dynamic_bsz,
        )

    async def sync_weights(self) -> int:
        self._version += 1
        await self._started().sync_weights(self._version)
        return self._version

    async def save_checkpoint(self, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._started().save_checkpoint, str(path), self._version)
        state = {"weight_version": self._version, "train_steps": self._step}
        (path / STATE_FILE).write_text(json.dumps(state))

    async def load_checkpoint(self, path: Path) -> None:
        path = Path(path)
        state_file = path / STATE_FILE
        if not state_file.is_file():
            raise NotFoundError(f"{path}: not a verl backend checkpoint (no {STATE_FILE})")
        await asyncio.to_thread(self._started().load_checkpoint, str(path))
        state = json.loads(state_file.read_text())
        # The Trainer syncs the restored weights to the samplers next, as a new version.
        self._version, self._step = int(state["weight_version"]), int(state["train_steps"])

    async def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def _pad_token_id(self) -> int:
        if self._pad_id is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.config.model)
            pad = tokenizer.pad_token_id
            self._pad_id = int(pad if pad is not None else tokenizer.eos_token_id)
        return self._pad_id
