"""Workspace-level guarantees: layering contracts and light dependency sets."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"torch", "litellm", "uvicorn", "transformers", "aiohttp", "fastapi", "peft", "verl", "ray", "vllm"}


def resolved_dependencies(package: str, extras: tuple[str, ...] = ()) -> set[str]:
    """Every package that installing ``package[extras]`` pulls in on Linux, from uv.lock."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    by_name = {p["name"]: p for p in lock["package"]}
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(package, extras)]
    while todo:
        name, wanted = todo.pop()
        entry = by_name[name]
        deps = list(entry.get("dependencies", []))
        for extra in wanted:
            deps += entry.get("optional-dependencies", {}).get(extra, [])
        for dep in deps:
            marker = dep.get("marker", "")
            if "sys_platform == 'win32'" in marker or "sys_platform == 'darwin'" in marker:
                continue
            key = (dep["name"], tuple(dep.get("extra", ())))
            if dep["name"] not in seen or key[1]:
                seen.add(dep["name"])
                todo.append(key)
    return seen


def test_sdk_installs_without_heavy_dependencies() -> None:
    deps = resolved_dependencies("rllm-sdk")
    assert not deps & HEAVY, f"rllm-sdk pulls in {sorted(deps & HEAVY)}"
    assert deps <= {"rllm-types", "msgspec"}, sorted(deps)


def test_types_depend_only_on_msgspec() -> None:
    assert resolved_dependencies("rllm-types") == {"msgspec"}


def test_cookbook_depends_only_on_types_sdk_and_a_client() -> None:
    deps = resolved_dependencies("rllm-cookbook-say")
    assert not deps & HEAVY, sorted(deps & HEAVY)
    assert {"rllm-gateway", "rllm-engine", "rllm-algos", "rllm-backend-tinker"}.isdisjoint(deps)


def test_dependency_walk_sees_heavy_packages() -> None:
    # Guards the walk itself: the tinker backend does pull torch and transformers.
    assert {"torch", "transformers"} <= resolved_dependencies("rllm-backend-tinker")


def test_no_namespace_init_files() -> None:
    offenders = [p for p in ROOT.glob("packages/*/src/rllm/__init__.py")]
    offenders += [p for p in ROOT.glob("packages/*/src/rllm/backends/__init__.py")]
    assert not offenders, f"rllm is a PEP 420 namespace; remove {offenders}"


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter not installed")
def test_import_linter_contracts_hold() -> None:
    result = subprocess.run(
        [shutil.which("lint-imports") or "lint-imports"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.lower().replace("0 broken", "")
