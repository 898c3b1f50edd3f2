"""Admin API through GatewayClient: sessions, traces, weight version, pause/drain, workers, metrics."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from rllm.gateway import GatewayAPIError, GatewayClient, GatewayConfig, GatewayServer
from rllm.gateway.testing import MockUpstream


async def _chat(url: str, text: str = "hi", **kw) -> str:
    oc = openai.AsyncOpenAI(base_url=url, api_key=kw.pop("api_key", "x"), max_retries=0)
    r = await oc.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], **kw)
    return r.choices[0].message.content


async def test_create_list_delete_session_frees_traces(client, gateway):
    info = await client.create_session(metadata={"task": "t1"})
    assert info.base_url == f"{gateway.url}/sessions/{info.session_id}/v1" and info.token
    await _chat(info.base_url)
    await _chat(info.base_url)
    assert [s["session_id"] for s in await client.list_sessions()] == [info.session_id]
    assert gateway.store.trace_count() == 2
    assert await client.delete_session(info.session_id) == 2
    assert gateway.store.trace_count() == 0
    assert await client.get_traces(info.session_id) == []
    with pytest.raises(GatewayAPIError) as e:
        await client.delete_session(info.session_id)
    assert e.value.status == 404


async def test_weight_version_is_stamped_on_traces(client):
    s = await client.create_session("wv")
    assert await client.get_weight_version() == 0
    await _chat(s.base_url)
    await client.set_weight_version(7)
    assert await client.get_weight_version() == 7
    await _chat(s.base_url)
    assert [t.weight_version for t in await client.get_traces("wv")] == [0, 7]


async def test_pause_drains_inflight_and_holds_new_requests(client, mock):
    mock.latency = 0.3
    s = await client.create_session("p")
    first = asyncio.create_task(_chat(s.base_url, "in flight"))
    await asyncio.sleep(0.1)
    await client.pause()  # returns only after the in-flight request finished
    assert first.done()
    late = asyncio.create_task(_chat(s.base_url, "late"))
    await asyncio.sleep(0.2)
    assert not late.done()  # held at the door while paused
    await client.set_weight_version(1)
    await client.resume()
    await late
    traces = await client.get_traces("p")
    assert [(t.messages[0].content, t.weight_version) for t in traces] == [("in flight", 0), ("late", 1)]


async def test_json_and_msgpack_trace_endpoints_agree(client, gateway):
    s = await client.create_session("fmt")
    await _chat(s.base_url, "one")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.url}/admin/sessions/fmt/traces") as r:
            as_json = await r.json()
        async with http.get(f"{gateway.url}/admin/traces?session_id=fmt&limit=5") as r:
            queried = await r.json()
    (t,) = await client.get_traces("fmt")
    assert as_json[0]["completion_ids"] == list(t.completion_ids)
    assert queried[0]["id"] == t.id
    assert [x.id for x in await client.query_traces(role="default", session_id="fmt")] == [t.id]


async def test_workers_add_remove_list_and_sticky_routing():
    async with MockUpstream(model="a") as m1, MockUpstream(model="b") as m2:  # noqa: SIM117
        async with GatewayServer(GatewayConfig(upstreams=[m1.url], health_interval_s=0)) as gw:
            async with GatewayClient(gw.url) as c:
                added = await c.add_worker(m2.url)
                assert added["healthy"] is True
                assert {w["url"] for w in await c.list_workers()} == {m1.url, m2.url}
                for i in range(6):
                    await _chat(c.session_url(f"s{i}"))
                    await _chat(c.session_url(f"s{i}"))
                # Sticky: both turns of a session hit the same worker; both workers got sessions.
                for i in range(6):
                    t0, t1 = await c.get_traces(f"s{i}")
                    assert t0.model == t1.model
                assert m1.stats.requests > 0 and m2.stats.by_path.get("/v1/chat/completions", 0) > 0
                await c.remove_worker(m2.url)
                assert [w["url"] for w in await c.list_workers()] == [m1.url]
                with pytest.raises(GatewayAPIError) as e:
                    await c.remove_worker(m2.url)
                assert e.value.status == 404


async def test_dead_worker_is_retried_on_another_and_503_when_none():
    async with MockUpstream(model="alive") as alive:
        dead = MockUpstream(model="dead")
        await dead.start()
        cfg = GatewayConfig(upstreams=[dead.url, alive.url], health_interval_s=0)
        async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
            gw.sessions.clear()
            await c.create_session("r")
            gw.sessions["r"].worker = dead.url  # stuck to the worker that is about to die
            await dead.stop()
            assert await _chat(c.session_url("r")) == "echo: hi"
            (t,) = await c.get_traces("r")
            assert t.model == "alive" and t.status == "ok"
            workers = {w["url"]: w for w in await c.list_workers()}
            assert workers[dead.url]["healthy"] is False and workers[alive.url]["healthy"] is True
            await c.remove_worker(alive.url)
            oc = openai.AsyncOpenAI(base_url=c.session_url("r"), api_key="x", max_retries=0)
            with pytest.raises(openai.APIStatusError) as e:
                await oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            assert e.value.status_code == 503
            assert e.value.body["type"] == "service_unavailable"


async def test_health_check_restores_a_worker(mock):
    async with GatewayServer(GatewayConfig(upstreams=[mock.url], health_interval_s=0.05)) as gw:
        gw.pool.workers[mock.url].healthy = False
        for _ in range(100):
            await asyncio.sleep(0.02)
            if gw.pool.workers[mock.url].healthy:
                break
        assert gw.pool.workers[mock.url].healthy


async def test_metrics_and_health(client, gateway):
    s = await client.create_session("m")
    await _chat(s.base_url)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.url}/metrics") as r:
            text = await r.text()
            assert r.headers["Content-Type"].startswith("text/plain")
        async with http.get(f"{gateway.url}/health") as r:
            health = await r.json()
    assert 'rllm_gateway_llm_calls_total{status="ok"} 1.0' in text
    assert "rllm_gateway_store_traces 1.0" in text
    assert health["status"] == "ok" and health["healthy_workers"] == 1


def test_thread_variant_for_sync_callers():
    from rllm.gateway.testing import mock_upstream_in_thread

    with mock_upstream_in_thread() as m:
        gw = GatewayServer(GatewayConfig(upstreams=[m.url])).start_in_thread()
        try:
            oc = openai.OpenAI(base_url=f"{gw.url}/sessions/th/v1", api_key="x")
            r = oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "sync"}])
            assert r.choices[0].message.content == "echo: sync"
            assert gw.store.trace_count() == 1
        finally:
            gw.stop_in_thread()


async def test_concurrent_sessions_lose_and_mix_no_traces(client, mock):
    mock.latency = 0.002
    http = aiohttp.ClientSession()

    async def session(k: int) -> None:
        msgs = []
        for t in range(3):
            msgs.append({"role": "user", "content": f"s{k} t{t}"})
            async with http.post(
                f"{client.session_url(f's{k}')}/chat/completions", json={"model": "m", "messages": msgs}
            ) as r:
                assert r.status == 200
                msgs.append(
                    {"role": "assistant", "content": (await r.json())["choices"][0]["message"]["content"]}
                )

    try:
        await asyncio.gather(*(session(k) for k in range(150)))
    finally:
        await http.close()
    for k in range(150):
        traces = await client.get_traces(f"s{k}")
        assert [t.seq for t in traces] == [0, 1, 2]
        assert [t.response.content for t in traces] == [f"echo: s{k} t{t}" for t in range(3)]
        assert all(len(t.logprobs) == len(t.completion_ids) for t in traces)
