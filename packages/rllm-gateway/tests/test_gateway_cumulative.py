"""Token truth: cumulative mode keeps turn k+1's prompt an exact extension of turn k's tokens."""

from __future__ import annotations

import os

import openai
import pytest
from transformers import AutoTokenizer

from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer
from rllm.testing import MockUpstream, build_tiny_chat_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return build_tiny_chat_tokenizer(str(tmp_path_factory.mktemp("tok")))


async def _conversation(tokenizer_dir: str, mode: str, *, turns: int = 10, stream: bool = False):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    async with MockUpstream(tokenizer=tok) as mock:
        cfg = GatewayConfig(
            upstreams=[mock.url], tokenizer_path=tokenizer_dir, tokenizer_mode=mode, health_interval_s=0
        )
        async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
            oc = openai.AsyncOpenAI(base_url=c.session_url("conv"), api_key="x")
            msgs = [
                {"role": "system", "content": "you are an agent"},
                {"role": "user", "content": "hello world"},
            ]
            for i in range(turns):
                if stream:
                    parts = []
                    async for ch in await oc.chat.completions.create(model="m", messages=msgs, stream=True):
                        parts.extend(c.delta.content or "" for c in ch.choices)
                    reply = "".join(parts)
                else:
                    r = await oc.chat.completions.create(model="m", messages=msgs)
                    reply = r.choices[0].message.content
                msgs += [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": f"the answer is {i}"},
                ]
            return await c.get_traces("conv"), tok, msgs


def _drift(traces) -> list[int]:
    """Turns whose prompt does not start with the previous turn's prompt + completion tokens."""
    bad = []
    for k in range(1, len(traces)):
        prefix = list(traces[k - 1].prompt_ids) + list(traces[k - 1].completion_ids)
        if list(traces[k].prompt_ids[: len(prefix)]) != prefix:
            bad.append(k)
    return bad


async def test_plain_mode_shows_drift(tokenizer_dir):
    traces, _, _ = await _conversation(tokenizer_dir, "plain")
    assert len(traces) == 10
    assert _drift(traces) == list(range(1, 10))  # every re-tokenized turn lost the sampled tokens


@pytest.mark.parametrize("stream", [False, True])
async def test_cumulative_mode_has_zero_drift(tokenizer_dir, stream):
    traces, tok, msgs = await _conversation(tokenizer_dir, "cumulative", stream=stream)
    assert len(traces) == 10 and all(t.status == "ok" for t in traces)
    assert _drift(traces) == []
    assert {t.segment for t in traces} == {0}
    for t in traces:
        assert len(t.completion_logprobs) == len(t.completion_ids)
    # The bridged prompt still says exactly what the chat template says (same text, exact tokens).
    last = traces[-1]
    expected = tok.apply_chat_template(msgs[:-2], add_generation_prompt=True, tokenize=False)
    assert tok.decode(last.prompt_ids, skip_special_tokens=False) == expected
    assert last.response.content == msgs[-2]["content"]


