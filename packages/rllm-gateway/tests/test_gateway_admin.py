"""Admin API through GatewayClient (HTTP) and LocalGatewayClient (in process): sessions, traces,
weight version, pause/drain, upstreams, metrics. Tests taking ``admin`` run once per client."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest

from rllm.gateway import GatewayAPIError, GatewayClient, GatewayConfig, GatewayServer, LocalGatewayClient
from rllm.gateway.trace_query import TraceQuery
from rllm.testing import MockUpstream


@pytest.fixture(params=["http", "in_process"])
async def admin(request, gateway):
    """The same admin API over HTTP and as direct calls into the server."""
    if request.param == "http":
        async with GatewayClient(gateway.url) as c:
            yield c
    else:
        c = gateway.local_client()
        assert isinstance(c, LocalGatewayClient)
        yield c


async def _chat(url: str, text: str = "hi", **kw) -> str:
    oc = openai.AsyncOpenAI(base_url=url, api_key=kw.pop("api_key", "x"), max_retries=0)
    r = await oc.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], **kw)
    return r.choices[0].message.content


async def test_create_list_delete_session_frees_traces(admin, gateway):
    client = admin
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


async def test_weight_version_is_stamped_on_traces(admin):
    client = admin
    s = await client.create_session("wv")
    assert await client.get_weight_version() == 0
    await _chat(s.base_url)
    await client.set_weight_version(7)
    assert await client.get_weight_version() == 7
    await _chat(s.base_url)
    assert [t.weight_version for t in await client.get_traces("wv")] == [0, 7]


async def test_pause_drains_inflight_and_holds_new_requests(admin, gateway, held, wait_until):
    client = admin
    s = await client.create_session("p")
    first = asyncio.create_task(_chat(s.base_url, "in flight"))
    await held.arrived.wait()
    pausing = asyncio.create_task(client.pause())  # returns only after the in-flight request finished
    await wait_until(lambda: gateway.health_info()["paused"], what="the pause")
    assert not pausing.done()
    held.release.set()
    await pausing
    assert first.done()
    late = asyncio.create_task(_chat(s.base_url, "late"))
    await wait_until(lambda: gateway.waiting == 1, what="the late call to wait at the door")
    assert not late.done()  # held at the door while paused
    await client.set_weight_version(1)
    await client.resume()
    await late
    traces = await client.get_traces("p")
    assert [(t.messages[0].content, t.weight_version) for t in traces] == [("in flight", 0), ("late", 1)]


async def test_json_and_msgpack_trace_endpoints_agree(admin, gateway):
    client = admin
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
    assert [x.id for x in await client.query_traces(TraceQuery(role="default", session_id="fmt"))] == [t.id]


async def test_workers_add_remove_list_and_sticky_routing():
    async with MockUpstream(model="a") as m1, MockUpstream(model="b") as m2:  # noqa: SIM117
        async with GatewayServer(GatewayConfig(upstreams=[m1.url], health_interval_s=0)) as gw:
            async with GatewayClient(gw.url) as c:
                added = await c.add_upstream(m2.url)
                assert added["healthy"] is True
                assert {w["url"] for w in await c.list_upstreams()} == {m1.url, m2.url}
                for i in range(6):
                    await _chat(c.session_url(f"s{i}"))
                    await _chat(c.session_url(f"s{i}"))
                # Sticky: both turns of a session hit the same upstream; both upstreams got sessions.
                for i in range(6):
                    t0, t1 = await c.get_traces(f"s{i}")
                    assert t0.model == t1.model
                assert m1.stats.requests > 0 and m2.stats.by_path.get("/v1/chat/completions", 0) > 0
                await c.remove_upstream(m2.url)
                assert [w["url"] for w in await c.list_upstreams()] == [m1.url]
                with pytest.raises(GatewayAPIError) as e:
                    await c.remove_upstream(m2.url)
                assert e.value.status == 404


async def test_dead_worker_is_retried_on_another_and_503_when_none():
    async with MockUpstream(model="alive") as alive:
        dead = MockUpstream(model="dead")
        await dead.start()
        cfg = GatewayConfig(upstreams=[dead.url, alive.url], health_interval_s=0)
        async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
            gw.sessions.clear()
            await c.create_session("r")
            gw.sessions["r"].upstream = dead.url  # stuck to the upstream that is about to die
            await dead.stop()
            assert await _chat(c.session_url("r")) == "echo: hi"
            (t,) = await c.get_traces("r")
            assert t.model == "alive" and t.status == "ok"
            upstreams = {w["url"]: w for w in await c.list_upstreams()}
            assert upstreams[dead.url]["healthy"] is False and upstreams[alive.url]["healthy"] is True
            await c.remove_upstream(alive.url)
            oc = openai.AsyncOpenAI(base_url=c.session_url("r"), api_key="x", max_retries=0)
            with pytest.raises(openai.APIStatusError) as e:
                await oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            assert e.value.status_code == 503
            assert e.value.body["type"] == "service_unavailable"


async def test_health_check_restores_a_worker(mock, wait_until):
    async with GatewayServer(GatewayConfig(upstreams=[mock.url], health_interval_s=0.05)) as gw:
        gw.pool.upstreams[mock.url].healthy = False
        await wait_until(lambda: gw.pool.upstreams[mock.url].healthy, what="a probe marking it healthy")


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
    # The call's latency is in the histogram by the scrape (the gateway batches its observations).
    assert "rllm_gateway_llm_call_seconds_count 1.0" in text
    (trace,) = await client.get_traces("m")
    assert f"rllm_gateway_llm_call_seconds_sum {trace.latency_s!r}" in text
    assert "rllm_gateway_store_traces 1.0" in text
    assert health["status"] == "ok" and health["healthy_upstreams"] == 1


async def test_the_old_workers_path_names_the_new_one(gateway):
    async with aiohttp.ClientSession() as http:
        for method in ("GET", "POST", "DELETE"):
            async with http.request(method, f"{gateway.url}/admin/workers") as r:
                assert r.status == 404
                assert "renamed to /admin/upstreams" in (await r.json())["error"]["message"]


def test_thread_variant_for_sync_callers():
    from rllm.testing import mock_upstream_in_thread

    with mock_upstream_in_thread() as m:
        gw = GatewayServer(GatewayConfig(upstreams=[m.url])).start_in_thread()
        try:
            oc = openai.OpenAI(base_url=f"{gw.url}/sessions/th/v1", api_key="x")
            r = oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "sync"}])
            assert r.choices[0].message.content == "echo: sync"
            assert gw.store.trace_count() == 1
        finally:
            gw.stop_in_thread()


async def test_concurrent_sessions_lose_and_mix_no_traces(admin, mock):
    client = admin
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
        assert all(len(t.completion_logprobs) == len(t.completion_ids) for t in traces)


async def test_finish_session_returns_traces_and_deletes_the_session(admin, gateway):
    s = await admin.create_session(metadata={"task": "t"})
    await _chat(s.base_url, "one")
    await _chat(admin.session_url(s.session_id, "judge"), "two")
    traces = await admin.finish_session(s.session_id)
    assert [(t.seq, t.role, t.messages[0].content) for t in traces] == [
        (0, "default", "one"),
        (1, "judge", "two"),
    ]
    assert all(t.completion_ids and len(t.completion_logprobs) == len(t.completion_ids) for t in traces)
    assert await admin.list_sessions() == [] and gateway.store.trace_count() == 0
    with pytest.raises(GatewayAPIError) as e:
        await admin.finish_session("never-existed")
    assert e.value.status == 404 and "never-existed" in e.value.message


async def test_in_process_client_matches_http_client(gateway):
    """Both clients give the same answers for the same server state (sessions, upstreams, health)."""
    local = gateway.local_client()
    async with GatewayClient(gateway.url) as http:
        info = await local.create_session("same", metadata={"k": [1, 2]})
        assert info.base_url == http.session_url("same") == local.session_url("same")
        await _chat(info.base_url, "x")
        assert await local.list_sessions() == await http.list_sessions()
        assert await local.list_upstreams() == await http.list_upstreams()
        assert await local.health() == await http.health()
        assert [t.id for t in await local.get_traces("same")] == [t.id for t in await http.get_traces("same")]
        assert [t.id for t in await local.query_traces(TraceQuery(session_id="same"))] == [
            t.id for t in await http.query_traces(TraceQuery(session_id="same"))
        ]
        # Reads are copies: a caller mutating them does not change what the gateway holds.
        (mine,) = await local.get_traces("same")
        mine.messages.clear()
        (again,) = await http.get_traces("same")
        assert again.messages[0].content == "x"
        with pytest.raises(GatewayAPIError) as e:
            await local.set_weight_version("3")  # type: ignore[arg-type]
        assert e.value.status == 400 and "weight_version" in e.value.message
        with pytest.raises(GatewayAPIError) as e:
            await local.remove_upstream("http://127.0.0.1:1/v1")
        assert e.value.status == 404


async def test_in_process_client_refuses_another_event_loop(gateway):
    local = gateway.local_client()

    def other_thread() -> str:
        try:
            asyncio.run(local.list_sessions())
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    message = await asyncio.to_thread(other_thread)
    assert "event loop" in message and gateway.url in message


async def test_trace_of_a_call_in_flight_when_its_session_finished_is_not_kept(admin, gateway, held):
    """A flow past its deadline may still have a call in flight when the engine finishes its
    session; that call's trace has nobody to read it and must not leak into the store."""
    s = await admin.create_session("late")
    call = asyncio.create_task(_chat(s.base_url, "slow"))
    await held.arrived.wait()  # the call reached the upstream: it is in flight in the gateway
    assert await admin.finish_session("late") == []
    held.release.set()
    with pytest.raises(openai.APIStatusError) as e:  # its answer counts for nothing: say so
        await call
    assert e.value.status_code == 410 and "in flight" in str(e.value)
    await gateway.store.flush()
    assert gateway.store.trace_count() == 0 and "late" not in gateway.sessions


