"""The local sampler with the tiny Qwen2-VL: data-URI image blocks in chat requests, batched with
text-only prompts and KV-cached decoding, logprobs equal to a teacher-forced pass with the same
pixel inputs, and capture of the image placeholder tokens through the gateway."""

from __future__ import annotations

import asyncio
import io

import openai
import pytest
import torch
from PIL import Image, ImageDraw
from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration

from rllm.backends.tinker.local.generation import GenerationRequest, SamplerEngine
from rllm.backends.tinker.local.server import SamplerServer
from rllm.backends.tinker.vlm_prompt import render_vlm_prompt
from rllm.tiny.vlm import IMAGE_PAD, init_tiny_vlm, load_image_processor
from rllm.types.images import data_uri


def _diagram(radius: int) -> bytes:
    img = Image.new("L", (256, 256), 255)
    ImageDraw.Draw(img).ellipse([40, 40, 40 + 2 * radius, 40 + 2 * radius], outline=0, width=3)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _messages(text: str, *images: bytes) -> list[dict]:
    blocks = [{"type": "image_url", "image_url": {"url": data_uri(b, "PNG")}} for b in images]
    return [{"role": "user", "content": [{"type": "text", "text": text}, *blocks]}]


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    path = init_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=1)
    model = Qwen2VLForConditionalGeneration.from_pretrained(path).eval()
    return model, AutoTokenizer.from_pretrained(path), load_image_processor(path)


def _forced(model, vision, completion: list[int]) -> torch.Tensor:
    """Training's view: one forward over prompt + completion with the same pixel inputs."""
    ids = torch.tensor([vision.input_ids + completion])
    kwargs = {}
    if vision.pixel_values is not None:
        kwargs = {
            "pixel_values": vision.pixel_values,
            "image_grid_thw": vision.image_grid_thw,
            "mm_token_type_ids": torch.tensor([vision.mm_token_type_ids + [0] * len(completion)]),
        }
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs).logits
    n = len(vision.input_ids)
    logp = torch.log_softmax(logits[0, n - 1 : -1].float(), -1)
    return logp.gather(-1, torch.tensor(completion)[:, None])[:, 0]


def test_mixed_batch_of_image_and_text_prompts_matches_teacher_forcing(vlm) -> None:
    model, tokenizer, processor = vlm
    prompts = [
        render_vlm_prompt(tokenizer, processor, _messages("the answer", _diagram(60))),
        render_vlm_prompt(tokenizer, processor, _messages("the word", _diagram(20), _diagram(40))),
        render_vlm_prompt(tokenizer, processor, [{"role": "user", "content": "say the word"}]),
    ]
    engine = SamplerEngine(model, tokenizer, torch.device("cpu"), max_batch=16, batch_window_s=0)
    # Queued before the worker starts, so all of them form one batch (3 prompts, 5 rows).
    futures = [
        engine.submit(
            GenerationRequest(
                prompt_ids=v.input_ids, max_tokens=5, n=2 if k < 2 else 1, seed=k, ignore_eos=True, vision=v
            )
        )
        for k, v in enumerate(prompts)
    ]
    engine.start()
    try:
        results = [f.result(timeout=300) for f in futures]
    finally:
        engine.stop()
    assert engine.batches_run == 1 and engine.max_batch_seen == 5
    for vision, seqs in zip(prompts, results, strict=True):
        for seq in seqs:
            assert len(seq.completion_ids) == 5
            forced = _forced(model, vision, seq.completion_ids)
            assert torch.allclose(torch.tensor(seq.completion_logprobs), forced, atol=2e-4), (
                seq.completion_logprobs,
                forced,
            )


async def test_chat_with_image_blocks_over_http_and_through_the_gateway(vlm) -> None:
    from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer

    model, tokenizer, processor = vlm
    engine = SamplerEngine(model, tokenizer, torch.device("cpu"), max_batch=8)
    engine.start()
    server = SamplerServer(engine, "tiny-vlm", image_processor=processor)
    url = server.start()
    try:
        messages = _messages("the answer", _diagram(50))
        expected = render_vlm_prompt(tokenizer, processor, messages).input_ids
        cfg = GatewayConfig(upstreams=[url], health_interval_s=0)
        async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as admin:
            s = await admin.create_session()
            async with openai.AsyncOpenAI(
                base_url=s.base_url, api_key=s.token or "x", max_retries=0
            ) as client:
                await client.chat.completions.create(model="tiny-vlm", messages=messages, max_tokens=4)
                with pytest.raises(openai.BadRequestError) as e:
                    await client.chat.completions.create(
                        model="tiny-vlm", messages=_messages("x", b"\x89PNG\r\n\x1a\nbroken"), max_tokens=4
                    )
            (trace,) = await admin.get_traces(s.session_id)
        # a corrupt image is refused at the gateway already, naming the block
        assert e.value.body["param"] == "messages[0].content[1].image_url"
        # plain mode: the placeholder tokens the model saw come from the sampler itself
        assert list(trace.prompt_ids) == expected
        pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        assert list(trace.prompt_ids).count(pad) == 16 and len(trace.images) == 1
        # the sampler names the block too when it is reached directly
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as direct:
            bad = _messages("x")
            bad[0]["content"].append({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}})
            with pytest.raises(openai.BadRequestError) as e2:
                await direct.chat.completions.create(model="tiny-vlm", messages=bad, max_tokens=2)
        assert e2.value.body["param"] == "messages[0].content[1].image_url"
    finally:
        await asyncio.to_thread(server.stop)
        engine.stop()
