"""The early proxy lane (proxy_lane.py): non-streaming calls answered from I/O callbacks with no
task per call, and every way such a call ends — answered, its kept-alive upstream connection
found dead (retried through the failover path), upstream timeout, client gone, gateway paused.
Real gateway, real MockUpstream, real openai / aiohttp clients on loopback."""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import openai
import pytest

from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer
from rllm.gateway.proxy_lane import ProxyExchange


def _oc(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)


async def _say(oc: openai.AsyncOpenAI, text: str) -> str:
    r = await oc.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content or ""


def _retries(gw: GatewayServer) -> float:
    text = gw.metrics.render()[0].decode()
    return float(re.search(r"^rllm_gateway_upstream_retries_total (\S+)$", text, re.M).group(1))


def _settled(gw: GatewayServer) -> bool:
    """Nothing counted in flight, on the gateway or on any upstream."""
    return gw.inflight == 0 and all(w.inflight == 0 for w in gw.pool.upstreams.values())


@pytest.fixture
async def lane(mock):
    cfg = GatewayConfig(upstreams=[mock.url], health_interval_s=0)
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as client:
        await _say(_oc(client.session_url("warm")), "warm")  # leaves a kept-alive connection
        yield gw, client


async def test_calls_run_without_a_task_and_match_the_task_path(mock, wait_until):
    """The same conversation through the lane and through the task path: the agent sees the same
    replies and the traces hold the same tokens, logprobs and order."""
    results = []
    for on in (True, False):
        cfg = GatewayConfig(upstreams=[mock.url], health_interval_s=0, proxy_lane=on)
        async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as client:
            oc = _oc(client.session_url("s"))
            messages = [{"role": "user", "content": "first"}]
            replies = []
            for turn in range(3):
                r = await oc.chat.completions.create(model="m", messages=messages, tools=None if turn else [])
                replies.append(r.choices[0].message.content)
                messages += [{"role": "assistant", "content": r.choices[0].message.content}]
                messages += [{"role": "user", "content": f"turn {turn}"}]
            mock.latency = 0.3
            pending = asyncio.create_task(_say(oc, "held"))
            await wait_until(lambda gw=gw: gw.inflight == 1, what="the call to be in flight")
            busy = [c for c in gw.http_server.connections if c._task is not None]
            assert len(busy) == 1
            assert isinstance(busy[0]._task, ProxyExchange) is on  # lane: the call holds no task
            assert (busy[0].handler is None) is on
            replies.append(await pending)
            mock.latency = 0.0
            traces = await client.get_traces("s")
            assert _settled(gw)
        results.append(
            (
                replies,
                [
                    (
                        t.seq,
                        t.status,
                        list(t.prompt_ids),
                        list(t.completion_ids),
                        list(t.completion_logprobs),
                        t.response,
                    )
                    for t in traces
                ],
            )
        )
    assert results[0] == results[1]
    assert results[0][0][-1] == "echo: held" and len(results[0][1]) == 4


async def test_dead_kept_alive_connection_is_retried_on_a_fresh_one(lane, mock):
    gw, client = lane
    mock.fail("die", count=1)  # the upstream closes the kept-alive connection without answering
    before = _retries(gw)
    assert await _say(_oc(client.session_url("drop")), "again") == "echo: again"
    assert _retries(gw) == before + 1
    assert gw.pool.upstreams[mock.url].healthy
    assert [(t.seq, t.status) for t in await client.get_traces("drop")] == [(0, "ok")]
    assert _settled(gw)


async def test_upstream_timeout_on_the_lane_is_504_and_the_next_call_works(mock):
    cfg = GatewayConfig(upstreams=[mock.url], upstream_timeout_s=0.3, health_interval_s=0)
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as client:
        oc = _oc(client.session_url("t"))
        await _say(oc, "warm")
        mock.fail("hang", count=1)
        with pytest.raises(openai.APIStatusError) as e:
            await _say(oc, "hangs")
        assert e.value.status_code == 504 and "timed out" in str(e.value)
        assert await _say(oc, "after") == "echo: after"
        traces = await client.get_traces("t")
        assert [t.status for t in traces] == ["ok", "error", "ok"]
        assert "timed out" in traces[1].metadata["error"]
        assert _settled(gw)


