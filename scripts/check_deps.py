"""Each workspace package declares exactly what its source imports: no undeclared, no unused dependency.

For every member (``packages/*`` and ``cookbooks/*``) the script reads every ``import`` in its
``src/`` (at module level and inside functions; the tests are the dev group's business) and maps
each to the distribution that provides it:

* first-party: ``rllm.<x>`` goes to the member whose ``src/`` holds that module (longest match:
  ``rllm.backends.tinker`` → rllm-backend-tinker), ``rllm_cookbook_<x>`` to its cookbook;
* third-party: the installed distributions' top-level modules (``importlib.metadata``), falling
  back to the module's own name for one not installed here (verl, ray, vllm live only in the verl
  session's environment) and to ``KNOWN`` for a few whose module and distribution names differ;
* the standard library is skipped.

Declared means listed in ``[project] dependencies`` or any extra. A member fails when it imports a
distribution it does not declare (it then works only while something else drags it in), or
declares one none of its modules imports. A dependency needed without being imported (a version
floor for another package's import, a runtime plugin) is listed, with its reason, under
``[tool.rllm.deps] not-imported`` in the member's pyproject.toml.

deptry was considered: it maps imports to distributions by top-level module, and every rLLM
package is a portion of the one ``rllm`` namespace, so it cannot tell rllm.types from rllm.engine.

Cookbooks (members under ``cookbooks/``) and environment adapters (``packages/rllm-adapter-*``,
cookbooks made from another library's environments) may use only ``rllm-types`` and
``rllm-sdk`` of rLLM: with every import declared, that is the cookbook contract, checked here so
that a new cookbook or adapter needs no entry in the import-linter contracts.

Run by ``uv run nox -s layers``, or alone: ``uv run python scripts/check_deps.py``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MEMBERS = ("packages/*", "cookbooks/*")
# What a cookbook may use of rLLM (docs/architecture.md: cookbooks depend only on types + sdk).
COOKBOOK_MAY_USE = frozenset({"rllm-types", "rllm-sdk"})

# Distributions whose import name is neither their own name nor known to this environment.
KNOWN = {
    "yaml": "pyyaml",
    "hydra": "hydra-core",
    "PIL": "pillow",
    "google.protobuf": "protobuf",
    "sklearn": "scikit-learn",
}


def normalize(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """``rllm-algos[torch]>=0.1; python_version < '3.14'`` → ``rllm-algos``."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise SystemExit(f"unreadable requirement: {requirement!r}")
    return normalize(match.group(1))


@dataclass
class Member:
    """One workspace package: its name, source root, declared dependencies and the exemptions."""

    name: str
    directory: Path
    declared: set[str]
    not_imported: set[str]
    modules: list[str] = field(default_factory=list)  # dotted module paths its src/ provides


def read_member(directory: Path) -> Member:
    project = tomllib.loads((directory / "pyproject.toml").read_text())
    spec = project["project"]
    requirements = list(spec.get("dependencies", []))
    for extra in spec.get("optional-dependencies", {}).values():
        requirements += extra
    declared = {requirement_name(r) for r in requirements} - {normalize(spec["name"])}
    exempt = project.get("tool", {}).get("rllm", {}).get("deps", {}).get("not-imported", [])
    member = Member(normalize(spec["name"]), directory, declared, {normalize(n) for n in exempt})
    src = directory / "src"
    for init in src.rglob("*.py"):
        parts = init.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            member.modules.append(".".join(parts))
    return member


def imports_of(source: str) -> set[str]:
    """The absolute module names ``source`` imports (``from . import x`` is the member's own)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


class Resolver:
    """Module name → distribution name (normalised), or None for the standard library."""

    def __init__(self, members: Iterable[Member], installed: Mapping[str, list[str]]) -> None:
        self.first_party: dict[str, str] = {}
        for member in members:
            for module in member.modules:
                self.first_party[module] = member.name
        self.installed = {top: [normalize(d) for d in dists] for top, dists in installed.items()}

    def distribution(self, module: str) -> str | None:
        parts = module.split(".")
        top = parts[0]
        if top in sys.stdlib_module_names or top == "__future__":
            return None
        for end in range(len(parts), 0, -1):  # longest first-party match
            owner = self.first_party.get(".".join(parts[:end]))
            if owner is not None:
                return owner
        if top == "rllm":
            raise SystemExit(f"{module}: no workspace member provides it")
        for end in range(len(parts), 0, -1):
            known = KNOWN.get(".".join(parts[:end]))
            if known is not None:
                return known
        dists = self.installed.get(top)
        if dists:
            return dists[0]
        return normalize(top)


def problems(member: Member, resolver: Resolver) -> list[str]:
    """One line per undeclared or unused dependency of ``member``."""
    used: dict[str, str] = {}  # distribution → one importing file, for the message
    for path in sorted((member.directory / "src").rglob("*.py")):
        for module in sorted(imports_of(path.read_text())):
            dist = resolver.distribution(module)
            if dist is not None and dist != member.name:
                used.setdefault(dist, f"{path.relative_to(member.directory)} imports {module}")
    out = [
        f"{member.name}: imports {dist} without declaring it ({where})"
        for dist, where in sorted(used.items())
        if dist not in member.declared
    ]
    if member.directory.parent.name == "cookbooks" or member.name.startswith("rllm-adapter-"):
        out += [
            f"{member.name}: a cookbook or adapter uses only rllm-types and rllm-sdk of rLLM, not {dist} ({where})"
            for dist, where in sorted(used.items())
            if dist.startswith("rllm-") and dist not in COOKBOOK_MAY_USE
        ]
    out += [
        f"{member.name}: declares {dist} but no module imports it"
        for dist in sorted(member.declared - set(used) - member.not_imported)
    ]
    out += [
        f"{member.name}: [tool.rllm.deps] not-imported lists {dist}, which is imported or undeclared"
        for dist in sorted(member.not_imported & (set(used) | (member.not_imported - member.declared)))
    ]
    return out


def workspace_members(root: Path) -> list[Member]:
    return [
        read_member(p.parent) for pattern in MEMBERS for p in sorted(root.glob(f"{pattern}/pyproject.toml"))
    ]


def check(root: Path) -> list[str]:
    members = workspace_members(root)
    resolver = Resolver(members, importlib.metadata.packages_distributions())
    return [line for member in members for line in problems(member, resolver)]


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    found = check(root)
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} dependency problem(s): declare what each package imports, and only that")
        return 1
    print(
        f"dependencies: every one of {len(workspace_members(root))} workspace members declares what it imports"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
