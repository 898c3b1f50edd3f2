"""Training the tiny Qwen2-VL on the local backend: the trainer turns each sequence's images into
the same pixel inputs the sampler used, so its logprobs equal the sampler's, and updates move them."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import textwrap

import openai
import pytest
from PIL import Image, ImageDraw
from tinker_helpers import started_backend

from rllm.algos.config import AlgorithmConfig
from rllm.tiny.vlm import IMAGE_PAD, init_tiny_vlm
from rllm.types import FloatArray, TokenArray, TrainSequence
from rllm.types.images import data_uri


def _diagram(radius: int) -> str:
    img = Image.new("L", (256, 256), 255)
    ImageDraw.Draw(img).ellipse([40, 40, 40 + 2 * radius, 40 + 2 * radius], outline=0, width=3)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return data_uri(buf.getvalue(), "PNG")


@pytest.fixture(scope="module")
def vlm_backend(tmp_path_factory):
    path = init_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=2)
    backend = started_backend(path, learning_rate=1e-2, lora={"rank": 0})
    yield backend
    asyncio.run(backend.close())


def _sample(backend, url: str) -> TrainSequence:
    client = openai.OpenAI(base_url=backend.inference_urls()[0], api_key="x", max_retries=0)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "the answer"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]
    reply = client.chat.completions.create(
        model=backend.served_model_name(),
        messages=messages,
        max_tokens=4,
        logprobs=True,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    ).model_dump()
    prompt, completion = reply["prompt_token_ids"], reply["choices"][0]["token_ids"]
    logprobs = [c["logprob"] for c in reply["choices"][0]["logprobs"]["content"]]
    n, m = len(prompt), len(completion)
    return TrainSequence(
        input_ids=TokenArray(prompt + completion),
        loss_mask=FloatArray([0.0] * n + [1.0] * m),
        advantages=FloatArray([0.0] * n + [1.0] * m),
        sampler_logprobs=FloatArray([0.0] * n + logprobs),
        images=[url],
    )


def test_training_sees_what_sampling_saw_and_moves_the_policy(vlm_backend) -> None:
    tokenizer = vlm_backend.service.tokenizer
    batch = [_sample(vlm_backend, _diagram(60)), _sample(vlm_backend, _diagram(25))]
    pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert all(list(s.input_ids).count(pad) == 16 for s in batch)
    algo = AlgorithmConfig()
    first = asyncio.run(vlm_backend.train_step(batch, algo))
    assert first["sampler_logprob_abs_diff"] < 1e-4, first
    asyncio.run(vlm_backend.sync_weights())
    second = asyncio.run(vlm_backend.train_step(batch, algo))
    assert second["sampler_logprob_abs_diff"] > 1e-4  # the update changed the policy's logprobs


def test_images_that_do_not_match_the_image_tokens_are_refused(vlm_backend) -> None:
    seq = _sample(vlm_backend, _diagram(40))
    seq.images = [seq.images[0], seq.images[0]]
    with pytest.raises(ValueError, match="image tokens"):
        asyncio.run(vlm_backend.train_step([seq], AlgorithmConfig()))


def test_a_full_fine_tuning_checkpoint_is_a_loadable_vision_language_model(vlm_backend, tmp_path) -> None:
    from rllm.backends.tinker.local.vision import is_vision_model

    asyncio.run(vlm_backend.save_checkpoint(tmp_path / "ckpt"))
    assert is_vision_model(str(tmp_path / "ckpt"))


def test_a_hub_named_vision_language_model_starts_with_its_image_processor(tmp_path) -> None:
    """A hub name resolves through the Hugging Face cache, laid out here as a download leaves it
    and read offline, and the backend finds the image processor there, as it does the weights."""
    revision = "0" * 40
    repo = tmp_path / "hub" / "models--rllm-test--tiny-vlm"
    init_tiny_vlm(repo / "snapshots" / revision, seed=2)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    script = textwrap.dedent(
        """
        import asyncio
        from rllm.backends.tinker import TinkerBackend

        async def main():
            backend = TinkerBackend({"model": "rllm-test/tiny-vlm", "dtype": "float32", "torch_threads": 1})
            await backend.start()
            try:
                service = backend.service
                assert service.trainer.vision is not None and service.server.image_processor is not None
            finally:
                await backend.close()

        asyncio.run(main())
        """
    )
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
