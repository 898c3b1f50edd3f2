"""``rllm train NAME --sft DATASET``: supervised fine-tuning, then RL from its weights, in one process.

    OUT/sft/    a normal SFT run (rllm.engine.data.sft): checkpoints/, metrics.jsonl, and done.json once
                the phase has finished
    OUT/        the RL run, started from OUT/sft's final checkpoint exactly as ``init_from`` starts
                one (rllm.engine.training.init_from: the same load_checkpoint + sync_weights)

Two commands (``rllm sft`` then ``rllm train --init-from``) pay the start-up twice (imports of
torch, transformers and openai, tokenizer and model loads: ~7-8 s each on the dev VM); this pays it
once. Each phase still makes and starts its own backend (SFT's with its ``sft_option_defaults``:
no sampler on the local Tinker service), one after the other.

Settings: the SFT phase runs on the RL run's backend and model with the RL run's backend options
(LoRA, dtype, learning rate, ...) and seed; ``sft.KEY=VALUE`` sets an SFTConfig key for it
(``sft.epochs=30``, ``sft.batch_tokens=128``), ``sft.backend.options.KEY=VALUE`` a backend option
for the SFT phase alone (``sft.backend.options.learning_rate=3e-3``). The dataset, the folder, the
backend and the model are the command's, not settable under ``sft.``.

Everything is checked before any work: both configs (a mistyped ``sft.`` key is refused by its
full name), the dataset's presence, the SFT backend's options and its support for SFT, both run
folders, then the RL backend's options and algorithm. ``--resume``: a finished SFT phase is not
redone; an unfinished one resumes from its latest checkpoint; RL resumes from its own checkpoint,
or (interrupted before its first one) starts again from the SFT checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from rllm.engine.data.chat_sources import is_hf_source
from rllm.engine.data.sft import SFTConfig, SFTResult, load_sft_config, sft_folder
from rllm.engine.data.sft_launch import sft_backend, sft_runner
from rllm.engine.training.checkpoint import latest_checkpoint
from rllm.engine.training.launch import assemble_trainer, load_train_config, model_path
from rllm.engine.training.run_folder import RunFolder, RunFolderError, holds_a_run, split_keys
from rllm.engine.training.train_folder import train_folder
from rllm.engine.training.trainer import Trainer
from rllm.engine.training.trainer_config import TrainerConfig
from rllm.sdk.cookbook import Cookbook
from rllm.types import ConfigError

SFT_PREFIX = "sft."
SFT_FOLDER = "sft"
DONE_FILE = "done.json"  # OUT/sft/done.json: the finished phase's SFTResult
# SFTConfig keys the command sets itself, and why.
FIXED_KEYS = {
    "dataset": "the dataset is --sft's argument",
    "out_dir": "the SFT phase writes OUT/sft (set --out)",
    "backend.name": "the SFT phase runs on the RL run's backend (set --backend or backend.name)",
    "backend.options.model": "the SFT phase trains the RL run's model (set backend.options.model)",
}


def split_overrides(overrides: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the RL run's overrides, the SFT phase's with ``sft.`` taken off), in their order."""
    rl: list[str] = []
    sft: list[str] = []
    for item in overrides:
        if item.startswith(SFT_PREFIX):
            sft.append(item.removeprefix(SFT_PREFIX))
        else:
            rl.append(item)
    return rl, sft


