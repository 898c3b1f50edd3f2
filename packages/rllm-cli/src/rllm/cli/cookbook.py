"""`rllm cookbook list|info NAME`: what the installed ``rllm.cookbooks`` entry points offer."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from rllm.engine.plugins import COOKBOOKS_GROUP, available, load_cookbook

out = Console()


@click.group("cookbook")
def cookbook_group() -> None:
    """Installed cookbooks (packages registering the `rllm.cookbooks` entry point).

    \b
    Example:
      rllm cookbook list
      rllm cookbook info say-single
    """


@cookbook_group.command("list")
def list_cookbooks() -> int:
    """List cookbooks with their description and splits.

    \b
    Example:
      rllm cookbook list
    """
    table = Table(title="cookbooks")
    for column in ("name", "splits", "description"):
        table.add_column(column)
    for name in available(COOKBOOKS_GROUP):
        cookbook = load_cookbook(name)
        table.add_row(name, ", ".join(cookbook.splits), cookbook.description.split("\n")[0])
    out.print(table)
    return 0


@cookbook_group.command("info")
@click.argument("name")
def info(name: str) -> int:
    """Show cookbook NAME: description, splits (with sizes), flow, evaluator and train defaults.

    \b
    Example:
      rllm cookbook info say-single
    """
    cookbook = load_cookbook(name)
    out.print(f"[bold]{name}[/bold]: {cookbook.description}")
    sizes = []
    for split in cookbook.splits:
        try:
            sizes.append(f"{split} ({len(cookbook.load_tasks(split))} tasks)")
        except Exception as exc:  # a split that cannot load is shown as such, not fatal
            sizes.append(f"{split} (cannot load: {exc})")
    out.print("splits: " + ", ".join(sizes))
    out.print(f"flow: {_qualname(cookbook.flow)}")
    out.print(f"evaluator: {_qualname(cookbook.evaluator)}")
    options = cookbook.train_defaults.get("backend", {}).get("options", {})
    model = options.get("model", "tiny")
    out.print(
        f"model (rllm train): {model}"
        + (" (a tiny random model built for the cookbook)" if model == "tiny" else "")
        + "; set backend.options.model to change it",
        highlight=False,
    )
    out.print("train defaults (override with `rllm train NAME key.sub=value`):")
    out.print_json(json.dumps(cookbook.train_defaults, default=str))
    return 0


def _qualname(obj: object) -> str:
    target = getattr(obj, "__wrapped__", obj)
    module = getattr(target, "__module__", "?")
    return f"{module}:{getattr(target, '__qualname__', type(target).__name__)}"
