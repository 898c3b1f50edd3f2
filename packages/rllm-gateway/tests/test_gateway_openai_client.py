"""The real openai client (sync, async, streaming, tool calls) through the gateway.

Runs against MockUpstream, or against a real vLLM server when RLLM_TEST_VLLM_URL is set.
"""

from __future__ import annotations

import asyncio
import os

import openai
import pytest

from rllm.testing import MockReply

VLLM_URL = os.environ.get("RLLM_TEST_VLLM_URL")

mock_only = pytest.mark.skipif(VLLM_URL is not None, reason="scripted replies need the mock upstream")


def _check_trace_tokens(t):
    assert t.prompt_ids is not None and len(t.prompt_ids) > 0
    assert t.completion_ids is not None and len(t.completion_ids) > 0
    assert t.completion_logprobs is not None and len(t.completion_logprobs) == len(t.completion_ids)
    assert all(lp <= 0.0 for lp in t.completion_logprobs)


async def test_async_chat_is_captured_and_response_is_plain_openai(client, model_name):
    s = await client.create_session("sess-a")
    oc = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.token)
    r = await oc.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8
    )
    assert r.choices[0].logprobs is None  # injected logprobs are stripped
    assert "token_ids" not in (r.choices[0].model_extra or {})
    assert "prompt_token_ids" not in (r.model_extra or {})
    traces = await client.get_traces("sess-a")
    assert [t.seq for t in traces] == [0]
    t = traces[0]
    assert t.session_id == "sess-a" and t.role == "default" and t.status == "ok"
    assert t.messages[0].content == "Say hi"
    assert t.response.content == r.choices[0].message.content
    _check_trace_tokens(t)
    assert t.usage.completion_tokens == len(t.completion_ids)
    assert t.latency_s > 0


async def test_client_that_asks_for_logprobs_keeps_them(client, model_name, mock):
    s = await client.create_session("sess-lp")
    oc = openai.AsyncOpenAI(base_url=s.base_url, api_key="x")
    r = await oc.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "x"}],
        logprobs=True,
        max_tokens=5,
        extra_body={"return_token_ids": True},
    )
    lps = [c.logprob for c in r.choices[0].logprobs.content]
    (t,) = await client.get_traces("sess-lp")
    assert lps == pytest.approx(list(t.completion_logprobs), abs=1e-6)
    assert r.choices[0].model_extra["token_ids"] == list(t.completion_ids)
    assert r.model_extra["prompt_token_ids"] == list(t.prompt_ids)


async def test_sync_openai_client_through_gateway(gateway, model_name):
    def agent() -> list[str]:
        oc = openai.OpenAI(base_url=f"{gateway.url}/sessions/sync-1/v1", api_key="x")
        msgs = [{"role": "user", "content": "turn 0"}]
        out = []
        for i in range(3):
            r = oc.chat.completions.create(model=model_name, messages=msgs, max_tokens=8)
            out.append(r.choices[0].message.content)
            msgs += [{"role": "assistant", "content": out[-1]}, {"role": "user", "content": f"turn {i + 1}"}]
        return out

    replies = await asyncio.to_thread(agent)
    records = await gateway.store.get("sync-1")
    assert [r.seq for r in records] == [0, 1, 2]
    assert [r.response.content for r in records] == replies
    assert len(records[2].messages) == 5


async def test_streaming_is_forwarded_and_assembled(client, model_name):
    s = await client.create_session("sess-stream")
    oc = openai.AsyncOpenAI(base_url=s.base_url, api_key="x")
    stream = await oc.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "stream please"}], stream=True, max_tokens=16
    )
    text = ""
    async for chunk in stream:
        for c in chunk.choices:
            assert c.logprobs is None
            assert "token_ids" not in (c.model_extra or {})
            text += c.delta.content or ""
    (t,) = await client.get_traces("sess-stream")
    assert t.status == "ok"
    assert t.response.content == text
    _check_trace_tokens(t)


async def test_completions_endpoint_with_text_and_token_prompts(client, model_name):
    s = await client.create_session("sess-cmpl")
    oc = openai.AsyncOpenAI(base_url=s.base_url, api_key="x")
    r1 = await oc.completions.create(model=model_name, prompt="Once upon", max_tokens=6)
    r2 = await oc.completions.create(model=model_name, prompt=[1, 2, 3, 4], max_tokens=6)
    assert r1.choices[0].logprobs is None and r2.choices[0].logprobs is None
    t1, t2 = await client.get_traces("sess-cmpl")
    _check_trace_tokens(t1)
    assert list(t2.prompt_ids) == [1, 2, 3, 4]
    assert t1.response.content == r1.choices[0].text