async def test_history_that_does_not_extend_starts_a_new_segment(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    async with MockUpstream(tokenizer=tok) as mock:
        cfg = GatewayConfig(
            upstreams=[mock.url],
            tokenizer_path=tokenizer_dir,
            tokenizer_mode="cumulative",
            health_interval_s=0,
        )
        async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
            oc = openai.AsyncOpenAI(base_url=c.session_url("seg"), api_key="x")
            msgs = [{"role": "user", "content": "hello"}]
            r = await oc.chat.completions.create(model="m", messages=msgs)
            msgs += [
                {"role": "assistant", "content": r.choices[0].message.content},
                {"role": "user", "content": "more"},
            ]
            await oc.chat.completions.create(model="m", messages=msgs)
            # The agent rewrites its last reply (e.g. strips thinking): tokens cannot be bridged.
            edited = [*msgs, {"role": "assistant", "content": "edited"}, {"role": "user", "content": "again"}]
            r3 = await oc.chat.completions.create(model="m", messages=edited, logprobs=True)
            assert r3.choices[0].logprobs.content  # asked for, so returned (chat shape)
            t1, t2, t3 = await c.get_traces("seg")
    assert (t1.segment, t2.segment, t3.segment) == (0, 0, 1)
    assert "reply was changed" in t3.metadata["segment_reason"]
    assert list(t3.prompt_ids) == tok.encode(
        tok.apply_chat_template(edited, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )


async def test_a_cumulative_stream_carries_the_usage_chunk_the_client_asked_for(tokenizer_dir):
    """OpenAI semantics: with ``stream_options.include_usage`` the last chunk before [DONE] has
    empty choices and the whole call's usage (exact counts); without it, no chunk has a usage."""
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    async with MockUpstream(tokenizer=tok) as mock:
        cfg = GatewayConfig(
            upstreams=[mock.url],
            tokenizer_path=tokenizer_dir,
            tokenizer_mode="cumulative",
            health_interval_s=0,
        )
        async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
            oc = openai.AsyncOpenAI(base_url=c.session_url("usage"), api_key="x", max_retries=0)
            msgs = [{"role": "user", "content": "hello world"}]
            streamed = []
            for opts in ({"include_usage": True}, None):
                extra = {} if opts is None else {"stream_options": opts}
                stream = await oc.chat.completions.create(model="m", messages=msgs, stream=True, **extra)
                streamed.append([chunk async for chunk in stream])
            asked, unasked = streamed
            traces = await c.get_traces("usage")
    assert len(traces) == 2 and all(t.status == "ok" for t in traces)
    last = asked[-1]
    assert last.choices == [] and last.usage is not None
    prompt, completion = len(traces[0].prompt_ids), len(traces[0].completion_ids)
    assert completion > 0
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (prompt, completion)
    assert last.usage.total_tokens == prompt + completion
    assert [c.usage for c in asked[:-1]] == [None] * (len(asked) - 1)
    assert [c.usage for c in unasked] == [None] * len(unasked)


VLLM_URL = os.environ.get("RLLM_TEST_VLLM_URL")
VLLM_MODEL_DIR = os.environ.get("RLLM_TEST_VLLM_MODEL_DIR")


@pytest.mark.vllm
@pytest.mark.skipif(
    not (VLLM_URL and VLLM_MODEL_DIR), reason="needs RLLM_TEST_VLLM_URL and RLLM_TEST_VLLM_MODEL_DIR"
)
async def test_cumulative_mode_against_real_vllm():
    cfg = GatewayConfig(
        upstreams=[VLLM_URL], tokenizer_path=VLLM_MODEL_DIR, tokenizer_mode="cumulative", health_interval_s=0
    )
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
        oc = openai.AsyncOpenAI(base_url=c.session_url("v"), api_key="x")
        msgs = [{"role": "user", "content": "hello world"}]
        for i in range(5):
            r = await oc.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0)
            msgs += [
                {"role": "assistant", "content": r.choices[0].message.content},
                {"role": "user", "content": f"turn {i}"},
            ]
        traces = await c.get_traces("v")
    assert len(traces) == 5 and all(t.status == "ok" for t in traces)
    for k in range(1, 5):
        prev, cur = traces[k - 1], traces[k]
        prefix = list(prev.prompt_ids) + list(prev.completion_ids)
        if cur.segment == prev.segment:  # bridged: exact token extension
            assert list(cur.prompt_ids[: len(prefix)]) == prefix
        else:  # a random-weight model can emit text that does not round-trip; then it says why
            assert cur.metadata["segment_reason"]


async def test_cumulative_mode_refuses_image_blocks_with_a_400(tokenizer_dir):
    """Rendering text-only would drop the picture silently; the call is refused, naming the block."""
    import io

    from PIL import Image

    from rllm.types.images import data_uri

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), "white").save(buf, format="PNG")
    url = data_uri(buf.getvalue(), "PNG")
    async with MockUpstream() as mock:
        cfg = GatewayConfig(
            upstreams=[mock.url],
            tokenizer_path=tokenizer_dir,
            tokenizer_mode="cumulative",
            health_interval_s=0,
        )
        async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
            oc = openai.AsyncOpenAI(base_url=c.session_url("img"), api_key="x", max_retries=0)
            msgs = [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi"},
                        {"type": "image_url", "image_url": {"url": url}},
                    ],
                }
            ]
            with pytest.raises(openai.BadRequestError) as e:
                await oc.chat.completions.create(model="m", messages=msgs)
            assert e.value.body["code"] == "unsupported_content"
            assert e.value.body["param"] == "messages[0].content[1]"
            assert not {p for p in mock.stats.by_path if "completions" in p}  # nothing went upstream
            traces = await c.get_traces("img")
            assert traces == []  # refused like an unparsable tool format: a 400, no trace
