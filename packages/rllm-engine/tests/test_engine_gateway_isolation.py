"""A session URL grants its own chat routes and nothing else on the engine's own gateway.

The engine starts its gateway with a fresh admin key that it keeps to itself. An attacker is a
real HTTP client (aiohttp, over loopback TCP) holding one rollout's session URL and token, as an
agent does: every admin route (listing sessions, another session's traces, opening a session,
the weight version, ...) is refused, a chat in its own session works, and the key is nowhere a
flow can look: its AgentConfig, its environment, a subprocess's environment, the episode, the
log. Run with flows in the engine's process (the in-process call path) and in worker processes
(each with its own gateway, opened by the driver with the same key).
"""

from __future__ import annotations

import importlib
import json
import logging
import textwrap
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.gateway import GatewayClient, LocalGatewayClient
from rllm.gateway.admin_routes import AdminRoutes
from rllm.sdk import AgentConfig, Task, rollout
from rllm.types import TerminationReason, convert, to_json

# What a flow can see of itself: its AgentConfig, its environment and a child's environment.
# Written to a module so that worker processes (spawned) import the same flow.
FLOWS = """
import asyncio
import json
import os
import sys

import msgspec

from rllm.sdk import rollout
from rllm.sdk.clients import async_openai


@rollout
async def looks_around(task, config):
    async with async_openai(config) as client:
        reply = await client.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": f"hi #{task.id}"}]
        )
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))",
        stdout=asyncio.subprocess.PIPE,
    )
    child_env, _ = await child.communicate()
    return {
        "config": msgspec.to_builtins(config),
        "env": dict(os.environ),
        "child_env": json.loads(child_env),
        "reply": reply.choices[0].message.content,
    }
"""

BODY = {"weight_version": 99, "session_id": "planted", "url": "http://127.0.0.1:9/v1"}


@pytest.fixture
def flows(tmp_path, monkeypatch):
    (tmp_path / "rllm_isolation_flows.py").write_text(textwrap.dedent(FLOWS))
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned workers inherit it
    return importlib.import_module("rllm_isolation_flows")


def _admin_routes() -> list[tuple[str, str]]:
    """Every admin route the gateway serves (so a new one is covered without editing this test)."""
    routes = AdminRoutes(None).routes()  # type: ignore[arg-type] - only the route table is read
    return [(method, path) for method, path, _ in routes if path.startswith("/admin/")]


def _root(base_url: str) -> str:
    parts = urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}"


async def _status(http: aiohttp.ClientSession, method: str, url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with http.request(method, url, json=BODY, headers=headers) as resp:
        await resp.read()
        return resp.status


async def _attack(own: AgentConfig, other: AgentConfig, key: str | None) -> None:
    """What a client holding only ``own``'s URL and token can do to ``own``'s gateway, where
    ``other`` is another live session on it; then, with the key, that nothing changed."""
    root = _root(own.base_url)
    assert _root(other.base_url) == root
    async with aiohttp.ClientSession() as http:
        refused = {}
        for method, path in _admin_routes():
            if path == "/admin/workers":
                continue  # renamed: a 404 naming /admin/upstreams, whoever asks
            url = root + path.replace("{sid}", other.session_id)
            for token in (None, own.api_key):
                refused[(method, path, token is not None)] = await _status(http, method, url, token)
        # 401 without a key, 403 with the session's token: every route, listed at once if not.
        opened = {k: status for k, status in refused.items() if status != (403 if k[2] else 401)}
        assert not opened, f"admin routes a session token opened: {opened}"
        # Another session's traces on the open route, with its own token or none.
        for token in (None, own.api_key):
            assert await _status(http, "GET", f"{root}/sessions/{other.session_id}/traces", token) == 401
        # A chat cannot open a session either (the engine's gateway creates none on first use).
        chat = {"model": own.model, "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(f"{root}/sessions/planted/v1/chat/completions", json=chat) as resp:
            assert resp.status == 404, await resp.text()
        # Control: the session URL does work for its own chat, over the same client.
        headers = {"Authorization": f"Bearer {own.api_key}"}
        async with http.post(f"{own.base_url}/chat/completions", json=chat, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
    async with GatewayClient(root, admin_key=key) as admin:  # the engine's view: nothing moved
        ids = {s["session_id"] for s in await admin.list_sessions()}
        assert {own.session_id, other.session_id} <= ids and "planted" not in ids
        assert await admin.get_weight_version() == 0
        assert len(await admin.get_traces(other.session_id)) == 1  # there was something to read
        assert [u["url"] for u in await admin.list_upstreams()] != []
        assert all("127.0.0.1:9/" not in u["url"] for u in await admin.list_upstreams())


def _key_is_nowhere(key: str | None, episodes: list[Any], log_text: str) -> None:
    for ep in episodes:
        seen = ep.artifacts
        assert key not in json.dumps(seen["config"]) and key not in json.dumps(seen["env"])
        assert key not in json.dumps(seen["child_env"])
        assert key not in to_json(ep).decode()  # the whole episode, traces' metadata included
    assert key not in log_text


def _same_gateway_pair(configs: list[AgentConfig]) -> tuple[AgentConfig, AgentConfig]:
    for a in configs:
        for b in configs:
            if a is not b and _root(a.base_url) == _root(b.base_url):
                return a, b
    raise AssertionError("no two sessions on one gateway")


async def _run(flows, upstream, caplog, **settings: Any) -> None:
    caplog.set_level(logging.DEBUG)
    config = RolloutConfig(n=2, concurrency=4, keep_sessions=True, progress=False, **settings)
    tasks = [Task(id=f"t{i}", instruction="hi") for i in range(3)]
    async with RolloutEngine(flows.looks_around, None, config, upstreams=[upstream.url]) as engine:
        key = engine._admin_key  # read only to check that it went nowhere else
        episodes = await engine.run(tasks)
        for ep in episodes:
            assert ep.termination_reason == TerminationReason.DONE, ep.error
        configs = [convert(ep.artifacts["config"], AgentConfig) for ep in episodes]
        own, other = _same_gateway_pair(configs)
        await _attack(own, other, key)
        assert key is not None and len(key) >= 32
        # The engine's own admin client holds the key: its calls still work.
        await engine.client.set_weight_version(3)
        assert await engine.client.get_weight_version() == 3
    _key_is_nowhere(key, episodes, caplog.text)


async def test_a_session_url_opens_only_its_own_chat_in_process(flows, upstream, caplog):
    await _run(flows, upstream, caplog)


async def test_a_session_url_opens_only_its_own_chat_on_worker_gateways(flows, upstream, caplog):
    await _run(flows, upstream, caplog, workers=2)


async def test_each_engine_makes_its_own_key_and_keeps_a_given_one(upstream):
    @rollout
    async def flow(task: Task, config: AgentConfig) -> None:
        return None

    first = RolloutEngine(flow, None, upstreams=[upstream.url])
    second = RolloutEngine(flow, None, upstreams=[upstream.url])
    given = RolloutEngine(flow, None, upstreams=[upstream.url], admin_key="mine")
    assert first._admin_key != second._admin_key
    assert given._admin_key == "mine"
    async with given:  # its in-process admin client and in-process chat path work with the key
        assert isinstance(given.client, LocalGatewayClient)
        assert given.client.server.config.admin_key == "mine"
        async with GatewayClient(given.gateway_url, admin_key="mine") as admin:
            assert await admin.list_sessions() == []
        async with GatewayClient(given.gateway_url) as anyone:
            with pytest.raises(Exception, match="401"):
                await anyone.list_sessions()
