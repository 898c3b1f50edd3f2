"""Cookbook: how a packaged agent (flow + evaluator + data) presents itself to `rllm`.

A cookbook package exposes one ``Cookbook`` object through the ``rllm.cookbooks`` entry point,
e.g. ``[project.entry-points."rllm.cookbooks"] say = "rllm_cookbook_say:cookbook"``; the CLI
finds it by name. Cookbooks depend only on rllm-types and rllm-sdk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rllm.types import Task


@dataclass(frozen=True)
class Cookbook:
    """One agent recipe: the flow, its evaluator, its splits and its default training config.

    ``load_tasks(split)`` returns that split's tasks (raising ValueError for an unknown split);
    ``train_defaults`` is a TrainerConfig-shaped mapping that a user's config file and CLI
    overrides are layered on. ``configure(options)``, when given, returns the cookbook set up with
    the user's options (a training config's ``cookbook_options``, ``rllm eval --option``), e.g. an
    evaluator's judge; it raises ValueError naming an option it does not take.
    """

    name: str
    flow: Any
    evaluator: Any
    load_tasks: Callable[[str], list[Task]]
    description: str = ""
    splits: tuple[str, ...] = ("train", "test")
    train_defaults: dict[str, Any] = field(default_factory=dict)
    configure: Callable[[dict[str, Any]], Cookbook] | None = None

    def with_options(self, options: dict[str, Any]) -> Cookbook:
        """This cookbook set up with ``options`` (itself when there are none)."""
        if not options:
            return self
        if self.configure is None:
            raise ValueError(f"cookbook {self.name!r} takes no options, got {', '.join(sorted(options))}")
        return self.configure(dict(options))
