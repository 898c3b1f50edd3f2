"""The tiny Qwen2-VL behind a cumulative-mode gateway: the gateway renders image placeholders with
the model's processor and sends the images with the token ids (``multi_modal_data``), the local
sampler takes them, and a two-turn conversation (an image, then a text follow-up) trains as one
sequence whose tokens and pixel inputs are exactly those sampling used."""

from __future__ import annotations

import asyncio
import io

import openai
import pytest
import torch
from PIL import Image, ImageDraw
from tinker_helpers import start_backend

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker.vlm_prompt import render_vlm_prompt, token_prompt_vlm_inputs
from rllm.engine.rollout.episode_builder import trajectories_from_traces
from rllm.engine.training.sequences import sequences_from_trajectory
from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer
from rllm.tiny.vlm import IMAGE_PAD, init_tiny_vlm
from rllm.types.images import data_uri, parse_data_uri


def _diagram(radius: int) -> str:
    img = Image.new("L", (256, 256), 255)
    ImageDraw.Draw(img).ellipse([40, 40, 40 + 2 * radius, 40 + 2 * radius], outline=0, width=3)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return data_uri(buf.getvalue(), "PNG")


def _user(text: str, *urls: str) -> dict:
    blocks = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"role": "user", "content": [{"type": "text", "text": text}, *blocks]}


@pytest.fixture(scope="module")
def vlm_backend(tmp_path_factory):
    path = init_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=4)
    backend = asyncio.run(start_backend(path, learning_rate=1e-2, lora={"rank": 0}))
    yield backend, str(path)
    asyncio.run(backend.close())


async def _two_turns(backend, model_dir: str, url: str, seeds: range) -> list[list]:
    """One two-turn conversation per seed (an image first, then text), through a cumulative-mode
    gateway; the traces of each."""
    cfg = GatewayConfig(
        upstreams=backend.inference_urls(),
        tokenizer_path=model_dir,
        tokenizer_mode="cumulative",
        health_interval_s=0,
    )
    out = []
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as admin:
        for seed in seeds:
            sid = f"conv-{seed}"
            async with openai.AsyncOpenAI(
                base_url=admin.session_url(sid), api_key="x", max_retries=0
            ) as client:
                msgs = [_user("the answer", url)]
                for follow_up in ("say it again", None):
                    reply = await client.chat.completions.create(
                        model=backend.served_model_name(),
                        messages=msgs,
                        max_tokens=4,
                        seed=seed,
                        extra_body={"ignore_eos": True},
                    )
                    if follow_up:
                        msgs += [
                            {"role": "assistant", "content": reply.choices[0].message.content},
                            {"role": "user", "content": follow_up},
                        ]
            out.append(await admin.get_traces(sid))
    return out


def test_a_token_prompt_with_its_images_is_what_the_chat_route_renders(vlm_backend) -> None:
    backend, _ = vlm_backend
    url = _diagram(45)
    tokenizer, processor = backend.service.tokenizer, backend.service.server.image_processor
    rendered = render_vlm_prompt(tokenizer, processor, [_user("the answer", url)])
    base = backend.inference_urls()[0]
    with openai.OpenAI(base_url=base, api_key="x", max_retries=0) as client:
        kwargs = {"max_tokens": 3, "seed": 7, "logprobs": 0}
        completion = client.completions.create(
            model=backend.served_model_name(),
            prompt=rendered.input_ids,
            extra_body={"multi_modal_data": {"image": [url]}, "return_token_ids": True},
            **kwargs,
        ).model_dump()
        chat = client.chat.completions.create(
            model=backend.served_model_name(),
            messages=[_user("the answer", url)],
            max_tokens=3,
            seed=7,
            extra_body={"return_token_ids": True},
        ).model_dump()
        assert completion["images_used"] == 1
        assert completion["choices"][0]["token_ids"] == chat["choices"][0]["token_ids"]
        assert chat["prompt_token_ids"] == rendered.input_ids

        def refused(prompt: object, data: object) -> dict:
            with pytest.raises(openai.BadRequestError) as e:
                client.completions.create(
                    model=backend.served_model_name(),
                    prompt=prompt,
                    max_tokens=2,
                    extra_body={"multi_modal_data": data},
                )
            return e.value.body

        pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        short = [t for k, t in enumerate(rendered.input_ids) if t != pad or k % 2]  # half the pads
        assert "placeholder runs" in refused(short, {"image": [url]})["message"]
        assert refused(rendered.input_ids, {"image": [url, url]})["param"] == "prompt"
        assert refused("the answer", {"image": [url]})["param"] == "prompt"
        assert refused(rendered.input_ids, {"video": [url]})["param"] == "multi_modal_data"
        body = refused(rendered.input_ids, {"image": ["data:image/png;base64,@@"]})
        assert body["param"] == "multi_modal_data.image[0]"
        assert refused(rendered.input_ids, {"image": []})["param"] == "prompt"  # pads, no images
        text_only = client.completions.create(
            model=backend.served_model_name(),
            prompt=tokenizer.encode("the answer", add_special_tokens=False),
            max_tokens=2,
            extra_body={"multi_modal_data": {"image": []}},
        ).model_dump()
        assert text_only["images_used"] == 0 and len(text_only["choices"]) == 1