@mock_only
async def test_tool_calls_round_trip(client, mock):
    def responder(req):
        if req["messages"][-1]["role"] == "tool":
            return "the answer is 4"
        return MockReply(tool_calls=[("add", {"a": 2, "b": 2})])

    mock.responder = responder
    s = await client.create_session("sess-tools")
    oc = openai.AsyncOpenAI(base_url=s.base_url, api_key="x")
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "2+2?"}]
    r = await oc.chat.completions.create(model="m", messages=msgs, tools=tools)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "add" and r.choices[0].finish_reason == "tool_calls"
    msgs += [
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "4"},
    ]
    r2 = await oc.chat.completions.create(model="m", messages=msgs, tools=tools)
    assert r2.choices[0].message.content == "the answer is 4"
    t1, t2 = await client.get_traces("sess-tools")
    assert t1.response.tool_calls[0].function.name == "add"
    assert t1.response.tool_calls[0].id == call.id
    assert t1.metadata["tools"][0]["function"]["name"] == "add"
    assert t2.messages[-1].role == "tool" and t2.messages[1].tool_calls[0].id == call.id


@mock_only
async def test_streamed_tool_calls_are_assembled(client, mock):
    mock.responder = lambda req: MockReply(text="calling", tool_calls=[("search", '{"q": "rl"}')])
    oc = openai.AsyncOpenAI(base_url=client.session_url("sess-st"), api_key="x")
    stream = await oc.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "go"}],
        stream=True,
        tools=[{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}],
    )
    names = [tc.function.name async for ch in stream for c in ch.choices for tc in (c.delta.tool_calls or [])]
    assert names == ["search"]
    (t,) = await client.get_traces("sess-st")
    assert t.response.tool_calls[0].function.arguments == '{"q": "rl"}'
    assert t.finish_reason == "tool_calls"


async def test_roles_become_separate_trajectories(client, model_name):
    s = await client.create_session("multi")
    solver = openai.AsyncOpenAI(base_url=client.session_url("multi", role="solver"), api_key=s.token)
    judge = openai.AsyncOpenAI(base_url=client.session_url("multi", role="judge"), api_key=s.token)
    await solver.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "solve"}], max_tokens=4
    )
    await judge.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "judge"}], max_tokens=4
    )
    await solver.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "again"}], max_tokens=4
    )
    traces = await client.get_traces("multi")
    assert [(t.seq, t.role) for t in traces] == [(0, "solver"), (1, "judge"), (2, "solver")]
    assert [t.seq for t in await client.get_traces("multi", role="solver")] == [0, 2]


async def test_plain_v1_route_with_session_header(gateway, client, model_name):
    oc = openai.AsyncOpenAI(
        base_url=f"{gateway.url}/v1", api_key="x", default_headers={"X-RLLM-Session": "hdr"}
    )
    await oc.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "h"}], max_tokens=4
    )
    assert len(await client.get_traces("hdr")) == 1
    models = await oc.models.list()
    assert models.data[0].id == model_name
    no_header = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="X-RLLM-Session"):
        await no_header.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "h"}])


@mock_only
async def test_session_sampling_overrides_client(client, mock):
    from rllm.types import SamplingParams

    s = await client.create_session("samp", sampling=SamplingParams(temperature=0.3, max_tokens=3, seed=7))
    oc = openai.AsyncOpenAI(base_url=s.base_url, api_key="x")
    r = await oc.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "long reply please"}],
        temperature=1.5,
        max_tokens=100,
    )
    sent = mock.stats.last_request
    assert sent["temperature"] == 0.3 and sent["max_tokens"] == 3 and sent["seed"] == 7
    assert r.choices[0].finish_reason == "length"
    (t,) = await client.get_traces("samp")
    assert len(t.completion_ids) == 3 and t.finish_reason == "length"


@mock_only
async def test_session_seed_gives_each_call_its_own_seed(client, mock):
    """Call k of a seeded session is sent seed + k: a seeded sampler must not repeat the same
    sample for every call of a session (V1's N candidates, a retried turn)."""
    from rllm.types import SamplingParams

    s = await client.create_session("seeded", sampling=SamplingParams(seed=7))
    oc = openai.AsyncOpenAI(base_url=s.base_url, api_key="x")
    sent = []
    for _ in range(3):
        await oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], seed=1)
        sent.append(mock.stats.last_request["seed"])
    assert sent == [7, 8, 9]
