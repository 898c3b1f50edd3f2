"""Start a run from another run's weights (``init_from``): RL after SFT, or a second RL stage.

``init_from`` names a checkpoint directory (``RUN/checkpoints/step_N``) or a run directory, whose
latest complete checkpoint is taken. The backend restores that checkpoint's weights (and its
optimizer state: ``load_checkpoint`` restores both) and syncs them to its samplers before the first
rollout; the new run's step, data order and history start at 0. ``--resume`` of the new run wins
over ``init_from`` once the new run has a checkpoint of its own.
"""

from __future__ import annotations

from pathlib import Path

from rllm.engine.backend import Backend
from rllm.engine.training.checkpoint import latest_checkpoint
from rllm.types import ConfigError


def resolve_init_checkpoint(init_from: str) -> Path:
    """The checkpoint directory ``init_from`` names; a ConfigError before anything starts if none."""
    path = Path(init_from)
    if (path / "checkpoints").is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise ConfigError.for_key("init_from", f"run {path} has no complete checkpoint")
        path = found
    if not (path / "backend").is_dir() or not (path / "trainer_state.json").is_file():
        raise ConfigError.for_key(
            "init_from", f"{path} is not a checkpoint (expected RUN/checkpoints/step_N with backend/ inside)"
        )
    return path


async def init_weights(backend: Backend, checkpoint: Path) -> int:
    """Load ``checkpoint``'s weights into the started backend and sync them; returns the version."""
    await backend.load_checkpoint(checkpoint / "backend")
    return await backend.sync_weights()


__all__ = ["init_weights", "resolve_init_checkpoint"]
