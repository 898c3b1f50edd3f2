"""The locally built tiny Qwen2-VL: its processor parts, prompt rendering with data-URI images,
and that a teacher-forced forward with the same pixel inputs reproduces sampling's logprobs."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw
from transformers import AutoConfig, AutoTokenizer, Qwen2VLForConditionalGeneration

from rllm.backends.tinker.vlm_prompt import render_vlm_prompt
from rllm.tiny.vlm import IMAGE_PAD, init_tiny_vlm, load_image_processor
from rllm.types.images import ImageError, data_uri


def _diagram(size: int = 256, radius: int = 60) -> bytes:
    img = Image.new("L", (size, size), 255)
    ImageDraw.Draw(img).ellipse([40, 40, 40 + 2 * radius, 40 + 2 * radius], outline=0, width=3)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _messages(*images: bytes) -> list[dict]:
    blocks = [{"type": "image_url", "image_url": {"url": data_uri(b, "PNG")}} for b in images]
    return [{"role": "user", "content": [{"type": "text", "text": "the answer"}, *blocks]}]


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory) -> tuple[Path, object, object, object]:
    path = init_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=0)
    model = Qwen2VLForConditionalGeneration.from_pretrained(path).eval()
    return path, AutoTokenizer.from_pretrained(path), load_image_processor(path), model


def test_built_locally_as_a_qwen2_vl(tiny_vlm) -> None:
    path, tokenizer, _, model = tiny_vlm
    config = AutoConfig.from_pretrained(path)
    assert config.model_type == "qwen2_vl" and config.image_token_id == tokenizer.convert_tokens_to_ids(
        IMAGE_PAD
    )
    assert (path / "preprocessor_config.json").is_file()
    assert sum(p.numel() for p in model.parameters()) < 2_000_000


def test_each_image_gets_one_pad_token_per_merged_patch(tiny_vlm) -> None:
    _, tokenizer, processor, _ = tiny_vlm
    wide = Image.new("RGB", (320, 160), "white")
    buf = io.BytesIO()
    wide.save(buf, format="PNG")
    inputs = render_vlm_prompt(tokenizer, processor, _messages(_diagram(), buf.getvalue()))
    pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    counts = [int(g.prod()) // processor.merge_size**2 for g in inputs.image_grid_thw]
    assert inputs.input_ids.count(pad) == sum(counts) and len(counts) == 2 and counts[0] != counts[1]
    assert sum(inputs.mm_token_type_ids) == sum(counts)
    assert inputs.pixel_values.shape[0] == int(inputs.image_grid_thw.prod(-1).sum())
    again = render_vlm_prompt(tokenizer, processor, _messages(_diagram(), buf.getvalue()))
    assert again.input_ids == inputs.input_ids and torch.equal(again.pixel_values, inputs.pixel_values)
    text_only = render_vlm_prompt(tokenizer, processor, [{"role": "user", "content": "the answer"}])
    assert text_only.pixel_values is None and pad not in text_only.input_ids


def test_bad_images_raise_image_error_naming_the_block(tiny_vlm) -> None:
    _, tokenizer, processor, _ = tiny_vlm
    bad = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@"}}]}
    ]
    with pytest.raises(ImageError) as e:
        render_vlm_prompt(tokenizer, processor, bad)
    assert e.value.field == "messages[0].content[0].image_url"
    with pytest.raises(ImageError, match="cannot be decoded"):
        render_vlm_prompt(tokenizer, processor, _messages(b"\x89PNG\r\n\x1a\nbroken"))


def test_teacher_forced_logprobs_equal_sampling_logprobs(tiny_vlm) -> None:
    """What training computes (one forward over prompt + completion with the same pixel inputs)
    equals what sampling saw token by token (generate with the KV cache)."""
    _, tokenizer, processor, model = tiny_vlm
    inputs = render_vlm_prompt(tokenizer, processor, _messages(_diagram()))
    ids = torch.tensor([inputs.input_ids])
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=inputs.pixel_values,
            image_grid_thw=inputs.image_grid_thw,
            mm_token_type_ids=torch.tensor([inputs.mm_token_type_ids]),
            max_new_tokens=6,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    completion = out.sequences[0, ids.shape[1] :]
    sampled = torch.stack(
        [torch.log_softmax(s[0].float(), -1)[t] for s, t in zip(out.scores, completion, strict=True)]
    )
    with torch.no_grad():
        logits = model(
            input_ids=out.sequences,
            attention_mask=torch.ones_like(out.sequences),
            pixel_values=inputs.pixel_values,
            image_grid_thw=inputs.image_grid_thw,
            mm_token_type_ids=torch.tensor([inputs.mm_token_type_ids + [0] * len(completion)]),
        ).logits
    forced = torch.log_softmax(logits[0, ids.shape[1] - 1 : -1].float(), -1).gather(-1, completion[:, None])[
        :, 0
    ]
    assert torch.allclose(sampled, forced, atol=1e-4), (sampled, forced)


def test_the_pixels_reach_the_language_model(tiny_vlm) -> None:
    _, tokenizer, processor, model = tiny_vlm

    def last_logits(image: bytes) -> torch.Tensor:
        inputs = render_vlm_prompt(tokenizer, processor, _messages(image))
        ids = torch.tensor([inputs.input_ids])
        with torch.no_grad():
            return model(
                input_ids=ids,
                pixel_values=inputs.pixel_values,
                image_grid_thw=inputs.image_grid_thw,
                mm_token_type_ids=torch.tensor([inputs.mm_token_type_ids]),
            ).logits[0, -1]

    assert not torch.allclose(last_logits(_diagram(radius=60)), last_logits(_diagram(radius=20)))
