"""The local backend at its default precision on a GPU: CUDA + bf16 (skipped without CUDA).

The other tests pin float32 so their exact tolerances hold on any device; these check what users
get by default on a GPU, with bounds that bf16's 8-bit mantissa allows.
"""

from __future__ import annotations

import math
from pathlib import Path

import openai
import pytest
import torch
from tinker_helpers import (
    contrast_batch,
    reply_logprob,
    reply_sequence,
    start_backend,
    teacher_forced_logprobs,
)

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.types import FloatArray, TokenArray, TrainSequence

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# bf16 logits carry ~3 significant digits; sampler (KV-cached, batched) and teacher-forced passes
# round differently, so their logprobs agree to a few hundredths, not to 1e-4 as in float32.
BF16_MEAN_ABS_LOGPROB_GAP = 0.1


def _assert_on_cuda(model: torch.nn.Module, dtype: torch.dtype | None) -> None:
    for name, param in model.named_parameters():
        assert param.device.type == "cuda", (name, param.device)
        assert dtype is None or param.dtype == dtype, (name, param.dtype)


async def _sampler_gap(backend: TinkerBackend, client: openai.AsyncOpenAI) -> float:
    """Mean |sampler logprob - teacher-forced logprob| over the tokens of 4 sampled replies."""
    body = (
        await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "say: apple"}],
            max_tokens=6,
            n=4,
            seed=1,
            logprobs=True,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
    ).model_dump()
    prompt, gaps = body["prompt_token_ids"], []
    for choice in body["choices"]:
        ids = choice["token_ids"]
        sampled = torch.tensor([c["logprob"] for c in choice["logprobs"]["content"]])
        forced = teacher_forced_logprobs(backend.service.engine.model, prompt + ids)[len(prompt) - 1 :]
        assert sampled.shape == forced.shape and torch.isfinite(sampled).all()
        gaps.append((sampled - forced).abs())
    return float(torch.cat(gaps).mean())


async def _sampled_batch(
    backend: TinkerBackend, client: openai.AsyncOpenAI, word: str
) -> tuple[list[TrainSequence], float]:
    """16 sampled replies to 'say: word' as a train batch carrying the sampler's own (bf16)
    logprobs and group-relative advantages, and their mean reward (first token == word)."""
    target = backend.service.tokenizer.convert_tokens_to_ids(word)
    body = (
        await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": f"say: {word}"}],
            max_tokens=2,
            n=16,
            seed=2,
            temperature=1.0,
            logprobs=True,
            extra_body={"return_token_ids": True},
        )
    ).model_dump()
    prompt = body["prompt_token_ids"]
    rewards = [float(c["token_ids"][0] == target) for c in body["choices"]]
    mean = sum(rewards) / len(rewards)
    batch = []
    for choice, reward in zip(body["choices"], rewards, strict=True):
        ids = choice["token_ids"]
        logprobs = [c["logprob"] for c in choice["logprobs"]["content"]]
        batch.append(
            TrainSequence(
                input_ids=TokenArray(prompt + ids),
                loss_mask=FloatArray([0.0] * len(prompt) + [1.0] * len(ids)),
                advantages=FloatArray([reward - mean] * (len(prompt) + len(ids))),
                sampler_logprobs=FloatArray([0.0] * len(prompt) + logprobs),
            )
        )
    return batch, mean


async def test_default_precision_is_bf16_on_cuda_and_it_trains(tiny_model_path: Path) -> None:
    backend = await start_backend(tiny_model_path, dtype="auto", learning_rate=1e-2)
    client = openai.AsyncOpenAI(base_url=backend.inference_urls()[0], api_key="x", max_retries=0)
    try:
        service = backend.service
        assert service.device.type == "cuda" and service.dtype == torch.bfloat16
        _assert_on_cuda(service.trainer.model, torch.bfloat16)
        _assert_on_cuda(service.engine.model, torch.bfloat16)

        assert await _sampler_gap(backend, client) < BF16_MEAN_ABS_LOGPROB_GAP

        # one policy-gradient step on the sampler's own replies: the trainer's bf16 logprobs of
        # them agree with the sampler's (the gap the TIS correction would otherwise have to fix)
        batch, before = await _sampled_batch(backend, client, "apple")
        metrics = await backend.train_step(batch, AlgorithmConfig(loss="ppo_clip"))
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert metrics["sampler_logprob_abs_diff"] < BF16_MEAN_ABS_LOGPROB_GAP, metrics

        # policy gradient on a contrast batch moves the two replies apart
        good, bad = reply_logprob(backend, "apple", "apple"), reply_logprob(backend, "apple", "banana")
        for _ in range(5):
            metrics = await backend.train_step(contrast_batch(backend), AlgorithmConfig(loss="ppo_clip"))
            assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert reply_logprob(backend, "apple", "apple") > good + 1.0
        assert reply_logprob(backend, "apple", "banana") < bad - 1.0

        # after a sync the sampler serves the trained policy: the task's reward went up
        assert await backend.sync_weights() == 1
        _assert_on_cuda(service.trainer.model, torch.bfloat16)  # optimizer steps kept the dtype
        _assert_on_cuda(service.engine.model, torch.bfloat16)
        _, after = await _sampled_batch(backend, client, "apple")
        assert after > before, (before, after)
        assert await _sampler_gap(backend, client) < BF16_MEAN_ABS_LOGPROB_GAP

        # supervised steps on the trivial task stay finite in bf16 and reach a lower loss. (At
        # this test's deliberately high learning rate the loss oscillates from step to step on
        # the H200, so no single step is compared with another.)
        supervised = [reply_sequence(backend, "apple", "apple", 0.0)]
        algo = AlgorithmConfig(loss="cross_entropy")
        losses = [(await backend.train_step(supervised, algo))["loss"] for _ in range(8)]
        assert all(math.isfinite(v) for v in losses) and min(losses[1:]) < losses[0], losses
    finally:
        await client.close()
        await backend.close()


async def test_lora_on_a_bf16_base_trains_and_syncs(tiny_model_path: Path) -> None:
    backend = await start_backend(
        tiny_model_path, dtype="auto", learning_rate=5e-2, lora={"rank": 4, "alpha": 8}
    )
    try:
        trainer = backend.service.trainer
        frozen = [p for p in trainer.model.parameters() if not p.requires_grad]
        assert frozen and all(p.device.type == "cuda" and p.dtype == torch.bfloat16 for p in frozen)
        _assert_on_cuda(trainer.model, None)  # adapters may be kept in float32 by peft: any dtype
        good = reply_logprob(backend, "apple", "apple")
        algo = AlgorithmConfig(loss="ppo_clip", kl_coef=0.1)
        first = await backend.train_step(contrast_batch(backend), algo)
        for _ in range(2):
            last = await backend.train_step(contrast_batch(backend), algo)
        assert abs(first["kl"]) < 1e-3 and last["kl"] > 0.0  # adapters start at zero: policy == base
        assert all(math.isfinite(v) for v in last.values()), last
        assert reply_logprob(backend, "apple", "apple") > good + 0.5
        await backend.sync_weights()
        sampled = reply_logprob(backend, "apple", "apple", backend.service.engine.model)
        assert sampled == pytest.approx(reply_logprob(backend, "apple", "apple"), abs=1e-2)
    finally:
        await backend.close()
