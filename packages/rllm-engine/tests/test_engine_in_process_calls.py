"""Flows on the engine's loop reach its own gateway in memory (rllm.gateway.inprocess through
rllm.sdk.clients.serve_in_process), with the same traces as over loopback TCP; a streamed call,
a call the gateway refuses and the admin path are unchanged."""

from __future__ import annotations

import msgspec
import pytest

pytest.importorskip("openai")

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.gateway import GatewayConfig, GatewayServer, LocalGatewayClient
from rllm.sdk import AgentConfig, Task, rollout
from rllm.sdk import clients as sdk_clients
from rllm.sdk.clients import async_openai
from rllm.types import TerminationReason, to_msgpack

# What differs between two runs of the same calls whatever the path: ids, clocks, timings.
_VOLATILE = {"id", "session_id", "latency_s", "created_at"}


@rollout
async def two_turns_and_a_stream(task: Task, config: AgentConfig) -> dict:
    async with async_openai(config) as client:
        messages = [{"role": "user", "content": task.instruction}]
        for turn in range(2):
            reply = await client.chat.completions.create(model=config.model, messages=messages, logprobs=True)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            messages.append({"role": "user", "content": f"go on {turn} #{task.id}"})
        # A streamed call cannot be answered in memory: it goes over TCP, in the same session.
        stream = await client.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": f"stream #{task.id}"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        # A call the gateway refuses is refused the same way in memory (the same OpenAI error).
        try:
            await client.chat.completions.create(
                model=config.model, messages=[{"role": "nobody", "content": "x"}]
            )
        except Exception as exc:  # the error itself is what the test compares
            refused = f"{type(exc).__name__} {getattr(exc, 'status_code', None)}"
        else:
            refused = "accepted"
    return {"stream": text, "refused": refused}


def _fields(trace) -> dict:
    return msgspec.msgpack.decode(to_msgpack(trace))  # the wire form: token arrays as lists


async def _run(upstream, monkeypatch, in_process: bool):
    if not in_process:  # the path before: every call over loopback TCP
        monkeypatch.setattr(sdk_clients, "serve_in_process", lambda url, handler: lambda: None)
    traces: list = []
    finish = LocalGatewayClient.finish_session

    async def keep(self, session_id, *a, **k):
        records = await finish(self, session_id, *a, **k)
        traces.extend(records)
        return records

    monkeypatch.setattr(LocalGatewayClient, "finish_session", keep)
    answered: list[str] = []
    inner = GatewayServer.answer

    async def count(self, request):
        answered.append(request.path)
        return await inner(self, request)

    monkeypatch.setattr(GatewayServer, "answer", count)
    cfg = GatewayConfig(upstreams=[upstream.url], auto_create_sessions=False, health_interval_s=0)
    engine = RolloutEngine(
        two_turns_and_a_stream, None, RolloutConfig(n=2, concurrency=4, progress=False), gateway_config=cfg
    )
    async with engine:
        episodes = await engine.run([Task(id=f"t{i}", instruction=f"What is 2+2? #{i}") for i in range(3)])
    monkeypatch.undo()
    return episodes, traces, answered


async def test_in_memory_calls_record_the_same_traces_as_tcp(upstream, monkeypatch):
    tcp_episodes, tcp_traces, tcp_answered = await _run(upstream, monkeypatch, in_process=False)
    mem_episodes, mem_traces, mem_answered = await _run(upstream, monkeypatch, in_process=True)
    # In memory: each rollout's two turns and its refused call; the stream (and, without the
    # path, every call) went over TCP.
    assert tcp_answered == [] and len(mem_answered) == 3 * 6
    assert all(p.startswith("/sessions/") and p.endswith("/v1/chat/completions") for p in mem_answered)
    for episodes in (tcp_episodes, mem_episodes):
        assert len(episodes) == 6
        assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes), [
            e.error for e in episodes
        ]
    assert [ep.artifacts for ep in mem_episodes] == [ep.artifacts for ep in tcp_episodes]
    assert all(ep.artifacts["refused"] == "BadRequestError 400" for ep in mem_episodes)
    assert all(ep.artifacts["stream"] for ep in mem_episodes)

    def view(traces):
        return sorted(
            ({k: v for k, v in _fields(t).items() if k not in _VOLATILE} for t in traces),
            key=lambda t: repr(t["messages"]),
        )

    assert len(mem_traces) == len(tcp_traces) == 6 * 3  # two turns and the stream per rollout
    assert view(mem_traces) == view(tcp_traces)  # tokens, logprobs, messages, status, raw, usage
