from __future__ import annotations

import base64
import hashlib
import io
import json
from pathlib import Path

import pytest
from PIL import Image
from rllm_cookbook_geo3k import INSTRUCTIONS, generate, geo3k_messages, load_tasks
from rllm_cookbook_geo3k.diagrams import KINDS

from rllm.engine.plugins import load_cookbook
from rllm.sdk.images import ImageError
from rllm.types import Task
from rllm.types.images import image_ref, restore_images


def test_shipped_sample_is_the_generators_output(tmp_path):
    for split in ("train", "test"):
        tasks = load_tasks(split)
        rows = generate(split, tmp_path)
        assert [(t.instruction, t.ground_truth) for t in tasks] == [
            (r["question"], r["answer"]) for r in rows
        ]
        assert 10 <= len(tasks) <= 30
        for task, row in zip(tasks, rows, strict=True):
            with Image.open(task.metadata["image"]) as shipped, Image.open(tmp_path / row["image"]) as fresh:
                assert shipped.size == fresh.size == (256, 256)
                assert shipped.format == "PNG"


def test_every_kind_of_diagram_draws_and_has_an_exact_answer():
    import random

    from rllm.sdk.rewards import grade_math

    rng = random.Random(7)
    for kind in KINDS:
        question, answer, png = kind(rng)
        assert question and Image.open(io.BytesIO(png)).size == (256, 256)
        assert grade_math(f"\\boxed{{{answer}}}", answer)


def test_unknown_split_is_refused():
    with pytest.raises(ValueError, match="hub:train"):
        load_tasks("validation")


def _image_sha(body: dict) -> str:
    url = body["messages"][0]["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    return hashlib.sha256(base64.b64decode(url.split(",", 1)[1])).hexdigest()


async def test_flow_and_evaluator_against_a_scripted_model(scripted):
    cookbook = load_cookbook("geo3k")
    tasks = load_tasks("test")[:4]
    # The scripted model "sees" the diagram: it answers by the image's bytes, not the question.
    truth = {hashlib.sha256(Path(t.metadata["image"]).read_bytes()).hexdigest(): t for t in tasks}
    wrong = tasks[1]

    def respond(body):
        task = truth[_image_sha(body)]
        assert body["messages"][0]["content"][0]["text"] == f"{task.instruction}\n{INSTRUCTIONS}"
        return "So \\boxed{-12345}." if task is wrong else f"Hence \\boxed{{{task.ground_truth}}}."

    episodes = await scripted(cookbook, tasks, respond)
    rewards = {e.task_id: e.trajectories[0].reward for e in episodes}
    assert rewards == {t.id: (0.0 if t is wrong else 1.0) for t in tasks}
    assert all(e.termination_reason == "done" for e in episodes)
    assert json.dumps(episodes[0].artifacts)
    # the step keeps the image by content address, and it is the shipped diagram's bytes
    by_id = {t.id: t for t in tasks}
    for e in episodes:
        (step,) = e.trajectories[0].steps
        digest = hashlib.sha256(Path(by_id[e.task_id].metadata["image"]).read_bytes()).hexdigest()
        assert list(step.images) == [digest]
        assert step.input[0].content[1].image_url.url == image_ref(digest)
        restored = restore_images(step.input, step.images)
        assert restored[0].content[1].image_url.url.startswith("data:image/png;base64,")


async def test_bad_images_fail_the_episode_with_a_clear_error_and_no_model_call(scripted, tmp_path):
    cookbook = load_cookbook("geo3k")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    bad = [
        Task(id="missing", instruction="q", ground_truth="1", metadata={"image": str(tmp_path / "nope.png")}),
        Task(
            id="broken", instruction="q", ground_truth="1", metadata={"image": str(tmp_path / "broken.png")}
        ),
    ]
    calls = []
    episodes = await scripted(cookbook, bad, lambda body: calls.append(body) or "\\boxed{1}")
    assert calls == []
    for e in episodes:
        assert e.termination_reason == "agent_error"
        assert e.error is not None and e.error.type == "ImageError"
    with pytest.raises(ImageError, match="cannot read image file"):
        geo3k_messages(bad[0])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["cumulative", "plain"])
def test_two_training_steps_with_a_tiny_vision_language_model(tmp_path, mode):
    """Geo3K end to end on the local tinker backend: the tiny Qwen2-VL samples from the diagrams
    (cumulative mode: the gateway places the image tokens with the model's processor and sends
    the images with the token ids; plain mode: the sampler reports the placeholder tokens it
    used), the steps keep the images, and the trainer feeds the same pixels to its forward pass."""
    import asyncio

    from rllm.engine.training.launch import build_trainer, task_vocabulary
    from rllm.engine.training.metrics_log import read_metrics
    from rllm.tiny.vlm import init_tiny_vlm

    model = init_tiny_vlm(tmp_path / "tiny-vlm", vocab_words=task_vocabulary(load_cookbook("geo3k")))
    trainer = build_trainer(
        "geo3k",
        out_dir=str(tmp_path / "run"),
        overrides=[
            "progress=false",
            "plot=false",
            "tensorboard=false",
            "total_steps=2",
            "tasks_per_step=2",
            "group_size=2",
            "val_every=0",
            "rollout.sampling.max_tokens=6",
            "algorithm.filter_zero_variance=false",
            f"gateway.mode={mode}",
            f"backend.options.model={model}",
            "backend.options.lora.rank=0",
        ],
    )
    asyncio.run(trainer.fit())
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["train/sequences"] >= row["episodes"] > 0 for row in rows), rows
    # the first step trains on exactly what was sampled: same image tokens, same pixels
    assert rows[0]["train/sampler_logprob_abs_diff"] < 1e-3, rows[0]
    # the sampled episodes kept their diagram (once per single-step episode) and its 16 image tokens
    from transformers import AutoTokenizer

    from rllm.engine.training.metrics_log import read_episode_sample, sample_path
    from rllm.tiny.vlm import IMAGE_PAD

    pad = AutoTokenizer.from_pretrained(model).convert_tokens_to_ids(IMAGE_PAD)
    sample = read_episode_sample(sample_path(tmp_path / "run", 1))
    steps = [s for e in sample.episodes for t in e.trajectories for s in t.steps]
    assert steps and all(len(s.images) == 1 and list(s.prompt_ids).count(pad) == 16 for s in steps)
    raw = sample_path(tmp_path / "run", 1).read_bytes()
    first = next(iter(steps[0].images.values()))
    assert raw.count(first.split(",", 1)[1].encode()) == sum(first in s.images.values() for s in steps)
