"""Fixtures: the loopback fake of the Fireworks service and backends started against it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

# Tests import the fake beside them (importlib mode does not put test dirs on sys.path).
sys.path.insert(0, str(Path(__file__).parent))
from fireworks_helpers import options

from rllm.backends.fireworks import FireworksBackend
from rllm.testing.fireworks import FAKE_API_KEY, FakeFireworksServer


@pytest.fixture(scope="module")
def fake_fireworks() -> Iterator[FakeFireworksServer]:
    with FakeFireworksServer() as server:
        yield server


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key comes from FIREWORKS_API_KEY only; nothing else may steer the SDK."""
    monkeypatch.setenv("FIREWORKS_API_KEY", FAKE_API_KEY)
    for name in ("FIREWORKS_ACCOUNT_ID", "FIREWORKS_BASE_URL", "FIREWORKS_TRAINER_GATEWAY_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def backend(fake_fireworks: FakeFireworksServer) -> AsyncIterator[FireworksBackend]:
    backend = FireworksBackend(options(fake_fireworks))
    await backend.start()
    yield backend
    await backend.close()
