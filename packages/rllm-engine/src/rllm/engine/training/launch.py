"""Assemble a Trainer from names: cookbook + backend found through entry points, config layered.

Config precedence (lowest first): the cookbook's ``train_defaults``, the config file, then
``--backend`` and ``key.sub=value`` overrides from the command line.

Everything that can be checked is checked before anything is built or written: the config,
the cookbook's options, the run folder (``--resume``/``--overwrite``), the backend's own options
and the algorithm against the backend, and that a Ray cluster's address answers. Only then is
the tiny model built and the backend made.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rllm.engine.plugins import backend_class, load_cookbook
from rllm.engine.rollout.early_flow_processes import start_early_for
from rllm.engine.rollout.executors import resolve_executor
from rllm.engine.rollout.ray_connect import ADDRESS_KEY, check_address_answers
from rllm.engine.training.init_from import check_init_model, resolve_init_checkpoint
from rllm.engine.training.model_check import check_model_path
from rllm.engine.training.task_sampler import check_curriculum
from rllm.engine.training.train_folder import check_train_folder, ensure_tiny_model
from rllm.engine.training.trainer import Trainer, validate_algorithm
from rllm.engine.training.trainer_config import TrainerConfig, load_config
from rllm.sdk.cookbook import Cookbook
from rllm.types import ConfigError
from rllm.types.errors import StateError

TINY_MODEL = "tiny"  # backend.options.model = "tiny": build a tiny random model for the cookbook


def build_trainer(
    name: str,
    *,
    config_path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    backend: str | None = None,
    out_dir: str | None = None,
    resume: bool | None = None,
    overwrite: bool = False,
    allow_changes: tuple[str, ...] | list[str] = (),
    cookbook: Cookbook | None = None,
) -> Trainer:
    """The Trainer for cookbook ``name`` (or for ``cookbook`` itself, named ``name``, e.g. a
    registered dataset with another cookbook's agent); pass the same ``resume``/``overwrite``/
    ``allow_changes`` to its ``fit``. Given ``resume`` (True or False), the run folder is checked
    here, before anything is built; left None, only ``fit`` checks it."""
    config, cookbook = load_train_config(
        name,
        cookbook=cookbook,
        config_path=config_path,
        overrides=overrides,
        backend=backend,
        out_dir=out_dir,
    )
    return assemble_trainer(config, cookbook, resume=resume, overwrite=overwrite, allow_changes=allow_changes)


def load_train_config(
    name: str,
    *,
    cookbook: Cookbook | None = None,
    config_path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    backend: str | None = None,
    out_dir: str | None = None,
) -> tuple[TrainerConfig, Cookbook]:
    """The layered, checked TrainerConfig and the cookbook with its options; nothing built."""
    cookbook = cookbook or load_cookbook(name)
    base: dict[str, Any] = {"out_dir": f"runs/{name}", **cookbook.train_defaults, "cookbook": name}
    refuse_flag_conflicts({"--backend": ("backend.name", backend), "--out": ("out_dir", out_dir)}, overrides)
    flags = [f"backend.name={backend}"] if backend else []
    flags += [f"out_dir={out_dir}"] if out_dir else []
    config = load_config(config_path, [*flags, *overrides], base=base)
    try:
        cookbook = cookbook.with_options(config.cookbook_options)
    except ValueError as exc:
        raise ConfigError(f"config key `cookbook_options`: {exc}", key="cookbook_options") from None
    check_splits(config, cookbook)
    check_curriculum(config, cookbook)  # rollout.curriculum.promote needs difficulty levels
    return config, cookbook


def refuse_flag_conflicts(flags: Mapping[str, tuple[str, str | None]], overrides: Iterable[str]) -> None:
    """A flag (``--backend tinker``) and a ``key=value`` override of the key it sets
    (``backend.name=verl``) that disagree: refused naming both, never one silently winning."""
    for flag, (key, value) in flags.items():
        if value is None:
            continue
        for item in overrides:
            name, sep, given = item.partition("=")
            if sep and name.strip() == key and given.strip().strip("'\"") != str(value):
                raise ConfigError.for_key(key, f"{flag} {value} and {key}={given} disagree: pass one of them")


def assemble_trainer(
    config: TrainerConfig,
    cookbook: Cookbook,
    *,
    resume: bool | None = None,
    overwrite: bool = False,
    allow_changes: tuple[str, ...] | list[str] = (),
) -> Trainer:
    """:func:`build_trainer` after its config: the run folder (given ``resume``), the backend's
    options and the algorithm checked, then the tiny model built (``model = "tiny"``), then
    ``init_from``'s model checked against the run's (tokenizer, vocab and hidden size), all before
    the backend loads anything."""
    if resume is not None:
        check_train_folder(config, cookbook, resume=resume, overwrite=overwrite, allow_changes=allow_changes)
    cls = backend_class(config.backend.name)
    options = dict(config.backend.options)
    options.setdefault("seed", config.seed)
    tiny = options.get("model", TINY_MODEL) == TINY_MODEL
    check_model_path(str(options.get("model", TINY_MODEL)))
    if tiny and not hasattr(cls, "init_tiny_model"):
        raise ConfigError(
            f"backend {config.backend.name!r} cannot build a tiny model: set backend.options.model"
        )
    # A backend's constructor only parses its options: make one now, so that a typo in them or an
    # algorithm option it refuses stops the run in milliseconds, not after the tiny model is built.
    validate_algorithm(config, make_backend(cls, config.backend.name, options))
    check_backend_installed(cls)
    check_ray_address(config)
    early = None
    try:
        if tiny:
            target = Path(model_path(config))
            if not (target / "config.json").is_file():
                # Building it imports torch and the model stack (seconds): the run's flow
                # processes start first and import theirs meanwhile (Trainer.fit adopts them).
                early = start_early_for(config, cookbook)
            options["model"] = str(
                init_tiny_model(
                    target, cookbook=cookbook, backend=config.backend.name, backend_cls=cls, seed=config.seed
                )
            )
        if config.init_from:
            check_init_model(resolve_init_checkpoint(config.init_from), str(options.get("model")))
        trainer = Trainer(config, cookbook, make_backend(cls, config.backend.name, options))
    except BaseException:
        if early is not None:
            early.close()
        raise
    trainer.early_workers = early
    return trainer


def model_path(config: TrainerConfig) -> str:
    """The model the run trains: ``backend.options.model`` (a path or a hub name), or for
    ``"tiny"`` (the default) the tiny model :func:`assemble_trainer` builds in the run folder."""
    model = config.backend.options.get("model", TINY_MODEL)
    return str(Path(config.out_dir) / "tiny-model") if model == TINY_MODEL else str(model)


def check_splits(config: TrainerConfig, cookbook: Cookbook) -> None:
    """A split the cookbook cannot load is a config error now, not after the model is built.
    (Cookbooks take splits beyond ``Cookbook.splits``, e.g. ``hub:train``: only loading tells.)"""
    for key in ("train_split", "val_split"):
        split = getattr(config, key)
        if split is None:
            continue
        try:
            cookbook.load_tasks(split)
        except (ValueError, KeyError, LookupError) as exc:
            message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
            raise ConfigError.for_key(key, message) from None


def check_ray_address(config: TrainerConfig) -> None:
    """A ``rollout.ray.address`` nobody answers at is refused now, naming it, not after the tiny
    model and the backend are built (Ray itself would retry it without end)."""
    rollout = config.rollout
    address = rollout.ray.address
    if resolve_executor(rollout.executor, rollout.workers) != "ray" or address in (None, "auto"):
        return
    try:
        check_address_answers(address, rollout.ray.connect_timeout_s)
    except StateError as exc:
        raise ConfigError(str(exc), key=ADDRESS_KEY) from None


def check_backend_installed(cls: Any) -> None:
    """MissingExtraError naming the install when the backend's extra is missing. Called once its
    options and the algorithm are checked (those need only the config, and a mistake there is the
    first thing to say) and before anything is built or loaded."""
    if (check := getattr(cls, "check_installed", None)) is not None:
        check()


def make_backend(cls: Any, name: str, options: dict[str, Any]) -> Any:
    """``cls(options)``: its options parsed (nothing imported or loaded); its option errors become
    ConfigErrors under ``backend.options``."""
    try:
        return cls(options)
    except ConfigError as exc:
        if exc.key and not exc.key.startswith("backend."):
            key = f"backend.options.{exc.key}"
            message = str(exc).removeprefix(f"config key `{exc.key}`: ")
            raise ConfigError.for_key(key, f"{message} (backend {name!r})") from None
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError.for_key("backend.options", f"backend {name!r}: {exc}") from None


def init_tiny_model(
    path: Path, *, cookbook: Cookbook, backend: str = "tinker", backend_cls: Any = None, seed: int = 0
) -> Path:
    """A tiny random model whose tokenizer covers the cookbook's task vocabulary: the one at
    ``path`` when it was built from the same words and seed, else built there
    (:func:`rllm.engine.training.train_folder.ensure_tiny_model`)."""
    cls = backend_cls or backend_class(backend)
    return ensure_tiny_model(
        Path(path), task_vocabulary(cookbook), backend=backend, backend_cls=cls, seed=seed
    )


def task_vocabulary(cookbook: Cookbook) -> list[str]:
    """The words of every task's instruction and ground truth, in first-seen order."""
    words: dict[str, None] = {}
    for split in cookbook.splits:
        for task in cookbook.load_tasks(split):
            texts = [task.instruction if isinstance(task.instruction, str) else ""]
            truth = task.ground_truth
            texts += [str(x) for x in truth] if isinstance(truth, list) else [str(truth or "")]
            for text in texts:
                words.update(dict.fromkeys(re.findall(r"\w+|[^\w\s]", text)))
    return list(words)


__all__ = [
    "assemble_trainer",
    "build_trainer",
    "init_tiny_model",
    "load_cookbook",
    "load_train_config",
    "make_backend",
    "model_path",
    "task_vocabulary",
]
