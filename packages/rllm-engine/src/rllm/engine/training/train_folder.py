"""A training run's folder under the run-folder contract (:mod:`rllm.engine.training.run_folder`):
what it records, and its tiny model, kept only while it is the one the run would build.

The record holds the resolved TrainerConfig and what the cookbook runs (its flow and evaluator,
which ``--agent`` / ``--evaluator`` may replace), so ``--resume`` with another agent is refused
like any other change. ``rllm distill`` writes a folder of its own kind: a distillation run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from rllm.engine.training.checkpoint import latest_checkpoint, load_trainer_state
from rllm.engine.training.run_folder import RunFolder, object_name
from rllm.engine.training.trainer_config import TrainerConfig
from rllm.sdk.cookbook import Cookbook
from rllm.types import ConfigError
from rllm.types.errors import NothingToDo

TINY_KIND = "model init-tiny"


def run_kind(config: TrainerConfig) -> str:
    return "distill" if config.distill is not None else "train"


def train_settings(config: TrainerConfig, cookbook: Cookbook) -> dict[str, Any]:
    """What a training run's record holds and ``--resume`` compares."""
    return {
        **msgspec.to_builtins(config),
        "agent": object_name(cookbook.flow),
        "evaluator": object_name(cookbook.evaluator),
    }


def train_folder(config: TrainerConfig, cookbook: Cookbook) -> RunFolder:
    return RunFolder(config.out_dir, run_kind(config), train_settings(config, cookbook))


def check_train_folder(
    config: TrainerConfig,
    cookbook: Cookbook,
    *,
    resume: bool = False,
    overwrite: bool = False,
    allow_changes: Iterable[str] = (),
) -> None:
    """The run folder fits the request (reads only); ``init_from`` with ``--resume`` is refused:
    a resumed run goes on from its own checkpoint, never from other weights."""
    if resume and config.init_from:
        raise ConfigError.for_key(
            "init_from",
            "--resume continues the run from its own checkpoint; --init-from only starts a new run: drop it",
        )
    train_folder(config, cookbook).check(resume=resume, overwrite=overwrite, allow_changes=allow_changes)
    found = latest_checkpoint(Path(config.out_dir)) if resume else None
    if found is not None and (step := load_trainer_state(found).step) >= config.total_steps:
        raise RunFinished(
            f"{config.out_dir} finished at step {step} (total_steps={config.total_steps}): nothing to "
            f"resume; more steps: --resume --allow-changes total_steps total_steps=N"
        )


class RunFinished(NothingToDo):
    """``--resume`` of a run whose checkpoint is already at ``total_steps``: nothing to do (the
    CLI says so and exits 0, without starting anything)."""


def begin_train_folder(
    config: TrainerConfig,
    cookbook: Cookbook,
    *,
    resume: bool = False,
    overwrite: bool = False,
    allow_changes: Iterable[str] = (),
) -> Path | None:
    """Check the folder, clear it (``overwrite``), record the run; the checkpoint to resume from."""
    train_folder(config, cookbook).begin(resume=resume, overwrite=overwrite, allow_changes=allow_changes)
    return latest_checkpoint(Path(config.out_dir)) if resume else None


def ensure_tiny_model(path: Path, words: list[str], *, backend: str, backend_cls: Any, seed: int) -> Path:
    """The tiny model at ``path``, built from ``words`` and ``seed``: the one already there when
    it was built from exactly these (its record says so), else built again in its place. A
    folder that holds something other than a model is refused, never emptied."""
    vocab = hashlib.sha256(json.dumps(words).encode()).hexdigest()
    settings = {"backend": backend, "seed": seed, "words": len(words), "vocab_sha256": vocab}
    folder = RunFolder(path, TINY_KIND, settings, flag="tiny model")
    record = folder.record()
    if record is not None and record.config == folder.config and (path / "config.json").is_file():
        return path
    if record is None and folder.entries():
        folder.check(overwrite=True)  # refuses a folder that holds no model
    folder.clear()
    built = Path(backend_cls.init_tiny_model(path, vocab_words=words, seed=seed))
    folder.write_record(folder.new_record())
    return built


__all__ = [
    "RunFinished",
    "begin_train_folder",
    "check_train_folder",
    "ensure_tiny_model",
    "run_kind",
    "train_folder",
    "train_settings",
]