class WarmStart:
    """One ``rllm train --sft`` job, checked and assembled: :meth:`run_sft`, then
    :meth:`rl_trainer`'s ``fit(resume=self.rl_resume, overwrite=self.rl_overwrite)``."""

    def __init__(
        self,
        trainer: Trainer,
        sft_config: SFTConfig,
        *,
        resume: bool,
        overwrite: bool,
        allow_changes: tuple[list[str], list[str]] = ([], []),
    ) -> None:
        self.trainer = trainer
        self.sft_config = sft_config
        self.sft_dir = Path(sft_config.out_dir)
        self.resume = resume
        self.overwrite = overwrite
        # --allow-changes, split as the overrides are: (RL's keys, the SFT phase's without `sft.`)
        self.rl_allow_changes, self.sft_allow_changes = allow_changes
        # RL continues its own checkpoint when it has one (then the SFT phase is long finished).
        self.rl_resume = resume and latest_checkpoint(trainer.out_dir) is not None
        # RL interrupted before its first checkpoint starts again from the SFT weights: its partial
        # rows go (fit's --overwrite removes the RL outputs only, never OUT/sft).
        self.rl_overwrite = overwrite or (resume and not self.rl_resume)

    @property
    def sft_finished(self) -> bool:
        return (self.sft_dir / DONE_FILE).is_file()

    async def run_sft(self) -> SFTResult | None:
        """Train the SFT phase (resuming an unfinished one on ``--resume``); None when there is
        nothing to do: a resumed run whose SFT phase finished earlier."""
        if self.resume and (self.rl_resume or self.sft_finished):
            return None
        runner = sft_runner(self.sft_config)
        resume = self.resume and latest_checkpoint(self.sft_dir) is not None
        result = await runner.fit(
            resume=resume,
            overwrite=self.overwrite,
            allow_changes=self.sft_allow_changes if resume else (),
        )
        (self.sft_dir / DONE_FILE).write_bytes(msgspec.json.encode(result))
        return result

    def rl_trainer(self) -> Trainer:
        """The RL Trainer, starting from the SFT phase's final checkpoint (``init_from``)."""
        checkpoint = latest_checkpoint(self.sft_dir)
        if checkpoint is None:
            if self.rl_resume:  # RL's own checkpoint is what it resumes from
                return self.trainer
            raise RunFolderError(f"the SFT phase left no checkpoint in {self.sft_dir / 'checkpoints'}")
        config = msgspec.structs.replace(self.trainer.config, init_from=str(checkpoint))
        trainer = Trainer(config, self.trainer.cookbook, self.trainer.backend)
        # Flow processes build_trainer started early (they imported during SFT) go to this one.
        trainer.early_workers, self.trainer.early_workers = self.trainer.early_workers, None
        return trainer


def build_warm_start(
    name: str,
    dataset: str,
    *,
    cookbook: Cookbook | None = None,
    config_path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    backend: str | None = None,
    out_dir: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    allow_changes: tuple[str, ...] | list[str] = (),
) -> WarmStart:
    """Check everything for ``rllm train NAME --sft DATASET``, then build the tiny model (if any)
    and the RL Trainer; no SFT or RL work yet."""
    rl_overrides, sft_overrides = split_overrides(overrides)
    config, cookbook = load_train_config(
        name,
        cookbook=cookbook,
        config_path=config_path,
        overrides=rl_overrides,
        backend=backend,
        out_dir=out_dir,
    )
    if config.init_from:
        raise ConfigError.for_key("init_from", "--sft trains the starting weights itself: drop init_from")
    sft_config = phase_config(dataset, config, sft_overrides)
    check_datasets(sft_config)
    try:
        sft_backend(sft_config, model_path(config))
    except ConfigError as exc:
        raise sft_error(exc, sft_overrides) from None
    rl_keys, sft_keys = split_overrides(split_keys(allow_changes))
    check_folders(
        train_folder(config, cookbook),
        sft_folder(sft_config),
        resume=resume,
        overwrite=overwrite,
        allow_changes=(rl_keys, sft_keys),
    )
    trainer = assemble_trainer(config, cookbook)  # RL's backend options and algorithm; the tiny model
    return WarmStart(
        trainer, sft_config, resume=resume, overwrite=overwrite, allow_changes=(rl_keys, sft_keys)
    )