async def test_a_streamed_call_with_an_image_is_captured_through_the_gateway(vlm_backend) -> None:
    backend, model_dir = vlm_backend
    url, model = _diagram(35), backend.served_model_name()
    kwargs = {"max_tokens": 3, "seed": 11}
    async with openai.AsyncOpenAI(base_url=backend.inference_urls()[0], api_key="x", max_retries=0) as direct:
        whole = await direct.chat.completions.create(
            model=model, messages=[_user("the answer", url)], extra_body={"return_token_ids": True}, **kwargs
        )
    cfg = GatewayConfig(
        upstreams=backend.inference_urls(),
        tokenizer_path=model_dir,
        tokenizer_mode="cumulative",
        health_interval_s=0,
    )
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as admin:
        async with openai.AsyncOpenAI(base_url=admin.session_url("s"), api_key="x", max_retries=0) as client:
            stream = await client.chat.completions.create(
                model=model, messages=[_user("the answer", url)], stream=True, **kwargs
            )
            text = "".join([c.delta.content or "" async for chunk in stream for c in chunk.choices])
        (trace,) = await admin.get_traces("s")
    body = whole.model_dump()
    assert trace.status == "ok" and text == body["choices"][0]["message"]["content"]
    assert list(trace.prompt_ids) == body["prompt_token_ids"]
    assert list(trace.completion_ids) == body["choices"][0]["token_ids"]
    assert len(trace.images) == 1


def test_two_turns_with_an_image_extend_and_train_on_exactly_what_was_sampled(vlm_backend) -> None:
    backend, model_dir = vlm_backend
    url = _diagram(60)
    conversations = asyncio.run(_two_turns(backend, model_dir, url, range(8)))
    bridged = []
    for first, second in conversations:
        assert first.status == second.status == "ok"
        if second.segment == 0:
            bridged.append((first, second))
        else:  # a random model may sample a token whose text does not round-trip: it says so
            assert second.metadata["segment_reason"]
    assert bridged, "no conversation's first reply round-tripped through its text"
    first, second = bridged[0]
    pad = backend.service.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    prefix = list(first.prompt_ids) + list(first.completion_ids)
    assert list(second.prompt_ids[: len(prefix)]) == prefix  # token for token, image tokens too
    assert list(first.prompt_ids).count(pad) == list(second.prompt_ids).count(pad) == 16
    assert list(first.images) == list(second.images)  # one image, kept by content address

    trajectory = trajectories_from_traces([first, second])["default"]
    for step in trajectory.steps:
        step.advantage = 1.0
    (seq,) = sequences_from_trajectory(trajectory)  # the second turn extends the first: one sequence
    assert list(seq.input_ids) == list(second.prompt_ids) + list(second.completion_ids)
    assert seq.images == [url]
    mask = list(seq.loss_mask)
    sampled = [k for k, m in enumerate(mask) if m]
    n1, n2 = len(first.prompt_ids), len(second.prompt_ids)
    assert sampled == [*range(n1, n1 + 4), *range(n2, n2 + 4)]
    # the trainer's pixels are the sampler's: the same bytes through the same processor
    service = backend.service
    trained = service.trainer.vision.model_inputs(
        [seq], len(seq.input_ids), torch.device("cpu"), torch.float32
    )
    sampled_inputs = token_prompt_vlm_inputs(
        service.tokenizer, service.server.image_processor, list(first.prompt_ids), [parse_data_uri(url)[1]]
    )
    assert torch.equal(trained["pixel_values"], sampled_inputs.pixel_values.float())
    assert torch.equal(trained["image_grid_thw"], sampled_inputs.image_grid_thw)

    algo = AlgorithmConfig()
    before = asyncio.run(backend.train_step([seq], algo))
    assert before["sampler_logprob_abs_diff"] < 1e-4, before
    asyncio.run(backend.sync_weights())
    after = asyncio.run(backend.train_step([seq], algo))
    assert after["sampler_logprob_abs_diff"] > 1e-4, after  # the step moved the policy
