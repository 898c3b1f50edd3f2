"""On-policy distillation against the local sampler server as the teacher (rllm.engine.data.distill)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from rllm.backends.tinker import TinkerBackend
from rllm.engine.data.distill import TeacherClient, check_same_tokenizer, distill_advantages
from rllm.testing import MockUpstream
from rllm.tiny.tokenizer import build_tokenizer
from rllm.types import ConfigError, FloatArray, TokenArray, TrainSequence
from rllm.types.errors import InputError


def sampled_sequence(backend: TinkerBackend, word: str) -> TrainSequence:
    """The student's own sample: prompt + completion ids with the sampler's logprobs."""
    client = openai.OpenAI(base_url=backend.inference_urls()[0], api_key="x", max_retries=0)
    body = client.completions.create(
        model="any",
        prompt=f"<|user|> say : {word} <|end|> <|assistant|>",
        max_tokens=6,
        temperature=1.0,
        logprobs=0,
        seed=3,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    ).model_dump()
    prompt, ids = body["prompt_token_ids"], body["choices"][0]["token_ids"]
    logprobs = body["choices"][0]["logprobs"]["token_logprobs"]
    return TrainSequence(
        input_ids=TokenArray(prompt + ids),
        loss_mask=FloatArray([0.0] * len(prompt) + [1.0] * len(ids)),
        advantages=FloatArray([0.5] * (len(prompt) + len(ids))),
        sampler_logprobs=FloatArray([0.0] * len(prompt) + logprobs),
    )


def test_teacher_equal_to_student_gives_zero_advantages(sampler_backend: TinkerBackend) -> None:
    sequences = [sampled_sequence(sampler_backend, w) for w in ("plum", "apple")]
    teacher = TeacherClient(sampler_backend.inference_urls()[0])
    scores = asyncio.run(teacher.score(sequences))
    metrics = distill_advantages(sequences, scores)
    for sequence in sequences:
        trained = [a for a, m in zip(sequence.advantages, sequence.loss_mask, strict=True) if m]
        assert len(trained) == 6 and max(abs(a) for a in trained) < 1e-4
        assert all(a == 0.0 for a, m in zip(sequence.advantages, sequence.loss_mask, strict=True) if not m)
    assert abs(metrics["distill/reverse_kl"]) < 1e-4 and metrics["distill/tokens"] == 12
    # Mixed with the task's advantage: reward_coef times what was there, on trained tokens only.
    again = [sampled_sequence(sampler_backend, "plum")]
    distill_advantages(again, asyncio.run(teacher.score(again)), reward_coef=2.0)
    assert all(abs(a - 1.0) < 1e-4 for a, m in zip(again[0].advantages, again[0].loss_mask, strict=True) if m)


def test_a_steps_sequences_are_scored_in_one_request_as_each_alone(sampler_backend: TinkerBackend) -> None:
    """Batched scoring: one request for the whole step, one padded forward pass on the local
    sampler, and each sequence's logprobs as if it were scored alone (sequences of different
    lengths, so the shorter ones are padded)."""
    sequences = [sampled_sequence(sampler_backend, w) for w in ("plum", "apple")]
    sequences.append(sampled_sequence(sampler_backend, "plum"))
    sequences[2].input_ids = TokenArray(list(sequences[2].input_ids)[:-3])  # a shorter one
    posts: list[dict] = []

    class Counting(TeacherClient):
        def _post(self, body: dict) -> dict:
            posts.append(body)
            return super()._post(body)

    teacher = Counting(sampler_backend.inference_urls()[0])
    batched = asyncio.run(teacher.score(sequences))
    assert len(posts) == 1 and len(posts[0]["prompt"]) == 3
    for sequence, scores in zip(sequences, batched, strict=True):
        alone = teacher.score_sync(list(sequence.input_ids))
        assert len(scores) == len(sequence.input_ids)
        assert max(abs(a - b) for a, b in zip(scores, alone, strict=True)) < 1e-5


def test_a_different_teacher_gives_the_reverse_kl(sampler_backend: TinkerBackend) -> None:
    sequence = sampled_sequence(sampler_backend, "plum")
    teacher = [0.0] + [-1.0] * (len(sequence.input_ids) - 1)  # a teacher giving every token logprob -1
    metrics = distill_advantages([sequence], [teacher])
    expected = [-1.0 - lp for lp, m in zip(sequence.sampler_logprobs, sequence.loss_mask, strict=True) if m]
    for a, m, lp in zip(sequence.advantages, sequence.loss_mask, sequence.sampler_logprobs, strict=True):
        if m:
            assert a == pytest.approx(-1.0 - lp, abs=1e-6)
    # The step's metrics show the advantages that were trained, not the task reward's (0.5) that
    # the step's advantage/* metrics report.
    assert metrics["distill/advantage_mean"] == pytest.approx(sum(expected) / len(expected), abs=1e-6)
    assert metrics["distill/advantage_min"] == pytest.approx(min(expected), abs=1e-6)
    assert metrics["distill/advantage_max"] == pytest.approx(max(expected), abs=1e-6)


async def test_a_teacher_without_prompt_logprobs_is_a_clear_error() -> None:
    async with MockUpstream() as upstream:
        teacher = TeacherClient(upstream.url)
        seq = TrainSequence(
            input_ids=TokenArray([1, 2, 3]),
            loss_mask=FloatArray([0, 1, 1]),
            advantages=FloatArray([0, 0, 0]),
            sampler_logprobs=FloatArray([0, -1, -1]),
        )
        with pytest.raises(InputError, match="returned no prompt_logprobs"):
            await teacher.score([seq])


def test_sampler_refuses_unsupported_prompt_logprobs(sampler_backend: TinkerBackend) -> None:
    client = openai.OpenAI(base_url=sampler_backend.inference_urls()[0], api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.completions.create(
            model="any", prompt=[3, 4], max_tokens=1, extra_body={"prompt_logprobs": 21}
        )


def test_tokenizer_mismatch_is_refused() -> None:
    check_same_tokenizer(build_tokenizer(["plum"]), build_tokenizer(["plum"]))
    with pytest.raises(ConfigError, match=r"distill\.teacher"):
        check_same_tokenizer(build_tokenizer(["plum"]), build_tokenizer(["quince", "plum"]))
