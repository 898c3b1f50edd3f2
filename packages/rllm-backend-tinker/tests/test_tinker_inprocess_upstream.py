"""A gateway in the sampler's process hands it whole calls directly (``rllm.runtime.
inprocess_upstreams``), with the same answers, traces and refusals as over HTTP; a paused gateway
still drains such a call, and a stream still goes over HTTP.

Real parts: the tiny model's sampler engine and server, a gateway, the real openai client over
TCP to the gateway. Calls are greedy and one at a time, so both paths sample the same tokens.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import msgspec
import openai
import pytest
import torch

from rllm.backends.tinker import TinkerBackend
from rllm.backends.tinker.local.server import SamplerServer
from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer
from rllm.runtime import inprocess_upstreams
from rllm.types import to_msgpack

# What differs between two runs of the same calls whatever the path: ids, clocks, timings.
_VOLATILE = {"id", "session_id", "latency_s", "created_at"}


def _sampler(backend: TinkerBackend) -> SamplerServer:
    server = backend.service.server
    assert server is not None
    return server


def _count_in_process(monkeypatch: pytest.MonkeyPatch, server: SamplerServer) -> list[str]:
    """Serves the sampler in process (``sampler_in_process``) for this test, and records each
    call it answers so (the path of each)."""
    monkeypatch.setattr(inprocess_upstreams, "_SERVED", {})
    inprocess_upstreams.serve_upstream(server.url, server)
    seen: list[str] = []
    inner = server.post_whole

    async def post_whole(path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        seen.append(path)
        return await inner(path, body)

    monkeypatch.setattr(server, "post_whole", post_whole)
    return seen


def _fields(trace: Any) -> dict[str, Any]:
    data = msgspec.msgpack.decode(to_msgpack(trace))  # the wire form: token arrays as lists
    return {k: v for k, v in data.items() if k not in _VOLATILE}


def _answer(reply: Any) -> dict[str, Any]:
    data = reply.model_dump() if not isinstance(reply, dict) else dict(reply)
    return {k: v for k, v in data.items() if k not in ("id", "created")}


async def _calls(backend: TinkerBackend) -> tuple[list[Any], list[Any]]:
    """A few calls of each kind through a fresh gateway: the agent's answers and the traces."""
    cfg = GatewayConfig(upstreams=backend.inference_urls(), health_interval_s=0)
    model = backend.served_model_name()
    answers: list[Any] = []
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as admin:
        url = admin.session_url("s")
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:
            for word in ("apple", "river"):
                answers.append(
                    await client.chat.completions.create(
                        model=model,
                        messages=[{"role": "user", "content": f"say: {word}"}],
                        max_tokens=5,
                        temperature=0.0,
                        logprobs=True,
                        top_logprobs=2,
                    )
                )
            # Without logprobs: the gateway asks for them (and the token ids), then strips them.
            answers.append(
                await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "say: stone"}],
                    max_tokens=3,
                    temperature=0.0,
                )
            )
            answers.append(
                await client.completions.create(
                    model=model, prompt="say: cloud", max_tokens=4, temperature=0.0
                )
            )
        traces = await admin.get_traces("s")
    assert len(traces) == 4 and all(t.status == "ok" and t.completion_ids for t in traces)
    assert all(t.completion_logprobs for t in traces)  # captured even where the agent asked for none
    return [_answer(a) for a in answers], [_fields(t) for t in traces]


async def test_in_process_calls_answer_and_trace_as_over_http(
    sampler_backend: TinkerBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _count_in_process(monkeypatch, _sampler(sampler_backend))
    in_process = await _calls(sampler_backend)
    assert seen == ["/chat/completions"] * 3 + ["/completions"]
    with monkeypatch.context() as m:
        m.setattr(inprocess_upstreams, "_SERVED", {})  # the gateway finds no upstream in process
        over_http = await _calls(sampler_backend)
    assert len(seen) == 4  # none more: these went over HTTP
    answers, traces = in_process
    assert answers == over_http[0]
    assert traces == over_http[1]


# Bodies the gateway passes on and the sampler refuses (400), and one it answers with 404.
_REFUSED = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "no"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stop_token_ids": ["a"]}),
    ("/v1/completions", {"prompt": "x", "echo": True}),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 21}),  # k <= 20 is served
]


async def _refusals(backend: TinkerBackend) -> list[Any]:
    cfg = GatewayConfig(upstreams=backend.inference_urls(), health_interval_s=0)
    out: list[Any] = []
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as admin:
        async with httpx.AsyncClient(base_url=admin.session_url("r").removesuffix("/v1")) as http:
            for path, body in _REFUSED:
                resp = await http.post(path, json={"model": "m", **body})
                out.append((resp.status_code, resp.json()))
        out.extend(_fields(t) for t in await admin.get_traces("r"))
    return out


