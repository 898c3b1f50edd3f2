"""Client-side faults: deep or oversized JSON, integers beyond int64, pipelined garbage, 100-continue,
odd session ids and escaped paths, a failed pause. Each answer is a clear 4xx, earlier requests
on the connection are answered whole and in order, and the store can always be read."""

from __future__ import annotations

import asyncio

import aiohttp
import httptools
import msgspec
import pytest

from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer
from rllm.gateway.store import open_store
from rllm.types import TraceRecord, from_msgpack

_MSG = [{"role": "user", "content": "hi"}]


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


class _Responses:
    """Splits raw bytes read from one connection into (status, body) responses."""

    def __init__(self) -> None:
        self.done: list[tuple[int, bytes]] = []
        self._body = b""
        self._parser = httptools.HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.done.append((self._parser.get_status_code(), self._body))
        self._body = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._parser.feed_data(data)
        return self.done


async def _raw(gw: GatewayServer, data: bytes, timeout_s: float = 30) -> list[tuple[int, bytes]]:
    """Write ``data`` on one connection and read until the gateway closes it."""
    reader, writer = await asyncio.open_connection(gw.host, gw.port)
    writer.write(data)
    out = await asyncio.wait_for(reader.read(-1), timeout_s)
    writer.close()
    return _Responses().feed(out)


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


async def _status(gw: GatewayServer, path: str, body: bytes) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http, http.post(gw.url + path, data=body) as r:
        return r.status, await r.json()


@pytest.fixture(params=["memory", "sqlite"])
async def gw(request, mock, tmp_path):
    store = "memory" if request.param == "memory" else f"sqlite:{tmp_path / 't.db'}"
    cfg = GatewayConfig(upstreams=[mock.url], store=store, health_interval_s=0, upstream_timeout_s=2.0)
    server = await GatewayServer(cfg).start()
    yield server
    await server.stop()


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "messages": ' + _nested(1000) + b"}",
        b'{"model": "m", "messages": ' + _nested(100_000) + b"}",
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "metadata": {"a": '
        + _nested(1000)
        + b"}}",
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", '
        b'"function": {"name": "f", "parameters": ' + b'{"a": ' * 900 + b"1" + b"}" * 900 + b"}}]}",
    ],
    ids=["body-1000", "body-100000", "metadata-1000", "tools-900"],
)
async def test_deep_json_is_a_400_and_the_store_stays_readable(gw, body):
    status, err = await _status(gw, "/sessions/deep/v1/chat/completions", body)
    assert status == 400 and "nested" in err["error"]["message"], err
    ok = msgspec.json.encode({"model": "m", "messages": _MSG})
    assert (await _status(gw, "/sessions/deep/v1/chat/completions", ok))[0] == 200
    async with GatewayClient(gw.url) as c:
        assert [t.status for t in await c.get_traces("deep")] == ["ok"]  # msgpack reads work
        assert len(await c.finish_session("deep")) == 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/sessions/big/v1/completions", b'{"model": "m", "prompt": [1, 1180591620717411303424]}'),
        (
            "/sessions/big/v1/chat/completions",
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"n": -99999999999999999999}]}',
        ),
        (
            "/sessions/big/v1/chat/completions",
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": 18446744073709551616}',
        ),
    ],
    ids=["prompt", "tools", "seed"],
)
async def test_integers_beyond_int64_are_a_400_naming_the_field(gw, path, body):
    status, err = await _status(gw, path, body)
    assert status == 400 and "64 bits" in err["error"]["message"], err
    assert err["error"]["param"]


async def test_weight_version_beyond_int64_is_refused(gw):
    async with GatewayClient(gw.url) as c:
        with pytest.raises(Exception, match="64 bits"):
            await c.set_weight_version(2**70)
        assert await c.get_weight_version() == 0


@pytest.mark.parametrize("spec", ["memory", "sqlite"])
async def test_one_record_that_cannot_be_encoded_costs_no_other_session_anything(spec, tmp_path):
    """The door refuses such values; if one gets past it anyway, the store writes every other
    record of the batch and the bad one reads back as an ``error`` record saying why."""
    store = open_store("memory" if spec == "memory" else f"sqlite:{tmp_path / 's.db'}", batch_ms=50)
    good = TraceRecord(session_id="good", seq=0)
    bad = TraceRecord(session_id="bad", seq=0, weight_version=2**70)
    store.put(good)
    store.put(bad)
    store.put(TraceRecord(session_id="good", seq=1))
    await store.flush()  # one batch, no error
    assert [t.seq for t in await store.get("good")] == [0, 1]
    if spec == "sqlite":
        (t,) = await store.get("bad")
        assert t.status == "error" and "could not be encoded" in t.metadata["error"]
    await store.close()


async def test_a_bad_record_in_the_memory_store_does_not_hide_the_others(mock):
    async with GatewayServer(GatewayConfig(upstreams=[mock.url], health_interval_s=0)) as gw:
        gw.store.put(TraceRecord(session_id="s", seq=0))
        gw.store.put(TraceRecord(session_id="s", seq=1, weight_version=2**70))
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{gw.url}/sessions/s/traces?format=msgpack") as r,
        ):
            traces = from_msgpack(await r.read(), list[TraceRecord])
        assert [(t.seq, t.status) for t in traces] == [(0, "ok"), (1, "error")]