def phase_config(dataset: str, rl: TrainerConfig, overrides: list[str]) -> SFTConfig:
    """The SFT phase's config: the RL run's backend, model, options, seed and progress display,
    then ``overrides``; it writes OUT/sft."""
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key in FIXED_KEYS:
            raise ConfigError.for_key(SFT_PREFIX + key, f"not settable: {FIXED_KEYS[key]}")
    base = {
        "dataset": dataset,
        "out_dir": str(Path(rl.out_dir) / SFT_FOLDER),
        "seed": rl.seed,
        "progress": rl.progress,
        "backend": {"name": rl.backend.name, "options": {**rl.backend.options, "model": model_path(rl)}},
    }
    try:
        config = load_sft_config(None, overrides, base=base)
    except ConfigError as exc:
        raise sft_error(exc, overrides) from None
    # The same, set through a whole section (sft.backend={...}).
    if config.backend.name != rl.backend.name:
        raise ConfigError.for_key(SFT_PREFIX + "backend.name", f"not settable: {FIXED_KEYS['backend.name']}")
    if config.backend.options.get("model") != model_path(rl):
        raise ConfigError.for_key(
            SFT_PREFIX + "backend.options.model", f"not settable: {FIXED_KEYS['backend.options.model']}"
        )
    return config


def sft_error(exc: ConfigError, overrides: list[str]) -> ConfigError:
    """``exc`` (about the SFT phase's config) naming the key as the user typed it: ``sft.KEY``
    when one of the ``sft.`` overrides set it, the RL run's own key when the phase inherited it."""
    set_here = {item.partition("=")[0].strip() for item in overrides}
    key = exc.key
    if key and (key in set_here or not key.startswith("backend.")):
        message = str(exc).removeprefix(f"config key `{key}`: ").removeprefix(f"{key}: ")
        return ConfigError.for_key(SFT_PREFIX + key, message)
    return exc if key else ConfigError(f"--sft: {exc}")


def check_datasets(config: SFTConfig) -> None:
    """A chat file that is not there is refused now, before any model is built or loaded (hub
    datasets are checked when they are read, still before the model loads)."""
    for key, source in (("dataset", config.dataset), ("val_dataset", config.val_dataset)):
        if source and not is_hf_source(source) and not Path(source).is_file():
            what = "a chat JSONL, hf:NAME, a save_to_disk folder, or a set `rllm dataset from-eval` wrote"
            if key == "dataset":
                raise ConfigError(f"--sft: {source} is not a file ({what})")
            raise ConfigError.for_key(SFT_PREFIX + key, f"{source} is not a file ({what})")


def check_folders(
    rl: RunFolder,
    sft: RunFolder,
    *,
    resume: bool,
    overwrite: bool,
    allow_changes: tuple[list[str], list[str]] = ([], []),
) -> None:
    """The run folder fits the request, OUT/sft included (reads only); on ``--resume`` each phase
    with a checkpoint is checked against its recorded config."""
    out, sft_dir = rl.path, sft.path
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite contradict each other: pick one")
    if any(allow_changes) and not resume:
        raise RunFolderError("--allow-changes applies to --resume only")
    if resume:
        if latest_checkpoint(out) is None and latest_checkpoint(sft_dir) is None:
            raise RunFolderError(
                f"--resume: run folder {out} has no complete checkpoint, of RL ({out / 'checkpoints'}) "
                f"or of its SFT phase ({sft_dir / 'checkpoints'}); nothing to resume"
            )
        rl_keys, sft_keys = allow_changes
        if latest_checkpoint(out) is not None:
            rl.check(resume=True, allow_changes=rl_keys)
        if latest_checkpoint(sft_dir) is not None:
            sft.check(resume=True, allow_changes=sft_keys)
        return
    rl.check(overwrite=overwrite)
    if holds_a_run(sft_dir) and not overwrite:
        raise RunFolderError(
            f"run folder {out} already holds an SFT phase ({sft_dir}): pass --resume to continue "
            "it, --overwrite to replace it, or --out for another folder"
        )
    sft.check(overwrite=overwrite)


__all__ = ["DONE_FILE", "SFT_FOLDER", "SFT_PREFIX", "WarmStart", "build_warm_start", "split_overrides"]
