"""Supervised fine-tuning on chat data with the same backends, checkpoints and metrics as RL.

    chat JSONL -> rllm.engine.data.chat_data (assistant-only loss masks, the model's chat template)
    -> token-budget batches, reshuffled each epoch (seeded) -> backend.train_step with rllm.algos'
    ``cross_entropy`` loss -> metrics.jsonl / TensorBoard -> held-out loss every ``val_every``
    (early stop) -> OUT/checkpoints/step_N (the same layout ``rllm train --resume`` reads)

The batch plan is a pure function of the lengths, ``batch_tokens``, ``epochs`` and ``seed``, so
``--resume`` continues at the restored step with exactly the batches the run would have seen.
The last step always writes a checkpoint: that is what an RL run's ``init_from`` starts from.
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec

from rllm.algos.config import AlgorithmConfig
from rllm.engine.backend import Backend
from rllm.engine.data.chat_data import ChatExample, ChatTokenizer, tokenize_all
from rllm.engine.data.chat_sources import ChatColumns, read_chat_source
from rllm.engine.data.stored_ids import check_stored_ids
from rllm.engine.training.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_trainer_state,
    save_checkpoint,
)
from rllm.engine.training.metrics_log import MetricsLogger, truncate_history
from rllm.engine.training.run_folder import RunFolder
from rllm.engine.training.train_progress import LOSS, TrainProgress
from rllm.engine.training.trainer_config import BackendSection
from rllm.types import ConfigError, TrainSequence
from rllm.types.config_file import apply_overrides, convert_config, merge_config, read_config_file

SFT_ALGORITHM = AlgorithmConfig(loss="cross_entropy", tis="none")
T = TypeVar("T")


class SFTConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # OpenAI chat JSONL ({"messages": [...], "tools": [...]} a line), hf:NAME[:SPLIT] (a hub
    # dataset or a folder of data files) or a datasets.save_to_disk folder (rllm.engine.data.chat_sources)
    dataset: str
    val_dataset: str | None = None  # held-out conversations (same forms, same columns)
    columns: ChatColumns = msgspec.field(default_factory=ChatColumns)  # Hugging Face datasets' columns
    seed: int = 0
    epochs: int = 1
    total_steps: int = 0  # 0: as many steps as `epochs` take
    batch_tokens: int = 4096  # a batch takes conversations until their tokens reach this
    max_tokens: int = 0  # cut longer conversations (0: keep whole)
    warmup_steps: int = 0
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"  # after warmup, towards 0
    val_every: int = 0
    early_stop_patience: int = 0  # stop after this many held-out losses without a new best (0: never)
    ckpt_every: int = 0  # the last step is always checkpointed
    out_dir: str = "runs/sft"
    tensorboard: bool = False
    wandb: bool = False
    progress: bool = True
    # Stored ids of another tokenizer (or of an unknown one): tokenize the messages again, with a
    # warning, instead of refusing the set (rllm.engine.data.stored_ids).
    retokenize: bool = False
    backend: BackendSection = msgspec.field(default_factory=BackendSection)

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError.for_key(name, f"{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "total_steps",
            "max_tokens",
            "warmup_steps",
            "val_every",
            "early_stop_patience",
            "ckpt_every",
        ):
            if getattr(self, name) < 0:
                raise ConfigError.for_key(name, f"{name} must be >= 0, got {getattr(self, name)}")
        if self.val_every and not self.val_dataset:
            raise ConfigError.for_key("val_dataset", "val_every is set but val_dataset is not")
        if self.early_stop_patience and not self.val_every:
            raise ConfigError.for_key("early_stop_patience", "early stopping needs val_every > 0")


def load_sft_config(
    path: str | Path | None, overrides: list[str] | tuple[str, ...] = (), base: dict[str, Any] | None = None
) -> SFTConfig:
    """``base``, then a TOML/YAML/JSON file, then ``key.sub=value`` overrides, validated."""
    doc: dict[str, Any] = dict(base or {})
    if path is not None:
        doc = merge_config(doc, read_config_file(path))
    return convert_config(apply_overrides(doc, overrides), SFTConfig)


def plan_batches(
    lengths: list[int], batch_tokens: int, epochs: int, seed: int
) -> list[tuple[int, list[int]]]:
    """Every step's (epoch, sequence indices): each epoch a seeded shuffle cut into token-budget batches.

    A batch takes sequences until their tokens reach ``batch_tokens`` (a longer sequence is a batch
    of its own); a short last batch of an epoch is kept, so every sequence is seen once per epoch.
    """
    plan: list[tuple[int, list[int]]] = []
    for epoch in range(epochs):
        order = list(range(len(lengths)))
        random.Random(f"{seed}/{epoch}").shuffle(order)
        batch: list[int] = []
        tokens = 0
        for index in order:
            if batch and tokens + lengths[index] > batch_tokens:
                plan.append((epoch, batch))
                batch, tokens = [], 0
            batch.append(index)
            tokens += lengths[index]
        if batch:
            plan.append((epoch, batch))
    return plan


def lr_scale(step: int, total: int, warmup: int, schedule: str) -> float:
    """The learning-rate factor for optimizer step ``step`` (0-based) of ``total``."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    progress = (step - warmup) / (total - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class SFTResult(msgspec.Struct, kw_only=True):
    steps: int
    out_dir: str
    first_loss: float | None
    final_loss: float | None
    best_val_loss: float | None
    stopped_early: bool
    checkpoint: str | None
    wall_s: float


