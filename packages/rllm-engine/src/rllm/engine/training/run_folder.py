"""The run folder's lifecycle: a fresh run refuses to write over an earlier one, a resume refuses
to start from nothing.

Both mistakes used to be silent (a re-run deleted the earlier samples; ``--resume`` with no
checkpoint trained from step 0), so both are checked before anything is built: ``--overwrite``
replaces an earlier run, ``--resume`` continues it, and neither guesses.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rllm.engine.training.checkpoint import latest_checkpoint
from rllm.types.errors import RLLMError

# What a training run writes into its folder; ``--overwrite`` removes exactly these (never the
# whole folder: ``--out .`` must not delete the user's files). ``tiny-model/`` is kept: it is
# rebuilt identically from the same seed, so keeping it only saves time.
RUN_OUTPUTS: tuple[str, ...] = (
    "metrics.jsonl",
    "metrics.dropped.jsonl",
    "checkpoints",
    "samples",
    "tensorboard",
    "wandb",
    "reward.png",
)
# Any of these means the folder holds an earlier run.
RUN_MARKERS: tuple[str, ...] = ("metrics.jsonl", "checkpoints", "samples")


class RunFolderError(RLLMError, ValueError):
    """The run folder does not fit the request: nothing to resume, or an earlier run in the way."""


def holds_a_run(out_dir: Path) -> bool:
    return any((out_dir / name).exists() for name in RUN_MARKERS)


def check_run_folder(out_dir: Path, *, resume: bool = False, overwrite: bool = False) -> Path | None:
    """The checkpoint to resume from (None for a fresh run); RunFolderError when the folder does
    not fit. Reads only: safe to call before anything is built."""
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite contradict each other: pick one")
    if resume:
        if not out_dir.is_dir():
            raise RunFolderError(f"--resume: run folder {out_dir} does not exist (nothing to resume)")
        ckpt = latest_checkpoint(out_dir)
        if ckpt is None:
            raise RunFolderError(
                f"--resume: run folder {out_dir} has no complete checkpoint "
                f"({out_dir / 'checkpoints'}/step_*/trainer_state.json); nothing to resume"
            )
        return ckpt
    if out_dir.exists() and not out_dir.is_dir():
        raise RunFolderError(f"run folder {out_dir} is a file, not a folder")
    if holds_a_run(out_dir) and not overwrite:
        raise RunFolderError(
            f"run folder {out_dir} already holds a run: pass --resume to continue it, "
            "--overwrite to replace it, or --out for another folder"
        )
    return None


def prepare_run_folder(out_dir: Path, *, resume: bool = False, overwrite: bool = False) -> Path | None:
    """``check_run_folder``, then (with ``overwrite``) remove the earlier run's outputs."""
    ckpt = check_run_folder(out_dir, resume=resume, overwrite=overwrite)
    if overwrite:
        for name in RUN_OUTPUTS:
            path = out_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    return ckpt
