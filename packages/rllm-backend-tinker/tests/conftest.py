"""Fixtures: one tiny model per session (built locally, nothing downloaded), fresh backends."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rllm.backends.tinker import TinkerBackend
from rllm.testing.tinker import FakeTinkerServer
from rllm.tiny import init_tiny_model

# Tests import tinker_helpers.py beside them (importlib mode does not put test dirs on sys.path).
sys.path.insert(0, str(Path(__file__).parent))
from tinker_helpers import WORDS, started_backend


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", vocab_words=WORDS, seed=0)


@pytest.fixture(scope="module")
def sampler_backend(tiny_model_path: Path) -> Iterator[TinkerBackend]:
    """A backend whose weights these tests never train (read-only sampler tests)."""
    backend = started_backend(tiny_model_path, sampler_max_batch=64)
    yield backend
    asyncio.run(backend.close())


@pytest.fixture
def backend(tiny_model_path: Path) -> Iterator[TinkerBackend]:
    backend = started_backend(tiny_model_path, learning_rate=1e-2)
    yield backend
    asyncio.run(backend.close())


@pytest.fixture(scope="module")
def fake_tinker() -> Iterator[FakeTinkerServer]:
    """The loopback stand-in for the paid Tinker service (rllm.testing.tinker), one per module."""
    with FakeTinkerServer() as server:
        yield server


@pytest.fixture
def no_tinker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the config under test decides where the SDK connects and with which credential."""
    for name in ("TINKER_BASE_URL", "TINKER_CREDENTIAL_CMD", "TINKER_PROJECT_ID", "TINKER_TAGS"):
        monkeypatch.delenv(name, raising=False)
