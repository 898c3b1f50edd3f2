"""Cookbook: how a packaged agent (flow + evaluator + data) presents itself to `rllm`.

A cookbook package exposes one ``Cookbook`` object through the ``rllm.cookbooks`` entry point,
e.g. ``[project.entry-points."rllm.cookbooks"] say = "rllm_cookbook_say:cookbook"``; the CLI
finds it by name. Cookbooks depend only on rllm-types and rllm-sdk.

An environment adapter (``rllm-adapter-*``: reasoning-gym, verifiers, ...) turns another
library's environments into cookbooks: it exposes one :class:`Adapter` through the
``rllm.adapters`` entry point, and ``rllm train PREFIX:NAME`` / ``rllm eval PREFIX:NAME`` ask it
for NAME's cookbook (``rllm.cli.adapters`` resolves the spec).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rllm.types import Task
from rllm.types.errors import InputError


@runtime_checkable
class DifficultyLevels(Protocol):
    """A task generator with levels of difficulty, 0 the easiest (e.g. the math cookbook's
    ``math-arith``: one-, two- and three-digit operands).

    ``rllm train`` with ``rollout.curriculum.promote`` set trains on ``load_level(train_split, 0)``
    first and moves up one level each time the run's recent pass rate reaches that threshold (the
    engine calls this, never the other way round); without it the cookbook's ``load_tasks`` is used
    as always. Task ids must differ between levels (a run's per-task record spans them).
    """

    def level_count(self) -> int:
        """How many levels there are (>= 1)."""
        ...

    def load_level(self, split: str, level: int) -> list[Task]:
        """The tasks of ``split`` at ``level`` (0 <= level < level_count()); ValueError otherwise."""
        ...


@dataclass(frozen=True)
class Cookbook:
    """One agent recipe: the flow, its evaluator, its splits and its default training config.

    ``load_tasks(split)`` returns that split's tasks (raising ValueError for an unknown split);
    ``train_defaults`` is a TrainerConfig-shaped mapping that a user's config file and CLI
    overrides are layered on. ``configure(options)``, when given, returns the cookbook set up with
    the user's options (a training config's ``cookbook_options``, ``rllm eval --option``), e.g. an
    evaluator's judge; it raises ValueError naming an option it does not take. ``levels``, when
    given, is the cookbook's tasks by difficulty (:class:`DifficultyLevels`).
    """

    name: str
    flow: Any
    evaluator: Any
    load_tasks: Callable[[str], list[Task]]
    description: str = ""
    splits: tuple[str, ...] = ("train", "test")
    train_defaults: dict[str, Any] = field(default_factory=dict)
    configure: Callable[[dict[str, Any]], Cookbook] | None = None
    levels: DifficultyLevels | None = None

    def with_options(self, options: dict[str, Any]) -> Cookbook:
        """This cookbook set up with ``options`` (itself when there are none)."""
        if not options:
            return self
        if self.configure is None:
            raise InputError(f"cookbook {self.name!r} takes no options, got {', '.join(sorted(options))}")
        return self.configure(dict(options))


def refuse_unknown_options(cookbook: str, options: Mapping[str, Any], known: Sequence[str]) -> None:
    """An ``InputError`` naming every key of ``options`` that ``known`` lacks (a typo'd
    ``cookbook_options`` key or ``rllm eval --option``): a cookbook's ``configure`` calls it first."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InputError(f"unknown {cookbook} option(s) {unknown}; known: {list(known)}")


ADAPTERS_GROUP = "rllm.adapters"


@dataclass(frozen=True)
class Adapter:
    """An environment library seen as cookbooks: ``cookbook(name)`` builds the cookbook of the
    library's environment ``name`` (raising ``LookupFailed`` naming what it has when there is
    none); ``names()`` lists some of them for messages (may be empty when the library cannot
    enumerate). ``flows`` and ``modes`` say what it supports, for ``rllm capabilities``."""

    prefix: str
    package: str
    library: str
    cookbook: Callable[[str], Cookbook]
    names: Callable[[], list[str]]
    flows: tuple[str, ...] = ("single-turn",)
    modes: tuple[str, ...] = ("train", "eval")
    description: str = ""


def sample_rows(
    sample_dir: Path, split: str, *, cookbook: str, other_splits: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The rows of the sample a cookbook ships for ``split``: ``sample_dir/<split>.jsonl``, one JSON
    object a line. Any other split is an InputError listing the shipped splits and
    ``other_splits`` (the ones the cookbook loads another way, e.g. ``"hub:train"``)."""
    shipped = {path.stem: path for path in Path(sample_dir).glob("*.jsonl")}
    if split not in shipped:
        order = [s for s in ("train", "test") if s in shipped] + sorted(set(shipped) - {"train", "test"})
        known = ", ".join(repr(s) for s in [*order, *other_splits])
        raise InputError(f"the {cookbook} cookbook has splits {known}, not {split!r}")
    lines = shipped[split].read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def train_defaults(
    *,
    total_steps: int = 100,
    tasks_per_step: int = 16,
    group_size: int = 8,
    val_every: int = 10,
    max_tokens: int = 1024,
    temperature: float = 1.0,
    estimator: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A cookbook's ``train_defaults`` in the shape every cookbook uses: validation on the ``test``
    split, sampling at ``temperature`` up to ``max_tokens``, ``estimator`` when given. ``extra`` keys are
    merged over it table by table (``rollout={"deadline_s": 60}`` keeps the sampling settings)."""
    base: dict[str, Any] = {
        "total_steps": total_steps,
        "tasks_per_step": tasks_per_step,
        "group_size": group_size,
        "val_split": "test",
        "val_every": val_every,
        "rollout": {"sampling": {"temperature": temperature, "max_tokens": max_tokens}},
    }
    if estimator is not None:
        base["algorithm"] = {"estimator": estimator}
    return _merged(base, extra)


def _merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        both = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = _merged(out[key], value) if both else value
    return out