def check_backend(config: SFTConfig, backend: Backend) -> None:
    """Refuse, before anything starts, SFT or a held-out loss / LR schedule the backend cannot do."""
    try:
        backend.validate(SFT_ALGORITHM)
    except ValueError as exc:
        raise ConfigError(f"backend {config.backend.name!r} cannot run SFT: {exc}") from None
    wants = [
        ("val_every", config.val_every > 0, "eval_loss"),
        ("warmup_steps", config.warmup_steps > 0, "set_learning_rate_scale"),
        ("lr_schedule", config.lr_schedule != "constant", "set_learning_rate_scale"),
    ]
    reason_of = getattr(backend, "supports_sft_extras", None)
    reason = reason_of() if callable(reason_of) else None
    for key, wanted, method in wants:
        if wanted and (reason or not hasattr(backend, method)):
            why = reason or f"it has no `{method}`"
            raise ConfigError.for_key(key, f"backend {config.backend.name!r} cannot do this: {why}")


class _Progress:
    """What a run has done so far (the step, losses, best held-out loss, last checkpoint)."""

    def __init__(self) -> None:
        self.state = TrainerState()
        self.losses: list[float] = []
        self.best: float | None = None
        self.stale = 0
        self.stopped = False
        self.checkpoint: Path | None = None


