"""What each `rllm` command that writes a folder writes there: the table the run-folder contract
(:mod:`rllm.engine.training.run_folder`) reads, and docs/run-folders.md shows.

A kind is named after the command that writes it. Its ``markers`` say the folder holds an earlier
result (for a model folder: anything at all); ``outputs`` are what ``--overwrite`` removes (None:
everything in the folder, which is the model); ``resume`` is what ``--resume`` continues from
(None: the command cannot resume); ``changeable`` are the config keys ``--resume --allow-changes
KEY`` may let through, each with why that is safe; ``ignored`` keys are never compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from rllm.types.errors import InputError

RECORD_FILE = "rllm-run.json"  # the command and the resolved config a folder was written with

# Where a run of the same config would differ only in how it is shown, logged or paced.
_LOGGING = {
    "tensorboard": "a metrics sink: what is trained is unchanged",
    "wandb": "a metrics sink: what is trained is unchanged",
}
_TRAIN_CHANGEABLE = {
    "total_steps": "more (or fewer) steps of the same run: the data order and RNG go on from the checkpoint",
    "ckpt_every": "when checkpoints are written, not what is trained",
    "keep_checkpoints": "how many older checkpoints stay on disk, not what is trained",
    "val_every": "when validation runs (greedy, on its own tasks), not what is trained",
    "val_tasks": "how many validation tasks run, not what is trained",
    "sample_groups": "how many groups a step keeps for `rllm view`",
    "plot": "whether reward.png is drawn",
    "rollout.concurrency": "how many rollouts run at once: pace, not data",
    "rollout.workers": "how many processes run the flows: pace, not data",
    **_LOGGING,
}
_TRAIN_OUTPUTS = (
    "metrics.jsonl",
    "metrics.dropped.jsonl",
    "checkpoints",
    "samples",
    "tensorboard",
    "wandb",
    "reward.png",
)


@dataclass(frozen=True)
class FolderKind:
    name: str  # the command that writes it, as the user types it after `rllm`
    what: str  # what the folder holds, for messages ("a training run")
    markers: tuple[str, ...]  # any of these: an earlier result (empty: any entry at all)
    outputs: tuple[str, ...] | None  # what --overwrite removes; None: the folder's whole content
    resume: Literal["checkpoint", "results"] | None = None
    changeable: Mapping[str, str] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()

    @property
    def command(self) -> str:
        return f"rllm {self.name}"

    @property
    def family(self) -> str:
        """Kinds whose folders look alike on disk (for folders written before records existed)."""
        return FAMILY.get(self.name, self.name)


KINDS: dict[str, FolderKind] = {
    kind.name: kind
    for kind in (
        FolderKind(
            "train",
            "a training run",
            markers=("metrics.jsonl", "checkpoints", "samples"),
            outputs=_TRAIN_OUTPUTS,
            resume="checkpoint",
            changeable=_TRAIN_CHANGEABLE,
            # init_from: --resume continues from the run's own checkpoint (launch refuses both).
            ignored=("out_dir", "progress", "init_from"),
        ),
        FolderKind(
            "distill",
            "a distillation run",
            markers=("metrics.jsonl", "checkpoints", "samples"),
            outputs=_TRAIN_OUTPUTS,
            resume="checkpoint",
            changeable=_TRAIN_CHANGEABLE,
            ignored=("out_dir", "progress", "init_from"),
        ),
        FolderKind(
            "sft",
            "a supervised fine-tuning run",
            markers=("metrics.jsonl", "checkpoints"),
            outputs=(
                "metrics.jsonl",
                "metrics.dropped.jsonl",
                "checkpoints",
                "tensorboard",
                "wandb",
                "done.json",
            ),
            resume="checkpoint",
            changeable={
                "total_steps": "more (or fewer) steps: the batch plan is a pure function of the data and seed",
                "epochs": "more epochs append to the batch plan; the first epochs' batches are unchanged",
                "ckpt_every": "when checkpoints are written, not what is trained",
                "val_every": "when the held-out loss is measured (it decides early stopping)",
                "early_stop_patience": "when the run stops early, not what a step trains",
                **_LOGGING,
            },
            ignored=("out_dir", "progress"),
        ),
        FolderKind(
            "eval",
            "an evaluation",
            markers=("results.jsonl", "episodes.jsonl", "summary.json"),
            outputs=("results.jsonl", "episodes.jsonl", "summary.json"),
            resume="results",
            changeable={
                "attempts": "a task with fewer attempts is run again whole; its old line is replaced",
                "max_examples": "which tasks of the same split are evaluated; the summary counts those",
                "concurrency": "how many rollouts run at once: pace, not results",
                "workers": "how many processes run the flows: pace, not results",
                "max_infra_errors": "when the command exits 1: the results are unchanged",
                "base_url": "only for the same model served at another address",
                "api_base": "only for the same hosted model reached another way",
                "remote": "only for the same agent served at other addresses",
            },
            ignored=("progress",),
        ),
        FolderKind("export", "an exported model", markers=(), outputs=None),
        FolderKind("model init-tiny", "a tiny model", markers=(), outputs=None),
        FolderKind("model import", "an imported model", markers=(), outputs=None),
        # A set's folder ($RLLM_HOME/sft/NAME) is the set: --overwrite replaces it whole.
        FolderKind("dataset from-eval", "an SFT set", markers=("sft.jsonl",), outputs=None),
    )
}
FAMILY = {
    "train": "training",
    "distill": "training",
    "sft": "training",
    "export": "model",
    "model init-tiny": "model",
    "model import": "model",
}
# What a folder without a record holds, by what is in it (for messages): the first match.
LEGACY_SIGNS: tuple[tuple[str, str, str], ...] = (
    ("results.jsonl", "eval", "an evaluation (results.jsonl)"),
    ("summary.json", "eval", "an evaluation (summary.json)"),
    ("checkpoints", "train", "a training run (checkpoints/)"),
    ("metrics.jsonl", "train", "a training run (metrics.jsonl)"),
    ("samples", "train", "a training run (samples/)"),
    ("config.json", "export", "a model (config.json)"),
    ("adapter_config.json", "export", "a LoRA adapter (adapter_config.json)"),
    ("sft.jsonl", "dataset from-eval", "an SFT set (sft.jsonl)"),
)


def kind_named(name: str) -> FolderKind:
    try:
        return KINDS[name]
    except KeyError:
        raise InputError(f"no folder kind {name!r} (kinds: {', '.join(KINDS)})") from None


__all__ = ["FAMILY", "KINDS", "LEGACY_SIGNS", "RECORD_FILE", "FolderKind", "kind_named"]
