"""Find backends and cookbooks through entry points (never by hard-coded imports)."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from rllm.sdk.cookbook import Cookbook
from rllm.types.errors import RLLMError, UsageError

BACKENDS_GROUP = "rllm.backends"
COOKBOOKS_GROUP = "rllm.cookbooks"


class PluginNotFoundError(RLLMError, LookupError):
    """No installed package registers that backend or cookbook name."""


def available(group: str) -> list[str]:
    return sorted(ep.name for ep in entry_points(group=group))


def _load(group: str, name: str, what: str) -> Any:
    found = [ep for ep in entry_points(group=group) if ep.name == name]
    if not found:
        names = ", ".join(available(group)) or "none"
        raise PluginNotFoundError(f"no {what} named {name!r} is installed (installed: {names})")
    return found[0].load()


def backend_class(name: str) -> Any:
    """The backend class registered as ``name``; construct it with its options mapping."""
    return _load(BACKENDS_GROUP, name, "backend")


def load_cookbook(name: str) -> Cookbook:
    cookbook = _load(COOKBOOKS_GROUP, name, "cookbook")
    if not isinstance(cookbook, Cookbook):
        raise UsageError(
            f"entry point {COOKBOOKS_GROUP}:{name} is {type(cookbook).__name__}, not an rllm.sdk Cookbook"
        )
    return cookbook