class SFTRunner:
    """One SFT job: chat data tokenized with the backend's tokenizer, trained with cross entropy.

    Stored ids (a set ``rllm dataset from-eval`` wrote) are trained as they are only when they
    were made with this tokenizer (rllm.engine.data.stored_ids); ``retokenize`` tokenizes their
    messages again instead, with a warning in ``warnings``."""

    def __init__(self, config: SFTConfig, backend: Backend, tokenizer: ChatTokenizer) -> None:
        self.config = config
        self.backend = backend
        self.out_dir = Path(config.out_dir)
        self.interrupted = False
        self.interrupt_reported = False  # Ctrl-C: its line is printed (the CLI adds none)
        self.warnings: list[str] = []
        check_backend(config, backend)
        self.train = self._tokenized(tokenizer, config.dataset)
        self.val = self._tokenized(tokenizer, config.val_dataset) if config.val_dataset else []
        self.plan = plan_batches(
            [len(s.input_ids) for s in self.train], config.batch_tokens, config.epochs, config.seed
        )
        if config.total_steps:
            self.plan = self.plan[: config.total_steps]

    async def fit(
        self, resume: bool = False, overwrite: bool = False, allow_changes: Iterable[str] = ()
    ) -> SFTResult:
        """Train the plan (from the latest checkpoint on ``resume``), under the run-folder
        contract (:mod:`rllm.engine.training.run_folder`). Ctrl-C finishes the step in flight and
        checkpoints it (a second Ctrl-C skips that), so ``--resume`` goes on from there."""
        cfg = self.config
        started = time.perf_counter()
        sft_folder(cfg).begin(resume=resume, overwrite=overwrite, allow_changes=allow_changes)
        found = latest_checkpoint(self.out_dir) if resume else None
        run = _Progress()
        await self.backend.start()
        metrics_log: MetricsLogger | None = None
        try:
            if found is not None:
                run.state = load_trainer_state(found)
                await self.backend.load_checkpoint(found / "backend")
            truncate_history(self.out_dir, run.state.step)
            metrics_log = MetricsLogger(
                self.out_dir, tensorboard=cfg.tensorboard, wandb=cfg.wandb, config=msgspec.to_builtins(cfg)
            )
            await self._steps(run, metrics_log)
        finally:
            if metrics_log is not None:
                metrics_log.close()
            await self.backend.close()
        return SFTResult(
            steps=run.state.step,
            out_dir=str(self.out_dir),
            first_loss=run.losses[0] if run.losses else None,
            final_loss=run.losses[-1] if run.losses else None,
            best_val_loss=run.best,
            stopped_early=run.stopped,
            checkpoint=str(run.checkpoint) if run.checkpoint else None,
            wall_s=time.perf_counter() - started,
        )

    async def _steps(self, run: _Progress, metrics_log: MetricsLogger) -> None:
        cfg, state, total = self.config, run.state, len(self.plan)
        saved = state.step  # a resumed run starts from a checkpoint of this step
        with TrainProgress(total, start=state.step, enabled=cfg.progress, shown=LOSS) as progress:
            if cfg.val_every and state.step == 0 and not self.interrupted:
                run.best = await self._finish(self._held_out_loss(), "the held-out loss")
                metrics_log.log(0, {"val/loss": run.best})
            while state.step < total and not self.interrupted:
                metrics = await self._finish(
                    self._train_one_step(state.step, total), f"step {state.step + 1}"
                )
                state.step += 1
                run.losses.append(metrics["train/loss"])
                if cfg.val_every and state.step % cfg.val_every == 0 and not self.interrupted:
                    val = await self._finish(self._held_out_loss(), "the held-out loss")
                    metrics["val/loss"] = val
                    if run.best is None or val < run.best:
                        run.best, run.stale = val, 0
                    else:
                        run.stale += 1
                    run.stopped = bool(cfg.early_stop_patience) and run.stale >= cfg.early_stop_patience
                metrics_log.log(state.step, metrics)
                progress.update(state.step, metrics)
                if (
                    state.step == total
                    or run.stopped
                    or (cfg.ckpt_every and state.step % cfg.ckpt_every == 0)
                ):
                    run.checkpoint = await self._finish(
                        save_checkpoint(self.out_dir, state, self.backend.save_checkpoint), "the checkpoint"
                    )
                    saved = state.step
                if run.stopped:
                    break
        if self.interrupted:
            if state.step != saved:
                await save_checkpoint(self.out_dir, state, self.backend.save_checkpoint)
            if state.step:
                print(f"checkpoint of step {state.step} saved: --resume goes on from it", file=sys.stderr)
            raise asyncio.CancelledError

    async def _finish(self, work: Awaitable[T], what: str) -> T:
        """``work``, run to its end even when Ctrl-C (the task's cancellation) comes meanwhile: a
        step cut in the middle would leave weights no checkpoint can name. The first Ctrl-C says
        so and stops the run after it; a second one (KeyboardInterrupt) abandons everything."""
        task = asyncio.ensure_future(work)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if self.interrupted:
                task.cancel()
                raise
            self.interrupted = self.interrupt_reported = True
            print(
                f"interrupted: finishing {what}, then saving a checkpoint (Ctrl-C again to skip)",
                file=sys.stderr,
                flush=True,
            )
            return await task

    def _tokenized(self, tokenizer: ChatTokenizer, source: str) -> list[TrainSequence]:
        examples = read_chat_source(source, self.config.columns)
        examples, warnings = check_stored_ids(examples, tokenizer, source, retokenize=self.config.retokenize)
        self.warnings += warnings
        return tokenize_all(tokenizer, examples, self.config.max_tokens)

    async def _train_one_step(self, step: int, total: int) -> dict[str, Any]:
        cfg = self.config
        epoch, indices = self.plan[step]
        batch = [self.train[i] for i in indices]
        scale = 1.0
        if cfg.warmup_steps or cfg.lr_schedule != "constant":
            scale = lr_scale(step, total, cfg.warmup_steps, cfg.lr_schedule)
            self.backend.set_learning_rate_scale(scale)  # pyright: ignore[reportAttributeAccessIssue]
        t0 = time.perf_counter()
        train = await self.backend.train_step(batch, SFT_ALGORITHM)
        return {
            **{f"train/{k}": v for k, v in train.items()},
            "train/sequences": len(batch),
            "train/trained_tokens": trained_tokens(batch),
            "train/lr_scale": scale,
            "epoch": epoch,
            "time/train_s": time.perf_counter() - t0,
        }

    async def _held_out_loss(self) -> float:
        """Mean per-token NLL of the held-out set, in ``batch_tokens`` chunks, weighted by tokens."""
        total, count = 0.0, 0.0
        for _, indices in plan_batches([len(s.input_ids) for s in self.val], self.config.batch_tokens, 1, 0):
            out = await self.backend.eval_loss([self.val[i] for i in indices])  # pyright: ignore[reportAttributeAccessIssue]
            total += out["loss"] * out["num_tokens"]
            count += out["num_tokens"]
        return total / count


def sft_folder(config: SFTConfig) -> RunFolder:
    """The run folder of an SFT run, recording its resolved config."""
    return RunFolder(config.out_dir, "sft", msgspec.to_builtins(config))


def trained_tokens(batch: list[TrainSequence]) -> int:
    return int(sum(sum(s.loss_mask[1:]) for s in batch))


def chat_vocabulary(examples: list[ChatExample]) -> list[str]:
    """The words of every message (first-seen order): the tiny model's tokenizer covers them."""
    import re

    words: dict[str, None] = {}
    for example in examples:
        for message in example.messages:
            content = message.get("content")
            if isinstance(content, str):
                words.update(dict.fromkeys(re.findall(r"\w+|[^\w\s]", content)))
    return list(words)


__all__ = [
    "SFT_ALGORITHM",
    "SFTConfig",
    "SFTResult",
    "SFTRunner",
    "chat_vocabulary",
    "check_backend",
    "load_sft_config",
    "lr_scale",
    "plan_batches",
    "sft_folder",
]
