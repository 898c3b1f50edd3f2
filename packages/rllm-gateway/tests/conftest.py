"""Fixtures: a real MockUpstream and a real GatewayServer on loopback, per test."""

from __future__ import annotations

import os

import pytest

from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer
from rllm.testing import MockUpstream
from rllm.testing import wait_until as _wait_until

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# RLLM_TEST_VLLM_URL points the client tests at a real vLLM server (nox -s gateway-vllm).
VLLM_URL = os.environ.get("RLLM_TEST_VLLM_URL")


@pytest.fixture
async def mock():
    m = MockUpstream()
    await m.start()
    yield m
    await m.stop()


@pytest.fixture
async def upstream_url(mock):
    """The upstream the client tests talk through: the mock, or a real vLLM when configured."""
    return VLLM_URL.rstrip("/") if VLLM_URL else mock.url


@pytest.fixture
async def gateway(upstream_url):
    server = GatewayServer(GatewayConfig(upstreams=[upstream_url], health_interval_s=0))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def client(gateway):
    async with GatewayClient(gateway.url) as c:
        yield c


@pytest.fixture
async def model_name(upstream_url, gateway):
    """The served model's name (the mock's, or whatever the vLLM server serves)."""
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(f"{upstream_url}/models") as r:
        return (await r.json())["data"][0]["id"]


class _Held:
    """A MockUpstream responder that holds each call until released: ``arrived`` is set when a
    call reached the upstream (so it is in flight in the gateway), ``release`` lets them answer."""

    def __init__(self, text: str = "held") -> None:
        import asyncio

        self.text = text
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, body):
        self.arrived.set()
        await self.release.wait()
        return self.text


@pytest.fixture
def wait_until():
    """``await wait_until(lambda: ..., what=...)``: poll a condition (rllm.testing.wait_until)."""
    return _wait_until


@pytest.fixture
def held(mock):
    """The mock upstream holds every call until ``held.release.set()`` (see _Held)."""
    h = _Held()
    mock.responder = h
    return h
