"""Cumulative mode with images: the gateway expands each image's placeholder to the tokens the
model's image processor gives it, sends the images next to the token ids, extends multi-turn
histories token for token, and refuses what it cannot place (a 400) or an upstream that ignored
the images (a 502). The upstream is a scripted loopback server that records what it was sent."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp import web
from PIL import Image

from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer
from rllm.types.images import data_uri

WORDS = ["<|pad|>", "<|unk|>", "<|user|>", "<|assistant|>", "<|end|>", "look", "at", "this", "and", "that"]
VISION = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]
TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|> ' }}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for b in m['content'] %}"
    "{% if b['type'] == 'text' %}{{ b['text'] }}{% else %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% endif %}{% endfor %}{% endif %}{{ ' <|end|> ' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
)


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> str:
    """A word-level tokenizer with Qwen-VL's vision tokens and a Qwen2-VL image processor, saved
    the way a vision-language model directory holds them (no weights: the gateway needs none)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|end|>", pad_token="<|pad|>", unk_token="<|unk|>"
    )
    tok.add_tokens(VISION, special_tokens=True)
    tok.chat_template = TEMPLATE
    out = tmp_path_factory.mktemp("vlm")
    tok.save_pretrained(out)
    # 28 px per merged patch: a 56x56 image -> 2x2 merged patches -> 4 tokens, 112x56 -> 8
    Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=28 * 28 * 64).save_pretrained(out)
    return str(out)


def _png(width: int, height: int, shade: int = 0) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (shade, 100, 200)).save(buf, format="PNG")
    return data_uri(buf.getvalue(), "PNG")


def _user(text: str, *urls: str) -> dict[str, Any]:
    blocks = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"role": "user", "content": [{"type": "text", "text": text}, *blocks]}


class ScriptedUpstream:
    """/v1/completions answering two fixed words; records each body. ``acknowledge`` decides
    whether it says it used the images (the local tinker sampler does, vLLM's server does not)."""

    def __init__(self, reply_ids: list[int], *, acknowledge: bool = True) -> None:
        self.reply_ids = reply_ids
        self.acknowledge = acknowledge
        self.bodies: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> ScriptedUpstream:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _completions(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        self.bodies.append(body)
        answer: dict[str, Any] = {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "text": "look at",
                    "token_ids": self.reply_ids,
                    "logprobs": {"token_logprobs": [-0.5] * len(self.reply_ids)},
                    "finish_reason": "length",
                }
            ],
            "prompt_token_ids": body["prompt"],
        }
        images = (body.get("multi_modal_data") or {}).get("image")
        if self.acknowledge and images:
            answer["images_used"] = len(images)
        if not body.get("stream"):
            return web.json_response(answer)
        # streamed: one chunk per token, the confirmation on the last one (as the local sampler)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        ids, used = self.reply_ids, answer.pop("images_used", None)
        for k, tid in enumerate(ids):
            last = k == len(ids) - 1
            choice = {"index": 0, "text": "look " if k == 0 else "at", "token_ids": [tid]}
            choice |= {"logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "length" if last else None}
            chunk = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [choice]}
            if k == 0:
                chunk["prompt_token_ids"] = body["prompt"]
            if last and used is not None:
                chunk["images_used"] = used
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


@contextlib.asynccontextmanager
async def _gateway(
    up: ScriptedUpstream, vlm_dir: str
) -> AsyncIterator[tuple[GatewayServer, GatewayClient, openai.AsyncOpenAI]]:
    """A cumulative-mode gateway in front of ``up``, its admin client and session ``s``'s client."""
    cfg = GatewayConfig(
        upstreams=[up.url], tokenizer_path=vlm_dir, tokenizer_mode="cumulative", health_interval_s=0
    )
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as admin:
        client = openai.AsyncOpenAI(base_url=admin.session_url("s"), api_key="x", max_retries=0)
        async with client:
            yield gw, admin, client


