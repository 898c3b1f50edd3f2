"""Vision-language batches for verl: a TrainSequence's images become its row's
``multi_modal_inputs`` and [4, seq] M-RoPE position ids (verl 0.9.1's Qwen-VL layout), and a tiny
Qwen2-VL run through verl's FSDP engine on the CPU with the converted batch gives the log-probs
of a plain transformers forward with the same pixels, and trains."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

# Named on its own in the workspace env (no verl there), the file skips; nox -s verl runs it.
pytest.importorskip("verl")

import torch
from PIL import Image, ImageDraw
from verl_helpers import cpu_config

from rllm.algos import AlgorithmConfig
from rllm.backends.verl.actor import compute_log_probs, update_policy
from rllm.backends.verl.convert import BatchConversionError, to_data_proto
from rllm.backends.verl.loss import RllmPolicyLoss
from rllm.backends.verl.vision import load_vision_rows
from rllm.backends.verl.workers import local_training_worker
from rllm.tiny.vlm import init_tiny_vlm
from rllm.types import FloatArray, TokenArray, TrainSequence
from rllm.types.images import data_uri

pytestmark = pytest.mark.verl


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory) -> Path:
    """A random 2-layer Qwen2-VL (one vision block, 16 image tokens for a 256x256 picture)."""
    return init_tiny_vlm(tmp_path_factory.mktemp("verl-vlm") / "model", ["circle", "radius", "answer"])


def _diagram(radius: int) -> str:
    img = Image.new("L", (256, 256), 255)
    ImageDraw.Draw(img).ellipse([40, 40, 40 + 2 * radius, 40 + 2 * radius], outline=0, width=3)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return data_uri(buf.getvalue(), "PNG")


def _sequence(path: Path, words: str, answer: str, advantage: float, *images: str) -> TrainSequence:
    """'<|user|> words [image...] <|end|> <|assistant|>' + the answer's tokens (trained)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    picture = "<|vision_start|>" + "<|image_pad|>" * 16 + "<|vision_end|>"
    prompt = tok.encode(
        f"<|user|> {words} {picture * len(images)} <|end|> <|assistant|>", add_special_tokens=False
    )
    response = tok.encode(f"{answer} <|end|>", add_special_tokens=False)
    n, m = len(prompt), len(response)
    return TrainSequence(
        input_ids=TokenArray(prompt + response),
        loss_mask=FloatArray([0.0] * n + [1.0] * m),
        advantages=FloatArray([0.0] * n + [advantage] * m),
        sampler_logprobs=FloatArray([0.0] * (n + m)),
        group_id="geo/default",
        images=list(images),
    )


def _reference_log_probs(path: Path, seq: TrainSequence, vision) -> torch.Tensor:
    """The response tokens' log-probs from transformers' own Qwen2-VL forward (it computes the
    M-RoPE positions itself from the image tokens)."""
    from transformers import Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([list(seq.input_ids)])
    kwargs = {}
    if seq.images:
        pixel_values, grid = vision.pixels(seq.images, 0)
        mm = (ids == vision.image_token_id).to(torch.int64)
        kwargs = {"pixel_values": pixel_values, "image_grid_thw": grid, "mm_token_type_ids": mm}
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs).logits[0].float()
    first = next(k for k, m in enumerate(seq.loss_mask) if m)
    logp = torch.log_softmax(logits[first - 1 : -1], dim=-1)
    return logp.gather(-1, ids[0, first:, None])[:, 0]


