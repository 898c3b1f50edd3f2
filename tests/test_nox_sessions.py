"""README.md and noxfile.py agree on the test matrix: every nox session is described in README's
Tests section (with what it needs), every session README names exists, and `.ci/run` runs
exactly README's test command — so no session can drop out of CI, or out of the docs, unnoticed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "uv run --locked nox -s "


def nox_sessions() -> set[str]:
    """The names of the functions noxfile.py decorates with ``nox.session`` (``name=`` if given)."""
    names = set()
    for node in ast.walk(ast.parse((ROOT / "noxfile.py").read_text())):
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            call = deco if isinstance(deco, ast.Call) else None
            target = call.func if call is not None else deco
            if ast.unparse(target) != "nox.session":
                continue
            name = node.name
            for kw in call.keywords if call is not None else []:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                    name = str(kw.value.value)
            names.add(name)
    return names


def tests_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("**Tests**")
    return readme[start : readme.index("\n## ", start)]


def ci_command() -> list[str]:
    (line,) = [ln for ln in tests_section().splitlines() if ln.startswith(COMMAND)]
    return line[len(COMMAND) :].split()


def described() -> set[str]:
    """Sessions README describes: "`name` (what it runs and needs)"."""
    return set(re.findall(r"`([a-z][a-z0-9-]*)` \(", tests_section()))


def named_anywhere() -> set[str]:
    """Every ``nox -s NAME...`` in README.md."""
    names: set[str] = set()
    for args in re.findall(r"nox -s ([a-z0-9 -]+)", (ROOT / "README.md").read_text()):
        names.update(args.split())
    return names


def test_every_nox_session_is_described_in_readme() -> None:
    assert nox_sessions() - described() == set()


def test_every_session_readme_names_exists_in_the_noxfile() -> None:
    sessions = nox_sessions()
    assert described() - sessions == set()
    assert named_anywhere() - sessions == set()
    assert set(ci_command()) <= sessions


def test_ci_runs_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert COMMAND + " ".join(ci_command()) in ci


def test_the_checks_see_what_they_check() -> None:
    # Guards against a parser that finds nothing (then every check above passes vacuously).
    assert {"lint", "tests", "verl-e2e", "gateway-vllm", "collect"} <= nox_sessions()
    assert {"verl-e2e", "gateway-vllm"} <= set(ci_command())