async def test_client_gone_mid_call_aborts_the_trace_and_the_upstream_call(lane, mock, wait_until):
    gw, client = lane
    mock.fail("hang", count=1)
    body = {"model": "m", "messages": [{"role": "user", "content": "going away"}]}
    async with aiohttp.ClientSession() as http:
        call = asyncio.create_task(http.post(client.session_url("gone") + "/chat/completions", json=body))
        await wait_until(
            lambda: any(isinstance(c._task, ProxyExchange) for c in gw.http_server.connections),
            what="the call on the lane",
        )
        call.cancel()  # the agent hangs up
        with pytest.raises(asyncio.CancelledError):
            await call
    traces = []

    async def aborted() -> bool:
        nonlocal traces
        traces = await client.get_traces("gone")
        return bool(traces) and mock.stats.cancelled > 0

    await wait_until(aborted, what="the abort trace and the upstream's cancel")
    assert [t.status for t in traces] == ["abort"]
    assert mock.stats.cancelled == 1  # the upstream saw its connection go
    assert _settled(gw)
    assert await _say(_oc(client.session_url("gone")), "next") == "echo: next"


async def test_pause_waits_for_calls_on_the_lane(lane, mock, wait_until):
    gw, client = lane
    mock.latency = 0.3
    oc = _oc(client.session_url("p"))
    first = asyncio.create_task(_say(oc, "in flight"))
    await wait_until(lambda: gw.inflight == 1, what="the call on the lane")
    await client.pause()  # returns only once the call on the lane has been answered
    assert first.done() and first.result() == "echo: in flight"
    late = asyncio.create_task(_say(oc, "late"))
    await wait_until(lambda: gw.waiting == 1, what="the late call to wait at the door")
    assert not late.done()  # a paused gateway holds new calls (in a task, off the lane)
    await client.resume()
    assert await late == "echo: late"
    assert [t.status for t in await client.get_traces("p")] == ["ok", "ok"]


async def test_mock_upstream_answers_from_its_latency_timer(mock, wait_until):
    """The stand-in for vLLM uses the same early hook: a whole answer waits on a timer, not in a
    task, and a client that hangs up cancels the timer."""
    mock.latency = 0.3
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    url = mock.url + "/chat/completions"
    async with aiohttp.ClientSession() as http:
        t0 = time.monotonic()
        call = asyncio.create_task(http.post(url, json=body))
        busy = lambda: [c for c in mock._server.connections if c._task is not None]  # noqa: E731
        await wait_until(busy, what="the call to reach the mock")
        (waiting,) = [c for c in mock._server.connections if c._task is not None]
        assert isinstance(waiting._task, asyncio.TimerHandle) and waiting.handler is None
        resp = await call
        assert (await resp.json())["choices"][0]["message"]["content"] == "echo: hi"
        assert time.monotonic() - t0 >= 0.3
        gone = asyncio.create_task(http.post(url, json=body))
        await wait_until(busy, what="the second call to reach the mock")
        gone.cancel()  # the client hangs up while the answer waits
        with pytest.raises(asyncio.CancelledError):
            await gone
        await wait_until(lambda: not busy(), what="the mock to drop the call")
        assert all(c._task is None for c in mock._server.connections)
        again = await http.post(url, json={**body, "messages": [{"role": "user", "content": "again"}]})
        assert (await again.json())["choices"][0]["message"]["content"] == "echo: again"


async def test_pipelined_calls_on_one_connection_are_answered_in_order(lane, mock):
    """Three calls written at once on one connection (the third streamed, so it takes the task
    path): answered in order, each from its own trace."""
    gw, client = lane
    mock.latency = 0.05
    reader, writer = await asyncio.open_connection(gw.host, gw.port)
    raw = b""
    for i, stream in ((1, False), (2, False), (3, True)):
        body = (
            f'{{"model":"m","messages":[{{"role":"user","content":"n{i}"}}],"stream":{str(stream).lower()}}}'
        )
        raw += (
            f"POST /sessions/pipe/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
        ).encode()
    writer.write(raw)
    data = b""
    while b"data: [DONE]" not in data:
        data += await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    assert data.count(b"HTTP/1.1 200 OK") == 3
    assert data.index(b"echo: n1") < data.index(b"echo: n2") < data.index(b"text/event-stream")
    assert [(t.seq, t.messages[0].content) for t in await client.get_traces("pipe")] == [
        (0, "n1"),
        (1, "n2"),
        (2, "n3"),
    ]
    assert _settled(gw)