async def test_images_expand_to_their_tokens_and_turns_extend_token_for_token(vlm_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(vlm_dir)
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    reply = tok.encode("look at", add_special_tokens=False)
    small, wide = _png(56, 56), _png(112, 56, shade=9)
    async with ScriptedUpstream(reply) as up, _gateway(up, vlm_dir) as (_, admin, oc):
        msgs = [_user("look at this", small)]
        first = await oc.chat.completions.create(model="m", messages=msgs)
        assert first.choices[0].message.content == "look at"
        # the follow-up adds text and a second image, the first one stays in the history
        msgs += [{"role": "assistant", "content": "look at"}, _user("and that", wide)]
        await oc.chat.completions.create(model="m", messages=msgs)
        traces = await admin.get_traces("s")
    sent1, sent2 = up.bodies
    # each image's one template placeholder became its grid's merged patches, in order
    assert sent1["multi_modal_data"] == {"image": [small]}
    assert sent2["multi_modal_data"] == {"image": [small, wide]}
    assert sent1["prompt"].count(pad) == 4 and sent2["prompt"].count(pad) == 4 + 8
    assert "messages" not in sent1  # a completions call: the gateway rendered the chat itself
    # token truth: turn 2 starts with exactly turn 1's prompt and completion
    t1, t2 = traces
    assert [t.segment for t in traces] == [0, 0] and all(t.status == "ok" for t in traces)
    assert list(t2.prompt_ids[: len(t1.prompt_ids) + len(reply)]) == list(t1.prompt_ids) + reply
    assert list(t1.prompt_ids) == sent1["prompt"] and list(t2.prompt_ids) == sent2["prompt"]
    # the images stay attached by content address, the second trace holds both
    assert len(t1.images) == 1 and len(t2.images) == 2
    # the expanded prompt says what the template says, with the pads repeated
    before, between, after = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False).split(
        "<|image_pad|>"
    )
    expanded = before + "<|image_pad|>" * 4 + between + "<|image_pad|>" * 8 + after
    assert list(t2.prompt_ids) == tok.encode(expanded, add_special_tokens=False)


async def test_an_upstream_that_ignores_the_images_is_a_502_not_an_answer(vlm_dir):
    from transformers import AutoTokenizer

    reply = AutoTokenizer.from_pretrained(vlm_dir).encode("look", add_special_tokens=False)
    async with ScriptedUpstream(reply, acknowledge=False) as up, _gateway(up, vlm_dir) as (gw, admin, oc):
        msgs = [_user("look", _png(56, 56))]
        with pytest.raises(openai.APIStatusError) as e:
            await oc.chat.completions.create(model="m", messages=msgs)
        assert e.value.status_code == 502 and "images_used" in e.value.message
        # what the model said without seeing the picture is not a turn to extend
        assert gw.sessions["s"].bridges == {}
        traces = await admin.get_traces("s")
    assert [t.status for t in traces] == ["error"]
    assert "did not confirm it used" in traces[0].metadata["error"]


async def test_a_streamed_call_with_images_is_relayed_once_the_upstream_confirms_them(vlm_dir):
    from transformers import AutoTokenizer

    reply = AutoTokenizer.from_pretrained(vlm_dir).encode("look at", add_special_tokens=False)
    image = _png(56, 56)
    async with ScriptedUpstream(reply) as up, _gateway(up, vlm_dir) as (_, admin, oc):
        stream = await oc.chat.completions.create(model="m", messages=[_user("look", image)], stream=True)
        text = "".join([c.delta.content or "" async for chunk in stream for c in chunk.choices])
        (trace,) = await admin.get_traces("s")
    (sent,) = up.bodies
    assert sent["stream"] is True and sent["multi_modal_data"] == {"image": [image]}
    assert text == "look at" and trace.status == "ok"
    assert list(trace.prompt_ids) == sent["prompt"] and list(trace.completion_ids) == reply
    assert len(trace.images) == 1


async def test_a_streamed_call_whose_images_were_ignored_is_a_502_before_any_reply(vlm_dir):
    from transformers import AutoTokenizer

    reply = AutoTokenizer.from_pretrained(vlm_dir).encode("look", add_special_tokens=False)
    async with ScriptedUpstream(reply, acknowledge=False) as up, _gateway(up, vlm_dir) as (gw, admin, oc):
        with pytest.raises(openai.APIStatusError) as e:
            await oc.chat.completions.create(model="m", messages=[_user("look", _png(56, 56))], stream=True)
        assert e.value.status_code == 502 and "images_used" in e.value.message
        assert gw.sessions["s"].bridges == {}
        traces = await admin.get_traces("s")
    assert [t.status for t in traces] == ["error"]
    assert "did not confirm it used" in traces[0].metadata["error"]


@pytest.mark.parametrize(
    ("message", "extra", "param", "needle"),
    [
        (_user("look", "https://example.com/a.png"), {}, "messages[0].content[1].image_url", "data: URIs"),
        (
            {"role": "user", "content": [{"type": "text", "text": "<|image_pad|>"}]},
            {},
            "messages",
            "1 image placeholders for 0 images",
        ),
    ],
)
async def test_what_cannot_be_placed_is_a_400_and_nothing_goes_upstream(
    vlm_dir, message, extra, param, needle
):
    async with ScriptedUpstream([5]) as up, _gateway(up, vlm_dir) as (_, admin, oc):
        with pytest.raises(openai.BadRequestError) as e:
            await oc.chat.completions.create(model="m", messages=[message], **extra)
        assert await admin.get_traces("s") == []
    assert e.value.body["param"] == param and needle in e.value.body["message"]
    assert e.value.body["code"] == "unsupported_content"
    assert up.bodies == []
