"""How ``rllm train PREFIX:NAME`` and ``rllm eval PREFIX:NAME`` find an environment adapter.

A name with a colon is an adapter spec: ``reasoning-gym:leg_counting``, ``verifiers:my_env``.
The prefix names an :class:`rllm.sdk.cookbook.Adapter` that an installed package registers under
the ``rllm.adapters`` entry point group; the adapter builds the cookbook of the library's
environment NAME (its tasks, a flow, an evaluator, training defaults) and everything after that is
an ordinary cookbook run. This module is the one place the spec is read.

A prefix rLLM knows (``KNOWN``) whose package is not installed is refused in one line naming the
package to install; an unknown prefix lists the installed adapters.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from rllm.cli.errors import CliError
from rllm.sdk.cookbook import ADAPTERS_GROUP, Adapter, Cookbook

# Adapter prefixes rLLM ships a package for: prefix -> the package that provides it.
KNOWN = {
    "reasoning-gym": "rllm-adapter-reasoning-gym",
    "verifiers": "rllm-adapter-verifiers",
    "mcp": "rllm-adapter-mcp",
    "openenv": "rllm-adapter-openenv",
}


def split_spec(name: str) -> tuple[str, str] | None:
    """``(prefix, environment)`` for an adapter spec ``PREFIX:NAME``, else None (a cookbook or a
    dataset name). A module path like ``pkg.mod:attr`` is not a spec: a prefix has no dot."""
    prefix, colon, environment = name.partition(":")
    if not colon or not prefix or "." in prefix or "/" in prefix:
        return None
    return prefix, environment


def installed() -> dict[str, Adapter]:
    """The installed adapters by prefix."""
    found: dict[str, Adapter] = {}
    for ep in entry_points(group=ADAPTERS_GROUP):
        adapter = ep.load()
        if not isinstance(adapter, Adapter):
            raise CliError(
                f"entry point {ADAPTERS_GROUP}:{ep.name} is {type(adapter).__name__}, not an rllm.sdk Adapter"
            )
        found[ep.name] = adapter
    return found


def adapter_cookbook(name: str) -> Cookbook | None:
    """The cookbook an adapter spec names, or None when ``name`` is not a spec."""
    spec = split_spec(name)
    if spec is None:
        return None
    prefix, environment = spec
    adapters = installed()
    adapter = adapters.get(prefix)
    if adapter is None:
        if prefix in KNOWN:
            raise CliError(f"{name}: the {prefix} adapter is not installed: pip install {KNOWN[prefix]}")
        known = ", ".join(sorted({*adapters, *KNOWN})) or "none"
        raise CliError(f"{name}: no environment adapter named {prefix!r} (adapters: {known})")
    if not environment:
        raise CliError(f"{name}: name an environment after the colon, e.g. {prefix}:{_example(adapter)}")
    try:
        cookbook = adapter.cookbook(environment)
    except LookupError as exc:
        raise CliError(f"{name}: {exc.args[0] if exc.args else exc}") from None
    except ImportError as exc:  # the library itself (or its environment's module) is missing
        raise CliError(f"{name}: {exc}") from None
    return cookbook


FLOWS = ("single-turn", "multi-turn", "tools")
MODES = ("train", "eval")


def render_markdown() -> str:
    """The environment adapters' section of ``rllm capabilities``: each known or installed
    adapter, its package, and the flows and modes it declares (its ``Adapter``)."""
    adapters = installed()
    lines = [
        "",
        "## Environment adapters",
        "",
        "`rllm train PREFIX:NAME` / `rllm eval PREFIX:NAME` (rllm.cli.adapters); each adapter declares",
        "what it runs (`rllm.sdk.cookbook.Adapter`). yes: supported; no: not offered.",
        "",
        "| adapter | package | library | " + " | ".join(FLOWS) + " | " + " | ".join(MODES) + " |",
        "|---|---|---|" + "---|" * (len(FLOWS) + len(MODES)),
    ]
    for prefix in sorted({*adapters, *KNOWN}):
        adapter = adapters.get(prefix)
        if adapter is None:
            blanks = " | ".join("not installed" for _ in (*FLOWS, *MODES))
            lines.append(f"| `{prefix}:` | {KNOWN[prefix]} | | {blanks} |")
            continue
        marks = [("yes" if f in adapter.flows else "no") for f in FLOWS]
        marks += [("yes" if m in adapter.modes else "no") for m in MODES]
        lines.append(f"| `{prefix}:` | {adapter.package} | {adapter.library} | " + " | ".join(marks) + " |")
    return "\n".join(lines) + "\n"


def _example(adapter: Adapter) -> str:
    try:
        names = adapter.names()
    except Exception:  # listing is a courtesy for the message
        names = []
    return names[0] if names else "NAME"
