"""Start a run from another run's weights (``init_from``): RL after SFT, or a second RL stage.

``init_from`` names a checkpoint directory (``RUN/checkpoints/step_N``) or a run directory, whose
latest complete checkpoint is taken. The backend restores that checkpoint's weights (and its
optimizer state: ``load_checkpoint`` restores both) and syncs them to its samplers before the first
rollout; the new run's step, data order and history start at 0. ``--resume`` continues a run from
its own checkpoint: ``init_from`` with it is refused (rllm.engine.training.train_folder).

Before the backend loads anything, :func:`check_init_model` compares the checkpoint's model with
the run's (rllm.engine.training.model_check): another vocab or hidden size, or another tokenizer,
is refused in one line naming both models, not found by ``load_checkpoint`` once all is loaded.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rllm.engine.backend import Backend
from rllm.engine.training.checkpoint import latest_checkpoint
from rllm.engine.training.model_check import checkpoint_model, model_signature, signature_differences
from rllm.types import ConfigError

log = logging.getLogger(__name__)


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


def check_init_model(checkpoint: Path, run_model: str) -> None:
    """Refuse a checkpoint whose model is not the run's ``run_model``: another tokenizer, vocab
    size or hidden size (a ConfigError for ``init_from`` naming both)."""
    source = checkpoint_model(checkpoint)
    if source is None:
        log.warning("init_from: cannot tell which model %s holds; its shape is not checked", checkpoint)
        return
    if source == run_model or Path(source).resolve() == Path(run_model).resolve():
        return  # the very model: nothing to load to know it
    theirs, ours = model_signature(source), model_signature(run_model)
    differences = signature_differences(theirs, ours)
    if differences:
        raise ConfigError.for_key(
            "init_from",
            f"{checkpoint} holds weights of another model than this run's ({'; '.join(differences)}: "
            f"checkpoint's model {source} vs the run's {run_model}); train the checkpoint's model "
            f"(backend.options.model={source}) or start from a checkpoint of this one",
        )


async def init_weights(backend: Backend, checkpoint: Path) -> int:
    """Load ``checkpoint``'s weights into the started backend and sync them; returns the version."""
    await backend.load_checkpoint(checkpoint / "backend")
    return await backend.sync_weights()


__all__ = ["check_init_model", "init_weights", "resolve_init_checkpoint"]
