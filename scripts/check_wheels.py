"""Build every product wheel of the workspace and fail if one ships a test fake.

A product wheel (every package and cookbook but the dev-only rllm-testing) may not hold a Python
module that is a mock, a fake or test code: a path part named ``mock*``, ``fake*``, ``*_mock``,
``*_fake``, ``testing``, ``tests``, ``conftest`` or ``test_*``. Data files are not checked (a
cookbook's ``sample/test.jsonl`` is its test split, not test code).

Run by ``uv run nox -s wheels``, or alone: ``uv run --no-sync python scripts/check_wheels.py``
(``--keep DIR`` keeps the wheels there).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

DEV_ONLY = {"rllm_testing"}  # wheel-name prefixes allowed to hold fakes
FAKE_PART = re.compile(r"^(mock|fake)|_(mock|fake)$|^(testing|tests|conftest)$|^test_", re.IGNORECASE)


def fakes_in(wheel: Path) -> list[str]:
    """The Python modules of ``wheel`` whose path names a mock, a fake or test code."""
    found = []
    for name in zipfile.ZipFile(wheel).namelist():
        if not name.endswith(".py"):
            continue
        parts = name.removesuffix(".py").split("/")
        if any(FAKE_PART.search(part) for part in parts):
            found.append(name)
    return found


MEMBERS = ("packages/*", "cookbooks/*")

# Run in one process under a hatchling environment: argv = out dir, then member directories.
_BUILD_WITH_HATCHLING = """
import os, sys
from hatchling.build import build_wheel
out = os.path.abspath(sys.argv[1])
for member in sys.argv[2:]:
    os.chdir(member)
    build_wheel(out)
"""


def workspace_members(root: Path) -> list[Path]:
    """The directories of the workspace's packages and cookbooks (each with a pyproject.toml)."""
    return sorted(p.parent for pattern in MEMBERS for p in root.glob(f"{pattern}/pyproject.toml"))


def build_wheels(root: Path, out: Path) -> list[Path]:
    """Build every member's wheel into ``out``; the wheels written.

    The members built by hatchling with one and the same ``requires`` go through hatchling's
    PEP 517 ``build_wheel`` hook in one process: one build environment instead of one per
    member, the same wheels as ``uv build`` several times faster. Any other member goes through
    ``uv build``."""
    by_requires: dict[tuple[str, ...], list[Path]] = {}
    other: list[Path] = []
    for member in workspace_members(root):
        system = tomllib.loads((member / "pyproject.toml").read_text()).get("build-system", {})
        if system.get("build-backend") == "hatchling.build":
            by_requires.setdefault(tuple(system.get("requires", ["hatchling"])), []).append(member)
        else:
            other.append(member)
    for requires, members in by_requires.items():
        withs = [arg for req in requires for arg in ("--with", req)]
        script = ["python", "-c", _BUILD_WITH_HATCHLING, str(out), *map(str, members)]
        subprocess.run(["uv", "run", "--quiet", "--no-project", *withs, *script], check=True)
    for member in other:
        subprocess.run(["uv", "build", "--wheel", "--quiet", "--out-dir", str(out), str(member)], check=True)
    return sorted(out.glob("*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build into this directory and keep the wheels")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rllm-wheels-") as tmp:
        out = args.keep or Path(tmp)
        wheels = build_wheels(Path(__file__).resolve().parents[1], out)
        products = [w for w in wheels if w.name.split("-", 1)[0] not in DEV_ONLY]
        bad = {w.name: fakes_in(w) for w in products}
        bad = {name: found for name, found in bad.items() if found}
    took = time.monotonic() - started
    if not products:
        print("check_wheels: uv build wrote no product wheel", file=sys.stderr)
        return 1
    for name, found in bad.items():
        print(f"check_wheels: {name} ships test code: {', '.join(found)}", file=sys.stderr)
    if bad:
        return 1
    print(f"check_wheels: {len(products)} product wheels hold no mock, fake or test module ({took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
