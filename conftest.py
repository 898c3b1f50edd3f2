"""Fixtures every test in the repository gets."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _restore_what_the_cli_quiets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`rllm`'s `main()` quiets third-party loggers and sets environment variables for the process
    (as a command should); tests that call it in-process must not leak that into later tests."""
    try:
        from rllm.cli.quiet import QUIET_ENV, QUIET_LOGGERS
    except ImportError:  # a nox session without the CLI
        yield
        return

    for name in QUIET_ENV:
        monkeypatch.delenv(name, raising=False)  # restored after the test, whatever main() set
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
