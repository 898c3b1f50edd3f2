"""Each package has its own version; rLLM packages name each other with ranges; one package bumps
alone (scripts/bump_version.py), widening only the ranges the new version falls out of."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bump_version", ROOT / "scripts" / "bump_version.py")
assert _spec is not None and _spec.loader is not None
bump_version = importlib.util.module_from_spec(_spec)
sys.modules["bump_version"] = bump_version
_spec.loader.exec_module(bump_version)


def test_every_dependency_on_a_workspace_package_is_a_range_admitting_it() -> None:
    assert bump_version.problems(ROOT) == []


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A copy of the workspace's pyproject.toml files (nothing else is read)."""
    for path in bump_version.pyprojects(ROOT).values():
        target = tmp_path / path.relative_to(ROOT)
        target.parent.mkdir(parents=True)
        shutil.copy(path, target)
    return tmp_path


def _project(root: Path, name: str) -> dict:
    return tomllib.loads(bump_version.pyprojects(root)[name].read_text())["project"]


def test_a_patch_bump_touches_only_that_package(workspace: Path) -> None:
    before = {n: p.read_text() for n, p in bump_version.pyprojects(workspace).items()}
    assert bump_version.main(["rllm-types", "patch", "--no-lock", "--root", str(workspace)]) == 0
    after = {n: p.read_text() for n, p in bump_version.pyprojects(workspace).items()}
    assert [n for n in before if before[n] != after[n]] == ["rllm-types"]
    assert _project(workspace, "rllm-types")["version"] == "0.1.1"


def test_a_minor_bump_below_one_moves_the_dependents_to_the_new_series(workspace: Path) -> None:
    changes = bump_version.bump(workspace, "rllm-sdk", "minor")
    assert changes[0] == "rllm-sdk: 0.1.0 -> 0.2.0"
    engine = _project(workspace, "rllm-engine")["dependencies"]
    assert "rllm-sdk>=0.2,<0.3" in engine
    say = _project(workspace, "rllm-cookbook-say")["dependencies"]
    assert "rllm-sdk[openai]>=0.2,<0.3" in say  # extras kept
    assert _project(workspace, "rllm-types")["version"] == "0.1.0"  # the others keep theirs
    assert bump_version.problems(workspace) == []


def test_a_missing_or_excluding_range_is_reported(workspace: Path) -> None:
    path = bump_version.pyprojects(workspace)["rllm-runtime"]
    path.write_text(path.read_text().replace('"rllm-types>=0.1,<0.2"', '"rllm-types"'))
    path = bump_version.pyprojects(workspace)["rllm-sdk"]
    path.write_text(path.read_text().replace('"rllm-types>=0.1,<0.2"', '"rllm-types>=0.2,<0.3"'))
    found = bump_version.problems(workspace)
    assert len(found) == 2 and found[0].startswith("rllm-runtime: 'rllm-types' must be a range")


@pytest.mark.parametrize(
    ("version", "part", "new", "series"),
    [
        ("0.1.0", "minor", "0.2.0", ">=0.2,<0.3"),
        ("0.9.3", "major", "1.0.0", ">=1.0,<2.0"),
        ("1.4.2", "patch", "1.4.3", ">=1.4,<2.0"),
    ],
)
def test_versions_and_series(version: str, part: str, new: str, series: str) -> None:
    assert bump_version.bumped(version, part) == new
    assert bump_version.series_range(new) == series
    assert bump_version.admits(series, new)
