"""Assemble an SFTRunner from names: the backend through its entry point, the config layered.

Config precedence (lowest first): defaults, the config file, then ``--backend``, ``--model``,
``--out`` and ``key.sub=value`` overrides. ``model = "tiny"`` builds a tiny random model whose
tokenizer covers the dataset's words (tests, toy runs). The run folder is checked first
(``--resume`` / ``--overwrite``, rllm.engine.training.run_folder), before any model is built.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rllm.engine.backend import Backend
from rllm.engine.data.chat_sources import read_chat_source, source_stem
from rllm.engine.data.sft import (
    SFTConfig,
    SFTRunner,
    chat_vocabulary,
    check_backend,
    load_sft_config,
    sft_folder,
)
from rllm.engine.data.stored_ids import RETOKENIZE, made_by, stored_by
from rllm.engine.plugins import backend_class
from rllm.engine.training.checkpoint import latest_checkpoint, load_trainer_state
from rllm.engine.training.launch import (
    TINY_MODEL,
    check_backend_installed,
    make_backend,
    refuse_flag_conflicts,
)
from rllm.engine.training.model_check import check_model_path
from rllm.engine.training.train_folder import ensure_tiny_model
from rllm.types import ConfigError
from rllm.types.errors import NothingToDo


def build_sft(
    dataset: str,
    *,
    model: str | None = None,
    backend: str | None = None,
    config_path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    out_dir: str | None = None,
    resume: bool | None = None,
    overwrite: bool = False,
    allow_changes: Iterable[str] = (),
) -> SFTRunner:
    """The runner for ``rllm sft``; given ``resume`` (True or False), its run folder is checked
    first (pass the same ``resume``/``overwrite``/``allow_changes`` to its ``fit``)."""
    base: dict[str, Any] = {"dataset": dataset, "out_dir": f"runs/sft-{source_stem(dataset)}"}
    refuse_flag_conflicts(
        {
            "--backend": ("backend.name", backend),
            "--model": ("backend.options.model", model),
            "--out": ("out_dir", out_dir),
        },
        overrides,
    )
    flags = [f"backend.name={backend}"] if backend else []
    flags += [f"backend.options.model={model}"] if model else []
    flags += [f"out_dir={out_dir}"] if out_dir else []
    config = load_sft_config(config_path, [*flags, *overrides], base=base)
    if resume is not None:
        sft_folder(config).check(resume=resume, overwrite=overwrite, allow_changes=allow_changes)
    runner = sft_runner(config)
    if resume:
        refuse_finished(config, len(runner.plan))
    return runner


class SFTFinished(NothingToDo):
    """``--resume`` of an SFT run whose checkpoint is already at the end of its plan: nothing to
    do (the CLI says so and exits 0, without starting the backend)."""


def refuse_finished(config: SFTConfig, planned: int) -> None:
    """SFTFinished when the run's latest checkpoint has every planned step (the plan is known
    once the data is tokenized; nothing is loaded or started yet)."""
    found = latest_checkpoint(Path(config.out_dir))
    if found is not None and (step := load_trainer_state(found).step) >= planned:
        raise SFTFinished(
            f"{config.out_dir} finished at step {step} ({planned} steps planned): nothing to resume; "
            "more steps: --resume --allow-changes epochs epochs=N (or total_steps)"
        )


def sft_runner(config: SFTConfig) -> SFTRunner:
    """The runner for a loaded SFTConfig: the tiny model built (``model = "tiny"``), the backend
    made with its SFT defaults and checked, the data read and tokenized; nothing started."""
    model = sft_model(config)
    instance = sft_backend(config, model)
    return SFTRunner(config, instance, load_chat_tokenizer(instance.tokenizer_path() or model))


def sft_model(config: SFTConfig) -> str:
    """``backend.options.model``; for ``"tiny"`` a tiny model covering the data's words, built
    (once) in the run folder."""
    model = str(config.backend.options.get("model", TINY_MODEL))
    if model != TINY_MODEL:
        check_model_path(model)
        return model
    cls = backend_class(config.backend.name)
    if not hasattr(cls, "init_tiny_model"):
        raise ConfigError(f"backend {config.backend.name!r} cannot build a tiny model: pass --model")
    examples = read_chat_source(config.dataset, config.columns)
    if config.val_dataset:
        examples += read_chat_source(config.val_dataset, config.columns)
    if not config.retokenize and (stored := stored_by(examples)) is not None:
        # Its tokenizer is built from the set's words: never the one that made stored ids.
        raise ConfigError(
            f"{config.dataset}: its token ids were made by {made_by(stored)}, and the tiny model's "
            f"tokenizer is built from the set's words: pass --model "
            f"{stored.tokenizer_source or 'MODEL'} (the model that made them), or {RETOKENIZE}"
        )
    target = Path(config.out_dir) / "tiny-model"
    words = chat_vocabulary(examples)
    return str(
        ensure_tiny_model(target, words, backend=config.backend.name, backend_cls=cls, seed=config.seed)
    )


def sft_backend(config: SFTConfig, model: str) -> Backend:
    """The backend SFT runs on, for ``model``: constructed (its options parsed) and checked for
    SFT; nothing loaded, so a mistake here costs milliseconds."""
    cls = backend_class(config.backend.name)
    options = {**config.backend.options, "model": model}
    options.setdefault("seed", config.seed)
    # A backend's own defaults for supervised training (the local Tinker service: no sampler),
    # below what the user set.
    for key, value in getattr(cls, "sft_option_defaults", {}).items():
        options.setdefault(key, value)
    instance = make_backend(cls, config.backend.name, options)
    check_backend(config, instance)  # before loading anything
    check_backend_installed(cls)
    return instance


def load_chat_tokenizer(path: str) -> Any:
    """The model's tokenizer with its chat template (transformers, through the gateway's loader)."""
    from rllm.gateway.cumulative import TokenBridge

    return TokenBridge.load(path).tokenizer


__all__ = [
    "SFTFinished",
    "build_sft",
    "load_chat_tokenizer",
    "refuse_finished",
    "sft_backend",
    "sft_model",
    "sft_runner",
]