def test_images_become_multi_modal_inputs_and_mrope_positions(vlm_path) -> None:
    from transformers import Qwen2VLForConditionalGeneration

    vision = load_vision_rows(str(vlm_path))
    assert vision is not None and vision.mrope
    url = _diagram(60)
    batch = [
        _sequence(vlm_path, "circle radius", "answer", 1.0, url),
        _sequence(vlm_path, "answer", "circle", -1.0),
    ]
    data = to_data_proto(batch, pad_token_id=0, vision=vision)
    positions = data.batch["position_ids"]
    assert positions.shape == (2, 4, data.batch["input_ids"].shape[1])
    inputs = data.non_tensor_batch["multi_modal_inputs"]
    assert inputs[1] == {}  # a text row in a vision batch
    assert inputs[0]["image_grid_thw"].tolist() == [[1, 8, 8]] and inputs[0]["images_seqlens"].tolist() == [
        64
    ]
    pixels, _ = vision.pixels([url], 0)
    assert torch.equal(inputs[0]["pixel_values"], pixels)  # the same image bytes, the same processor
    # rows 1-3: transformers' own M-RoPE index of the row; row 0 the plain text positions
    model = Qwen2VLForConditionalGeneration.from_pretrained(vlm_path).eval()
    for row, seq in enumerate(batch):
        ids = torch.tensor([list(seq.input_ids)])
        mm = (ids == vision.image_token_id).to(torch.int64)
        grid = inputs[row].get("image_grid_thw")
        expected, _ = model.model.get_rope_index(ids, mm_token_type_ids=mm, image_grid_thw=grid)
        kept = positions[row][:, data.batch["attention_mask"][row].bool()]
        assert kept[0].tolist() == list(range(len(seq.input_ids)))
        assert torch.equal(kept[1:], expected[:, 0, :])
    assert positions[0, 1:].max() < len(batch[0].input_ids) - 1  # an image's tokens share positions


def test_images_that_do_not_fit_their_tokens_are_refused_naming_the_sequence(vlm_path) -> None:
    vision = load_vision_rows(str(vlm_path))
    url = _diagram(30)
    two_images = _sequence(vlm_path, "circle", "answer", 1.0, url)
    two_images.images = [url, url]  # 16 image tokens, but two images need 32
    with pytest.raises(BatchConversionError, match="sequence 0: 16 image tokens"):
        to_data_proto([two_images], pad_token_id=0, vision=vision)
    broken = _sequence(vlm_path, "circle", "answer", 1.0, "data:image/png;base64,iVBORw0KGgo=")
    with pytest.raises(BatchConversionError, match=r"sequence 0: images\[0\]: cannot be decoded"):
        to_data_proto([broken], pad_token_id=0, vision=vision)
    with pytest.raises(BatchConversionError, match="has images, but the model takes no image inputs"):
        to_data_proto([_sequence(vlm_path, "circle", "answer", 1.0, url)], pad_token_id=0)


def test_verls_fsdp_engine_sees_the_pixels_and_trains(vlm_path) -> None:
    """Log-probs through verl's engine (no-padding layout, [4, seq] positions, pixel inputs from
    multi_modal_inputs) equal transformers' own forward; then an update moves them."""
    vision = load_vision_rows(str(vlm_path))
    batch = [
        _sequence(vlm_path, "circle radius", "answer", 1.0, _diagram(60)),
        _sequence(vlm_path, "circle", "radius", -1.0, _diagram(25)),
    ]
    # First: building verl's engine patches Qwen2-VL's forward for its own layout, process-wide.
    expected = [_reference_log_probs(vlm_path, seq, vision) for seq in batch]
    worker = local_training_worker(cpu_config(vlm_path, optim={"lr": 1e-2}, mini_batches=1))
    data = to_data_proto(batch, pad_token_id=0, vision=vision)
    got = compute_log_probs(worker, data)["log_probs"]
    mask = data.batch["response_mask"].bool()
    for row in range(len(batch)):
        assert torch.allclose(got[row][mask[row]], expected[row], atol=1e-4), (got[row][mask[row]], expected)
    loss = RllmPolicyLoss(AlgorithmConfig(loss="cross_entropy"))
    worker.set_loss_fn(loss)
    metrics = update_policy(worker, to_data_proto(batch, pad_token_id=0, vision=vision), loss)
    assert metrics["grad_norm"] > 0
    after = compute_log_probs(worker, to_data_proto(batch, pad_token_id=0, vision=vision))["log_probs"]
    assert float((after - got)[mask].abs().max()) > 1e-3  # the update changed the policy
