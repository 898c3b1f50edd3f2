"""Bump one workspace package's version, keep the other packages' ranges on it true, and check the lock.

Every package has its own version, and a package names another rLLM package with a range
(``"rllm-types>=0.1,<0.2"``: the minor series while below 1.0, the major series from 1.0 on).

    uv run python scripts/bump_version.py rllm-types minor     # 0.1.0 -> 0.2.0
    uv run python scripts/bump_version.py rllm-sdk patch       # 0.1.0 -> 0.1.1
    uv run python scripts/bump_version.py rllm-gateway 0.3.0   # an explicit version
    uv run python scripts/bump_version.py --check              # every range admits its target

A bump writes the package's ``version``; each dependent whose range no longer admits it gets
the range of the new series (a breaking change for it: rerun its tests); then ``uv lock``
records the version and ``uv lock --check`` confirms the lock agrees with every pyproject.toml.
``--check`` changes nothing: it fails when a dependency on a workspace package has no range, or
a range that excludes the version in the workspace, or when the lock is stale.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = ("packages/*", "cookbooks/*")
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_RANGE = re.compile(r"^>=(\d+)\.(\d+)(?:\.\d+)?,<(\d+)\.(\d+)$")


def parse_version(text: str) -> tuple[int, int, int]:
    match = _VERSION.match(text)
    if match is None:
        raise SystemExit(f"version {text!r} is not MAJOR.MINOR.PATCH")
    return int(match[1]), int(match[2]), int(match[3])


def series_range(version: str) -> str:
    """The range of the series ``version`` opens: ``>=0.2,<0.3`` below 1.0, ``>=1.2,<2.0`` from 1.0."""
    major, minor, _ = parse_version(version)
    if major == 0:
        return f">={major}.{minor},<{major}.{minor + 1}"
    return f">={major}.{minor},<{major + 1}.0"


def admits(spec: str, version: str) -> bool:
    match = _RANGE.match(spec)
    if match is None:
        return False
    low = (int(match[1]), int(match[2]))
    high = (int(match[3]), int(match[4]))
    major, minor, _ = parse_version(version)
    return low <= (major, minor) < high


def bumped(version: str, part: str) -> str:
    if _VERSION.match(part):
        return part
    major, minor, patch = parse_version(version)
    if part == "major":
        return f"{major + 1}.0.0"
    if part == "minor":
        return f"{major}.{minor + 1}.0"
    if part == "patch":
        return f"{major}.{minor}.{patch + 1}"
    raise SystemExit(f"bump {part!r}: give major, minor, patch or a version X.Y.Z")


def pyprojects(root: Path) -> dict[str, Path]:
    """package name → its pyproject.toml."""
    found = {}
    for pattern in MEMBERS:
        for path in sorted(root.glob(f"{pattern}/pyproject.toml")):
            found[tomllib.loads(path.read_text())["project"]["name"]] = path
    return found


def _dependency(name: str) -> re.Pattern[str]:
    """A quoted requirement on ``name``: group 1 the name and extras, group 2 its specifier."""
    return re.compile(rf'"({re.escape(name)}(?:\[[^\]]*\])?)([^";]*)((?:;[^"]*)?)"')


def problems(root: Path) -> list[str]:
    """Each dependency on a workspace package that has no range or excludes its version."""
    projects = pyprojects(root)
    versions = {n: tomllib.loads(p.read_text())["project"]["version"] for n, p in projects.items()}
    out = []
    for name, path in projects.items():
        project = tomllib.loads(path.read_text())["project"]
        requirements = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            requirements += extra
        for requirement in requirements:
            target = re.match(r"[A-Za-z0-9._-]+", requirement)
            if target is None or target[0] not in versions or target[0] == name:
                continue
            spec = requirement[target.end() :].split(";")[0]
            spec = re.sub(r"^\[[^\]]*\]", "", spec).replace(" ", "")
            if not admits(spec, versions[target[0]]):
                out.append(
                    f"{name}: {requirement!r} must be a range admitting {target[0]} {versions[target[0]]} "
                    f"(e.g. {target[0]}{series_range(versions[target[0]])})"
                )
    return out


def bump(root: Path, name: str, part: str) -> list[str]:
    """Write the new version and the dependents' ranges; the lines describing each change."""
    projects = pyprojects(root)
    if name not in projects:
        raise SystemExit(f"no workspace package {name!r}; known: {', '.join(sorted(projects))}")
    path = projects[name]
    text = path.read_text()
    old = tomllib.loads(text)["project"]["version"]
    new = bumped(old, part)
    if parse_version(new) <= parse_version(old):
        raise SystemExit(f"{name}: {new} is not above {old}")
    text, count = re.subn(r'(?m)^version = "[^"]*"$', f'version = "{new}"', text, count=1)
    assert count == 1, path
    path.write_text(text)
    changes = [f"{name}: {old} -> {new}"]
    pattern = _dependency(name)
    for other, other_path in projects.items():
        if other == name:
            continue
        original = other_path.read_text()

        def widen(match: re.Match[str], other: str = other) -> str:
            spec = re.sub(r"\s", "", match[2])
            if admits(spec, new):
                return match[0]
            changes.append(f"{other}: {match[1]}{spec or ' (no range)'} -> {match[1]}{series_range(new)}")
            return f'"{match[1]}{series_range(new)}{match[3]}"'

        updated = pattern.sub(widen, original)
        if updated != original:
            other_path.write_text(updated)
    return changes


def lock(root: Path, check_only: bool) -> int:
    """``uv lock`` (unless only checking), then ``uv lock --check``; its exit status."""
    if not check_only:
        subprocess.run(["uv", "lock", "--quiet"], cwd=root, check=True)
    return subprocess.run(["uv", "lock", "--check", "--quiet"], cwd=root, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help="the package to bump, e.g. rllm-types")
    parser.add_argument("part", nargs="?", help="major, minor, patch, or a version X.Y.Z")
    parser.add_argument("--check", action="store_true", help="change nothing; check ranges and lock")
    parser.add_argument("--no-lock", action="store_true", help="leave uv.lock alone (tests)")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.check:
        if not (args.name and args.part):
            parser.error("give NAME and PART, or --check")
        for line in bump(args.root, args.name, args.part):
            print(line)
    found = problems(args.root)
    for line in found:
        print(line, file=sys.stderr)
    if found:
        return 1
    if not args.no_lock and lock(args.root, check_only=args.check) != 0:
        print("uv.lock does not match the pyproject.toml files: run `uv lock`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