@pytest.mark.parametrize("end", ["finish", "delete"])
async def test_a_late_call_for_an_ended_session_is_refused_and_does_not_revive_it(admin, gateway, end):
    """With auto-created sessions on, a call arriving after its session ended used to create
    it again, and its trace stayed in the store for good. It gets a 410 now."""
    s = await admin.create_session("gone")
    await _chat(s.base_url)
    if end == "finish":
        assert len(await admin.finish_session("gone")) == 1
    else:
        assert await admin.delete_session("gone") == 1
    with pytest.raises(openai.APIStatusError) as e:
        await _chat(s.base_url, "too late")
    assert e.value.status_code == 410 and "ended" in str(e.value)
    await gateway.store.flush()
    assert "gone" not in gateway.sessions and gateway.store.trace_count() == 0
    # the admin may open the id again on purpose
    again = await admin.create_session("gone")
    assert await _chat(again.base_url) == "echo: hi"


async def test_probe_timeout_does_not_follow_a_short_interval(wait_until):
    """A 50 ms health interval used to mean a 1 s probe timeout: a server answering /models in
    1.2 s under load was marked down and every request got 503. The timeout is its own setting."""
    async with MockUpstream() as m:
        cfg = GatewayConfig(upstreams=[m.url], health_interval_s=0.05)
        assert cfg.health_timeout_s >= 2
        async with GatewayServer(cfg) as gw:
            w = gw.pool.upstreams[m.url]
            m.models_latency = 1.2
            slow_since = time.time()
            # Two probes sent after the latency was set have ended (answered 1.2 s later, or failed).
            await wait_until(
                lambda: m.stats.by_path.get("/v1/models", 0) >= 2 and w.last_check >= slow_since + 1.2,
                what="a slow probe to end",
            )
            assert w.healthy and w.last_error is None, w.last_error


async def test_only_worker_marked_unhealthy_by_a_slow_probe_still_serves(wait_until):
    """When no upstream is marked healthy the gateway still tries the one that failed longest ago,
    instead of answering 503 to everything until the next probe succeeds."""
    async with MockUpstream() as m:
        cfg = GatewayConfig(upstreams=[m.url], health_interval_s=0.05, health_timeout_s=0.05)
        async with GatewayServer(cfg) as gw:
            m.models_latency = 0.3  # every probe now times out; completions still answer at once
            w = gw.pool.upstreams[m.url]
            await wait_until(lambda: not w.healthy, what="a probe timing out")
            assert not w.healthy and "Timeout" in (w.last_error or "")
            url = f"{gw.url}/sessions/busy/v1"
            answers = [await _chat(url, f"q{i}") for i in range(10)]
            assert answers == [f"echo: q{i}" for i in range(10)]
            traces = await gw.local_client().get_traces("busy")
            assert [t.status for t in traces] == ["ok"] * 10
