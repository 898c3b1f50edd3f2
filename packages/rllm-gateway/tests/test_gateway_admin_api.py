"""GatewayAdmin: the HTTP client, the in-process client and a group of gateways are one interface.

Each implementation has every operation of the protocol with the same signature, and the same
script of admin calls (sessions, traces, weights, admission, upstreams, errors) against fresh
gateways gives the same transcript through each. Real gateways and a real MockUpstream on
loopback, the real openai client for the agent's calls."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import openai
import pytest

from rllm.gateway import (
    GatewayAdmin,
    GatewayAPIError,
    GatewayClient,
    GatewayConfig,
    GatewayGroup,
    GatewayServer,
    LocalGatewayClient,
)
from rllm.gateway.trace_query import TraceQuery

_IMPLEMENTATIONS = (GatewayClient, LocalGatewayClient, GatewayGroup)
_DEAD = "http://127.0.0.1:1/v1"  # nothing listens on port 1: an upstream that is down


def _members() -> list[str]:
    return [
        name
        for name, value in vars(GatewayAdmin).items()
        if (inspect.isfunction(value) or isinstance(value, property))
        and (not name.startswith("_") or name in ("__aenter__", "__aexit__"))
    ]


def _parameters(fn: Any) -> list[tuple[str, Any, Any]]:
    return [
        (p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values() if p.name != "self"
    ]


@pytest.mark.parametrize("impl", _IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_each_implementation_has_every_operation_with_the_same_signature(impl):
    members = _members()
    assert {"create_session", "finish_session", "pause", "health", "close", "url"} <= set(members)
    for name in members:
        spec = vars(GatewayAdmin)[name]
        if isinstance(spec, property):
            continue  # ``url``: a property or a plain attribute (checked on instances below)
        mine = getattr(impl, name, None)
        assert mine is not None, f"{impl.__name__} lacks {name}"
        assert inspect.iscoroutinefunction(mine) == inspect.iscoroutinefunction(spec), name
        assert _parameters(mine) == _parameters(spec), f"{impl.__name__}.{name}"


async def test_instances_satisfy_the_protocol(gateway):
    async with (
        GatewayClient(gateway.url) as http,
        GatewayGroup([gateway.url]) as group,
    ):
        for admin in (http, gateway.local_client(), group):
            assert isinstance(admin, GatewayAdmin)
            assert admin.url == gateway.url


async def _chat(url: str, text: str) -> str:
    async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as oc:
        r = await oc.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
        return r.choices[0].message.content or ""


def _error(exc: GatewayAPIError) -> tuple[int, str, str]:
    return (exc.status, exc.code, exc.message)


async def _expect_error(call: Any) -> tuple[int, str, str]:
    with pytest.raises(GatewayAPIError) as e:
        await call
    return _error(e.value)


def _relative(url: str, base: str) -> str:
    assert url.startswith(base), (url, base)
    return url[len(base) :]


async def _script(admin: GatewayAdmin, mock_url: str) -> list[Any]:
    """The same admin calls through any implementation, with what depends on the gateway's
    address or the clock taken out of the answers."""
    out: list[Any] = []
    info = await admin.create_session("alpha", metadata={"task": [1, 2]})
    home = admin.session_url("alpha")[: -len("/sessions/alpha/v1")]  # the gateway it lives on
    assert isinstance(info.token, str) and info.token
    out.append((info.session_id, _relative(info.base_url, home)))
    out.append(_relative(admin.session_url("alpha", "judge"), home))
    out.append(await _chat(admin.session_url("alpha"), "one"))
    out.append(await _chat(admin.session_url("alpha", "judge"), "two"))
    await admin.flush()
    sessions = await admin.list_sessions()
    out.append(
        [(s["session_id"], _relative(s["base_url"], home), s["metadata"], s["traces"]) for s in sessions]
    )
    traces = await admin.get_traces("alpha")
    out.append(
        [(t.seq, t.role, t.status, t.messages[0].content, list(t.completion_ids or ())) for t in traces]
    )
    out.append([t.seq for t in await admin.get_traces("alpha", role="judge")])
    out.append([t.seq for t in await admin.query_traces(TraceQuery(session_id="alpha"))])
    out.append([t.role for t in await admin.query_traces(TraceQuery(role="default", limit=5))])
    out.append(await admin.get_traces("never-existed"))
    await admin.set_weight_version(3)
    out.append(await admin.get_weight_version())
    out.append(await _expect_error(admin.set_weight_version("3")))  # type: ignore[arg-type]
    await admin.pause()
    out.append((await admin.health())["paused"])
    await admin.resume()
    health = await admin.health()
    health.pop("gateways", None)  # a group adds each gateway's own under this key
    out.append(health)
    out.append([(w["url"] == mock_url, w["healthy"]) for w in await admin.list_upstreams()])
    added = await admin.add_upstream(_DEAD)
    out.append((added["url"], added["healthy"]))
    out.append(sorted((w["url"], w["healthy"]) for w in await admin.list_upstreams() if w["url"] == _DEAD))
    await admin.remove_upstream(_DEAD)
    out.append(await _expect_error(admin.remove_upstream(_DEAD)))
    finished = await admin.finish_session("alpha")
    out.append([(t.seq, t.role) for t in finished])
    out.append(await _expect_error(admin.finish_session("alpha")))
    out.append(await _expect_error(admin.delete_session("alpha")))
    second = await admin.create_session("beta")
    out.append(await _chat(second.base_url, "three"))
    out.append(await admin.delete_session("beta"))
    out.append(await admin.list_sessions())
    return out


def _config(mock_url: str) -> GatewayConfig:
    return GatewayConfig(upstreams=[mock_url], health_interval_s=0)


@asynccontextmanager
async def _admin(kind: str, mock_url: str) -> AsyncIterator[GatewayAdmin]:
    """A GatewayAdmin of ``kind`` over fresh gateways (two for the group)."""
    servers = [GatewayServer(_config(mock_url)) for _ in range(2 if kind == "group" else 1)]
    for s in servers:
        await s.start()
    try:
        if kind == "http":
            async with GatewayClient(servers[0].url) as admin:
                yield admin
        elif kind == "in_process":
            async with servers[0].local_client() as local:
                yield local
        else:
            async with GatewayGroup([s.url for s in servers]) as group:
                yield group
    finally:
        for s in servers:
            await s.stop()


async def test_the_same_calls_give_the_same_answers_through_every_implementation(mock):
    transcripts = {}
    for kind in ("http", "in_process", "group"):
        async with _admin(kind, mock.url) as admin:
            transcripts[kind] = await _script(admin, mock.url)
    assert transcripts["in_process"] == transcripts["http"]
    assert transcripts["group"] == transcripts["http"]
    reference = transcripts["http"]
    assert reference[2:4] == ["echo: one", "echo: two"]
    assert reference[-5][0] == 404 and reference[-5][1] == "unknown_session"


async def test_a_group_finds_sessions_created_on_its_members(mock):
    """A worker process creates sessions on its own gateway; the group still finishes them."""
    async with _admin("group", mock.url) as group:
        assert isinstance(group, GatewayGroup)
        for i, member in enumerate(group.members):
            info = await member.create_session(f"w{i}")
            assert await _chat(info.base_url, f"from {i}") == f"echo: from {i}"
        assert sorted(s["session_id"] for s in await group.list_sessions()) == ["w0", "w1"]
        for i in range(2):
            (trace,) = await group.finish_session(f"w{i}")
            assert trace.messages[0].content == f"from {i}"
        assert await group.list_sessions() == []


async def test_a_group_pause_that_times_out_leaves_every_gateway_running(mock, held):
    """One gateway cannot drain (a call is held upstream): the group's pause fails with its 504
    and no gateway is left paused, as with a single gateway."""
    async with _admin("group", mock.url) as group:
        assert isinstance(group, GatewayGroup)
        busy = await group.members[0].create_session("busy")
        call = asyncio.create_task(_chat(busy.base_url, "held"))
        await held.arrived.wait()
        with pytest.raises(GatewayAPIError) as e:
            await group.pause(timeout_s=0.2)
        assert e.value.status == 504
        assert [h["paused"] for h in (await group.health())["gateways"]] == [False, False]
        held.release.set()
        assert await call == "held"