async def test_in_process_refusals_are_the_http_ones(
    sampler_backend: TinkerBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _count_in_process(monkeypatch, _sampler(sampler_backend))
    in_process = await _refusals(sampler_backend)
    assert len(seen) == len(_REFUSED)
    with monkeypatch.context() as m:
        m.setattr(inprocess_upstreams, "_SERVED", {})
        over_http = await _refusals(sampler_backend)
    assert [status for status, _ in in_process[: len(_REFUSED)]] == [400] * len(_REFUSED)
    assert in_process == over_http  # the same answers, and the same error traces


class _HoldAt:
    """Holds the sampler's next forward pass until the test releases it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.reached, self.release = threading.Event(), threading.Event()
        # The input embeddings run once per forward pass, transformers' or the fast decode step.
        self.handle = model.get_input_embeddings().register_forward_pre_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: Any) -> None:
        if not self.reached.is_set():
            self.reached.set()
            assert self.release.wait(60), "the test never released the held forward pass"


async def test_a_paused_gateway_drains_an_in_process_call_and_holds_the_next(
    sampler_backend: TinkerBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _count_in_process(monkeypatch, _sampler(sampler_backend))
    engine = sampler_backend.service.engine
    assert engine is not None
    cfg = GatewayConfig(upstreams=sampler_backend.inference_urls(), health_interval_s=0)
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as admin:

        async def call(word: str) -> str:
            async with openai.AsyncOpenAI(base_url=admin.session_url(word), api_key="x", max_retries=0) as c:
                reply = await c.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"say: {word}"}], max_tokens=3
                )
            return reply.choices[0].finish_reason

        hold = _HoldAt(engine.model)
        try:
            first = asyncio.create_task(call("apple"))
            assert await asyncio.to_thread(hold.reached.wait, 60)  # at the sampler, mid-call
            pause = asyncio.create_task(gw.pause(60))
            while gw.ledger.admitting:  # the pause has begun
                await asyncio.sleep(0)
            second = asyncio.create_task(call("river"))
            while gw.ledger.waiting == 0:  # the second call waits at the door
                await asyncio.sleep(0)
            assert not pause.done() and gw.ledger.inflight == 1  # the first one still runs
            hold.release.set()
            await pause  # drained: the first call was answered, not cut
            assert first.done() and await first == "length"
            assert not second.done() and seen == ["/chat/completions"]
            gw.resume()
            assert await second == "length"
        finally:
            hold.release.set()
            hold.handle.remove()
        traces = [t for s in ("apple", "river") for t in await admin.get_traces(s)]
    assert [t.status for t in traces] == ["ok", "ok"]
    assert seen == ["/chat/completions"] * 2


async def test_a_stream_still_goes_over_http(
    sampler_backend: TinkerBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _count_in_process(monkeypatch, _sampler(sampler_backend))
    cfg = GatewayConfig(upstreams=sampler_backend.inference_urls(), health_interval_s=0)
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as admin:
        async with openai.AsyncOpenAI(base_url=admin.session_url("t"), api_key="x", max_retries=0) as c:
            stream = await c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "say: apple"}], max_tokens=3, stream=True
            )
            text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
        (trace,) = await admin.get_traces("t")
    assert seen == [] and trace.status == "ok" and len(trace.completion_ids or []) == 3
    # The sampler's text leaves special tokens out (a random tiny model samples them too).
    ids = list(trace.completion_ids or [])
    assert text == _sampler(sampler_backend).engine.decode(ids, skip_special_tokens=True)


def test_sampler_in_process_registers_the_server_until_it_stops(sampler_backend: TinkerBackend) -> None:
    # The backend's default (sampler_in_process = true): its gateway in this process calls in memory.
    served = inprocess_upstreams.upstream_in_process(sampler_backend.inference_urls()[0])
    assert served is _sampler(sampler_backend)
    engine = sampler_backend.service.engine
    assert engine is not None
    plain = SamplerServer(engine, "m")
    plain.start()
    try:
        assert inprocess_upstreams.upstream_in_process(plain.url) is None  # the class's default: HTTP only
    finally:
        plain.stop()
    server = SamplerServer(engine, "m", in_process=True)
    url = server.start()
    try:
        assert inprocess_upstreams.upstream_in_process(url + "/") is server
    finally:
        server.stop()
    assert inprocess_upstreams.upstream_in_process(url) is None
