"""Each product package installs alone and imports: its wheel plus only what it declares, in a fresh venv.

For every workspace member but the dev-only rllm-testing (the packages and the cookbooks):

1. a fresh venv gets, from ``uv.lock`` (``uv sync --package NAME --no-editable``), the member's
   wheel (built from its source) with the extras named below, the wheels of the rLLM packages it
   declares and its third-party dependencies at the locked versions, nothing else (no dev group,
   no other member), out of the uv cache: ``--offline`` unless ``--online`` (after
   ``uv sync --locked`` the cache holds every one of them);
2. every module of the member is imported there. A module may fail only for want of a package
   the member declares in an extra it was not installed with (``verl`` for the verl backend);
   anything else (an undeclared dependency, a first-party module that is not there) fails;
3. each console script it declares runs ``--help``.

The extras: those the root ``pyproject.toml`` installs for development (all in the uv cache), so
the check runs offline. Left out on purpose: rllm-backend-verl's ``verl`` extra (verl, Ray, vLLM:
gigabytes; `nox -s verl` installs it) and rllm-engine's ``wandb``.

Run by ``uv run nox -s packages``, or alone: ``uv run python scripts/check_packages.py [NAME...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_wheels import workspace_members

ROOT = Path(__file__).resolve().parents[1]
DEV_ONLY = {"rllm-testing"}

# Imports every module of the package whose import root is argv[1]; prints one JSON line:
# {"imported": n, "missing": {module: missing top-level name}, "failed": {module: error}}.
_IMPORT_ALL = r"""
import importlib, json, pkgutil, sys, traceback
root = sys.argv[1]
out = {"imported": 0, "missing": {}, "failed": {}}
package = importlib.import_module(root)
names = [root] + [i.name for i in pkgutil.walk_packages(package.__path__, root + ".")]
for name in names:
    try:
        importlib.import_module(name)
        out["imported"] += 1
    except ModuleNotFoundError as exc:
        out["missing"][name] = (exc.name or "").split(".")[0]
    except BaseException as exc:
        out["failed"][name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def root_extras() -> dict[str, list[str]]:
    """member name → the extras the root pyproject installs it with."""
    extras: dict[str, list[str]] = {}
    for requirement in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", requirement.strip())
        if match and match.group(2):
            extras[normalize(match.group(1))] = [e.strip() for e in match.group(2).split(",")]
    return extras


def import_root(member: Path) -> str:
    """The dotted import root of a member (``rllm.backends.tinker``, ``rllm_cookbook_say``)."""
    inits = sorted((member / "src").rglob("__init__.py"), key=lambda p: len(p.parts))
    return ".".join(inits[0].parent.relative_to(member / "src").parts)


def optional_modules(project: dict, installed_extras: list[str]) -> set[str]:
    """Top-level module names (normalised distribution names) of the extras left out."""
    names: set[str] = set()
    for extra, requirements in project.get("optional-dependencies", {}).items():
        if extra in installed_extras:
            continue
        for requirement in requirements:
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
            if match:
                names.add(normalize(match.group(1)))
    return names


def check_member(member: Path, work: Path, offline: bool) -> list[str]:
    started = time.monotonic()
    project = tomllib.loads((member / "pyproject.toml").read_text())["project"]
    name = normalize(project["name"])
    extras = root_extras().get(name, [])
    venv = work / name
    python = venv / "bin" / "python"
    target = f"{name}[{','.join(extras)}]" if extras else name
    # From uv.lock: the member and what it declares, nothing else (no dev group, no other member);
    # --no-editable builds the member's and its rLLM dependencies' wheels and installs those.
    sync = ["uv", "sync", "--locked", "--quiet", "--no-editable", "--no-default-groups", "--package", name]
    sync += [arg for extra in extras for arg in ("--extra", extra)]
    sync += ["--python", sys.executable, *(["--offline"] if offline else [])]
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)}
    result = subprocess.run(sync, capture_output=True, text=True, check=False, cwd=ROOT, env=env)
    if result.returncode != 0:
        return [f"{name}: installing {target} alone failed: {result.stderr.strip()[-2000:]}"]
    problems: list[str] = []
    root = import_root(member)
    result = subprocess.run(
        [str(python), "-c", _IMPORT_ALL, root], capture_output=True, text=True, check=False, cwd=work
    )
    if result.returncode != 0:
        return [f"{name}: importing {root} failed: {result.stderr.strip()[-2000:]}"]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    allowed = optional_modules(project, extras)
    for module, missing in sorted(report["missing"].items()):
        if normalize(missing) not in allowed:
            problems.append(
                f"{name}: {module} needs {missing!r}, which {name}[{','.join(extras)}] does not install"
            )
    for module, error in sorted(report["failed"].items()):
        problems.append(f"{name}: {module} fails to import: {error}")
    for script in project.get("scripts", {}):
        result = subprocess.run(
            [str(venv / "bin" / script), "--help"], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            problems.append(
                f"{name}: `{script} --help` exited {result.returncode}: {result.stderr.strip()[-1000:]}"
            )
    skipped = f", {len(report['missing'])} left to extras not installed" if report["missing"] else ""
    took = time.monotonic() - started
    print(f"  {target}: {report['imported']} modules imported{skipped} ({took:.0f} s)", flush=True)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="only these members (default: every product member)")
    parser.add_argument("--online", action="store_true", help="let uv fetch what its cache lacks")
    # Mostly waiting on the disk (linking wheels out of the cache) and on imports: a few at once.
    parser.add_argument("--jobs", type=int, default=4, help="members checked at once (default 4)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    members = [
        m
        for m in workspace_members(ROOT)
        if normalize(tomllib.loads((m / "pyproject.toml").read_text())["project"]["name"]) not in DEV_ONLY
    ]
    if args.names:
        wanted = {normalize(n) for n in args.names}
        members = [
            m
            for m in members
            if normalize(tomllib.loads((m / "pyproject.toml").read_text())["project"]["name"]) in wanted
        ]
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="rllm-packages-") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        # The heaviest (torch) members first, so they do not all start last.
        members.sort(key=lambda m: (m.parent.name != "packages", m.name))
        for found in pool.map(lambda m: check_member(m, Path(tmp), offline=not args.online), members):
            problems += found
    took = time.monotonic() - started
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        return 1
    print(f"check_packages: {len(members)} packages each install alone and import ({took:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
