"""What `rllm serve` and `rllm export` accept as a model: a run folder (its latest checkpoint, or
``--step N``), one checkpoint folder, a checkpoint's ``backend/`` folder, or a model folder.

Each answer names the model after the run and step (``say-step20``), and a path that is none of
these says which it is not ("does not exist" differs from "not a model").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rllm.cli.errors import CliError
from rllm.engine.training.checkpoint import latest_checkpoint
from rllm.engine.training.run_folder import holds_a_run

CHECKPOINT_STATE = "trainer_state.json"


@dataclass(frozen=True)
class RunModel:
    path: Path  # the folder with the weights: a checkpoint's backend/, or a model folder
    name: str  # the served name: RUN-stepN for checkpoints, the folder's name otherwise
    step: int | None = None


def step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix("step_"))


def _from_checkpoint(checkpoint: Path) -> RunModel:
    step = step_of(checkpoint)
    run = checkpoint.parent.parent.name or "model"
    backend = checkpoint / "backend"
    if not backend.is_dir():
        raise CliError(f"checkpoint {checkpoint} has no backend/ folder (was it cut short?)")
    return RunModel(path=backend, name=f"{run}-step{step}", step=step)


def resolve_run_model(path: Path, step: int | None = None) -> RunModel:
    """The weights folder and served name for ``path`` (see the module docstring)."""
    if not path.exists():
        raise CliError(f"{path} does not exist")
    if not path.is_dir():
        raise CliError(f"{path} is a file: name a run folder, a checkpoint folder or a model folder")
    if (path / CHECKPOINT_STATE).is_file():
        return _from_checkpoint(path)
    if path.name == "backend" and (path.parent / CHECKPOINT_STATE).is_file():
        return _from_checkpoint(path.parent)
    if (path / "checkpoints").is_dir() or holds_a_run(path):
        if step is not None:
            checkpoint = path / "checkpoints" / f"step_{step:06d}"
            if not (checkpoint / CHECKPOINT_STATE).is_file():
                have = sorted(
                    step_of(p)
                    for p in (path / "checkpoints").glob("step_*")
                    if (p / CHECKPOINT_STATE).is_file()
                )
                listed = ", ".join(map(str, have)) or "none"
                raise CliError(f"run folder {path} has no checkpoint of step {step} (steps: {listed})")
            return _from_checkpoint(checkpoint)
        latest = latest_checkpoint(path)
        if latest is None:
            raise CliError(
                f"run folder {path} has no checkpoint yet",
                hint="runs write one at the end (and every ckpt_every steps); --resume a cut run to finish it",
            )
        return _from_checkpoint(latest)
    if step is not None:
        raise CliError(f"--step needs a run folder; {path} is not one (no checkpoints/)")
    if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
        return RunModel(path=path, name=path.name)
    raise CliError(
        f"{path} is not a model: no config.json (a model folder), trainer_state.json (a checkpoint) "
        "or checkpoints/ (a run folder)"
    )
