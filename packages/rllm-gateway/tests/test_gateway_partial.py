"""Partial rollouts at the gateway (``partial_rollouts=true``), against the scripted upstream:
calls it could not continue are refused before any trace, and an upstream that cannot abort
makes a pause fail loud (the gateway keeps admitting, the call in flight keeps its one trace).
The abort-and-continue path itself runs against the real local sampler in the tinker backend's
tests (test_tinker_partial.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer
from rllm.gateway.errors import GatewayError
from rllm.testing import MockUpstream


def _config(upstream: MockUpstream) -> GatewayConfig:
    return GatewayConfig(upstreams=[upstream.url], health_interval_s=0, partial_rollouts=True)


@pytest.mark.parametrize(
    ("kwargs", "param", "reason"),
    [
        ({"max_tokens": 4, "stream": True}, "stream", "a chat stream the upstream renders itself"),
        ({"max_tokens": 4, "n": 2}, "n", "one choice per call"),
        ({}, "max_tokens", "need max_tokens on every call"),
    ],
)
async def test_calls_partial_rollouts_cannot_continue_are_refused_before_any_trace(
    kwargs: dict[str, Any], param: str, reason: str
) -> None:
    async with (
        MockUpstream() as upstream,
        GatewayServer(_config(upstream)) as gw,
        GatewayClient(gw.url) as admin,
    ):
        async with openai.AsyncOpenAI(base_url=admin.session_url("s"), api_key="x", max_retries=0) as client:
            with pytest.raises(openai.BadRequestError, match=reason) as err:
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], **kwargs
                )
            assert isinstance(err.value.body, dict) and err.value.body.get("param") == param
            ok = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert ok.choices[0].message.content
        (trace,) = await admin.get_traces("s")  # only the call that went upstream
        assert trace.status == "ok"
        assert upstream.stats.by_path.get("/v1/chat/completions") == 1


class _Held:
    """Answers once the test lets it; tells the test when a call has arrived."""

    def __init__(self) -> None:
        self.arrived, self.go = asyncio.Event(), asyncio.Event()

    async def __call__(self, body: dict[str, Any]) -> str:
        self.arrived.set()
        await self.go.wait()
        return "done"


async def test_an_upstream_that_cannot_abort_fails_the_pause_and_loses_no_call() -> None:
    held = _Held()
    async with (
        MockUpstream(responder=held) as upstream,
        GatewayServer(_config(upstream)) as gw,
        GatewayClient(gw.url) as admin,
        openai.AsyncOpenAI(base_url=admin.session_url("s"), api_key="x", max_retries=0) as client,
    ):
        call = asyncio.create_task(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        )
        await held.arrived.wait()
        with pytest.raises(
            GatewayError, match=r"cannot abort its calls in flight \(POST .*/abort answered 404"
        ):
            await gw.pause(30)
        assert gw.ledger.admitting  # a failed pause does not leave the gateway paused
        held.go.set()
        reply = await call
        (trace,) = await admin.get_traces("s")
    assert reply.choices[0].message.content == "done"
    assert trace.status == "ok" and "version_spans" not in trace.metadata
    assert gw.ledger.inflight == 0


async def test_a_completions_stream_is_relayed_whole_when_no_sync_aborts_it() -> None:
    # Partial rollouts take streams that go to /completions; with no sync meanwhile the client
    # reads what it would without them, the trace records it with its one version, and an
    # upstream that dies mid-stream ends the stream with an error event and an error trace.
    async with (
        MockUpstream() as upstream,
        GatewayServer(_config(upstream)) as gw,
        GatewayClient(gw.url) as admin,
        openai.AsyncOpenAI(base_url=admin.session_url("s"), api_key="x", max_retries=0) as client,
    ):
        stream = await client.completions.create(
            model="m",
            prompt="hi",
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
        chunks = [c async for c in stream]
        (trace,) = await admin.get_traces("s")
        upstream.fail("die_mid_stream", count=1)
        broken = await client.completions.create(model="m", prompt="hi", max_tokens=6, stream=True)
        with pytest.raises(openai.APIError, match="upstream"):
            async for _ in broken:
                pass
        traces = await admin.get_traces("s")
    assert trace.status == "ok" and "version_spans" not in trace.metadata
    assert trace.weight_version == 0
    ids = [t for c in chunks for ch in c.choices for t in (ch.model_extra or {}).get("token_ids") or ()]
    assert ids == list(trace.completion_ids or []) and ids
    assert trace.response is not None
    assert "".join(ch.text for c in chunks for ch in c.choices) == trace.response.content
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["length"]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == len(ids)
    assert usage.prompt_tokens == len(trace.prompt_ids or [])
    assert [t.status for t in traces] == ["ok", "error"]
    assert gw.ledger.inflight == 0