# ------------------------------------------------------------------ pipelining
_CHAT = msgspec.json.encode({"model": "m", "messages": _MSG})
_GARBAGE = b"NOT HTTP AT ALL\r\n\r\n"


async def test_garbage_after_a_call_answers_the_call_first(gw, mock):
    mock.latency = 0.2  # the call is still in flight when the garbage is parsed
    answers = await _raw(gw, _post("/sessions/p/v1/chat/completions", _CHAT) + _GARBAGE)
    assert [s for s, _ in answers] == [200, 400]
    assert b"echo: hi" in answers[0][1]
    assert [t.status for t in await gw.local_client().get_traces("p")] == ["ok"]


async def test_garbage_after_a_call_that_times_out_comes_after_its_504(gw, mock):
    mock.fail("hang", count=1)
    answers = await _raw(gw, _post("/sessions/p/v1/chat/completions", _CHAT) + _GARBAGE)
    assert [s for s, _ in answers] == [504, 400]
    assert [t.status for t in await gw.local_client().get_traces("p")] == ["error"]


async def test_garbage_after_a_stream_never_lands_inside_its_body(gw, mock):
    mock.chunk_delay = 0.01
    body = msgspec.json.encode({"model": "m", "messages": _MSG, "stream": True})
    answers = await _raw(gw, _post("/sessions/p/v1/chat/completions", body) + _GARBAGE)
    assert [s for s, _ in answers] == [200, 400]
    assert answers[0][1].endswith(b"data: [DONE]\n\n") and b"HTTP/1.1" not in answers[0][1]
    assert [t.status for t in await gw.local_client().get_traces("p")] == ["ok"]


# ------------------------------------------------------------------ the smaller ones
async def test_an_over_limit_body_with_expect_100_continue_gets_413_at_once(mock):
    cfg = GatewayConfig(upstreams=[mock.url], health_interval_s=0, max_body_bytes=4096)
    async with GatewayServer(cfg) as gw:
        head = (
            b"POST /sessions/e/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        answers = await _raw(gw, head)  # the body is never sent: the answer must not wait for it
        assert [s for s, _ in answers] == [413]


async def test_a_failed_pause_does_not_leave_the_gateway_paused(gw, held, wait_until):
    async with GatewayClient(gw.url) as c:
        call = asyncio.create_task(_status(gw, "/sessions/q/v1/chat/completions", _CHAT))
        await held.arrived.wait()
        with pytest.raises(Exception, match="still in flight"):
            await c.pause(timeout_s=0.05)
        assert gw.health_info()["paused"] is False
        held.release.set()
        assert (await call)[0] == 200


@pytest.mark.parametrize("sid", [".", ".."])
async def test_dot_segments_are_not_session_ids(gw, sid):
    answers = await _raw(gw, _post(f"/sessions/{sid}/v1/chat/completions", _CHAT, "Connection: close\r\n"))
    assert [s for s, _ in answers] == [400]
    async with GatewayClient(gw.url) as c:
        with pytest.raises(Exception, match="invalid session id"):
            await c.create_session(sid)
    assert sid not in gw.sessions


async def test_an_escaped_slash_does_not_change_the_route(gw):
    path = "/sessions/x%2Froles%2Fr/v1/chat/completions"  # decoded first, it would be role "r" of "x"
    answers = await _raw(gw, _post(path, _CHAT, "Connection: close\r\n"))
    assert [s for s, _ in answers] == [400]
    assert "x" not in gw.sessions and not gw.sessions


async def test_with_auth_an_unknown_session_looks_like_a_wrong_token(mock):
    cfg = GatewayConfig(upstreams=[mock.url], health_interval_s=0, session_auth=True, admin_key="k")
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url, admin_key="k") as c:
        await c.create_session("known")
        seen = []
        for sid in ("known", "unknown"):
            async with (
                aiohttp.ClientSession() as http,
                http.post(
                    f"{gw.url}/sessions/{sid}/v1/chat/completions",
                    data=_CHAT,
                    headers={"Authorization": "Bearer nope"},
                ) as r,
            ):
                seen.append(r.status)
        assert seen == [401, 401]


def test_the_record_of_ended_sessions_is_bounded_and_expires(monkeypatch):
    import rllm.gateway.sessions as sessions_mod

    now = [1000.0]
    monkeypatch.setattr(sessions_mod.time, "monotonic", lambda: now[0])
    ended = sessions_mod.EndedSessions(ttl_s=60, max_entries=3)
    for i in range(5):
        ended.add(f"s{i}", f"tok{i}")
    assert len(ended) == 3 and ended.token_of("s0") is None and ended.token_of("s4") == "tok4"
    now[0] += 61
    assert ended.token_of("s4") is None and len(ended) == 0  # expired, and dropped


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "task"])
async def test_a_call_in_flight_when_its_session_ends_gets_410_and_leaves_no_trace(mock, held, lane):
    cfg = GatewayConfig(upstreams=[mock.url], health_interval_s=0, proxy_lane=lane)
    async with GatewayServer(cfg) as gw:
        client = gw.local_client()
        await client.create_session("flow")
        call = asyncio.create_task(_status(gw, "/sessions/flow/v1/chat/completions", _CHAT))
        await held.arrived.wait()
        assert await client.finish_session("flow") == []
        held.release.set()
        status, err = await call
        assert status == 410 and err["error"]["code"] == "session_ended"
        await gw.store.flush()
        assert gw.store.trace_count() == 0 and gw.inflight == 0
