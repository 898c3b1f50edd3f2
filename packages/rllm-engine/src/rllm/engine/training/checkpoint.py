"""Trainer checkpoints: backend state plus trainer state, written atomically.

Layout: ``OUT/checkpoints/step_000010/{backend/, trainer_state.json}``. A checkpoint directory
is built under a temporary name and renamed into place only when complete, so a ``kill -9``
mid-save never leaves a checkpoint that ``latest_checkpoint`` would pick.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

from rllm.engine.training.data_order import DataCursor
from rllm.engine.training.sampler_state import SamplerState


class TrainerState(msgspec.Struct, kw_only=True):
    step: int = 0  # optimizer steps completed
    data: DataCursor = msgspec.field(default_factory=DataCursor)
    weight_version: int = 0
    rng_state: list = msgspec.field(default_factory=list)  # random.getstate(), JSON-friendly
    # Asynchronous runs: tasks handed out (data cursor past them) but not yet trained on; a
    # resumed run runs them first, so no task is skipped or trained twice.
    unconsumed_task_ids: list[str] = msgspec.field(default_factory=list)
    # Each task's recent outcomes and the difficulty level (rllm.engine.training.task_sampler):
    # with the cursor, all a resumed run needs to draw the tasks the uninterrupted run would.
    sampler: SamplerState = msgspec.field(default_factory=SamplerState)
    # algorithm.dynamic_sampling: the last step's share of groups with a signal, which sizes the
    # next step's first round (rllm.engine.training.dynamic_sampling.first_round).
    signal_rate: float | None = None

    def capture_rng(self) -> None:
        version, internal, gauss = random.getstate()
        self.rng_state = [version, list(internal), gauss]

    def restore_rng(self) -> None:
        if self.rng_state:
            version, internal, gauss = self.rng_state
            random.setstate((version, tuple(internal), gauss))


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    return out_dir / "checkpoints" / f"step_{step:06d}"


KEEP_CHECKPOINTS = 2  # TrainerConfig.keep_checkpoints' default


def removed_line(path: Path, keep: int) -> str:
    """The run's line when ``save_checkpoint`` removes an older checkpoint."""
    return f"checkpoint {path} removed (keep_checkpoints={keep} keeps the newest {keep})"


async def save_checkpoint(
    out_dir: Path,
    state: TrainerState,
    save_backend: Callable[[Path], Awaitable[None]],
    keep: int = KEEP_CHECKPOINTS,
    removed: Callable[[Path], None] | None = None,
) -> Path:
    """Write backend + trainer state for ``state.step``; keep only the newest ``keep`` checkpoints
    (each older one removed is passed to ``removed``, which says so in the run's output)."""
    final = checkpoint_dir(out_dir, state.step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "backend").mkdir(parents=True)
    await save_backend(tmp / "backend")
    state.capture_rng()
    (tmp / "trainer_state.json").write_bytes(msgspec.json.encode(state))
    _fsync_dir(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    for old in _complete_checkpoints(out_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
        if removed is not None:
            removed(old)
    return final


def latest_checkpoint(out_dir: Path) -> Path | None:
    done = _complete_checkpoints(out_dir)
    return done[-1] if done else None


def load_trainer_state(path: Path) -> TrainerState:
    return msgspec.json.decode((path / "trainer_state.json").read_bytes(), type=TrainerState)


def _complete_checkpoints(out_dir: Path) -> list[Path]:
    root = out_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.iterdir()
        if p.name.startswith("step_") and (p / "trainer_state.json").is_file() and not p.name.endswith(".tmp")
    )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
