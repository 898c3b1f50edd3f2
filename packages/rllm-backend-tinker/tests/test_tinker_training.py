"""Real torch training of the tiny model through the local service."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import numpy as np
import openai
import pytest
import torch
from tinker_helpers import (
    contrast_batch,
    cpu_params,
    policy_logprobs,
    prompt_ids,
    reply_logprob,
    reply_sequence,
    start_backend,
    started_backend,
)

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.local.trainer import LocalTrainer
from rllm.types import FloatArray, TokenArray, TrainSequence


async def test_train_steps_raise_the_logprob_of_advantaged_tokens(backend: TinkerBackend) -> None:
    good, bad = reply_logprob(backend, "apple", "apple"), reply_logprob(backend, "apple", "banana")
    algo = AlgorithmConfig(loss="ppo_clip")
    backend.validate(algo)
    for _ in range(5):
        metrics = await backend.train_step(contrast_batch(backend), algo)
    assert reply_logprob(backend, "apple", "apple") > good + 1.0
    assert reply_logprob(backend, "apple", "banana") < bad - 1.0
    for key in ("loss", "grad_norm", "entropy", "clip_frac", "approx_kl", "num_tokens", "lr"):
        assert key in metrics and np.isfinite(metrics[key]), key
    assert metrics["num_tokens"] == 8.0 and metrics["optimizer_steps"] == 1.0
    # the batch's logprobs came from the same weights, so the sampler/trainer gap is tiny
    assert metrics["sampler_logprob_abs_diff"] < 1e-3


async def test_train_step_records_the_pre_update_policy_logprobs(tiny_model_path: Path) -> None:
    for options in ({}, {"mini_batches": 2, "ppo_epochs": 2, "shuffle_seed": 0}):
        backend = await start_backend(tiny_model_path, learning_rate=2e-2, **options)
        try:
            batch = contrast_batch(backend)
            before = [policy_logprobs(backend, list(s.input_ids)) for s in batch]
            await backend.train_step(batch, AlgorithmConfig(loss="ppo_clip"))
            for seq, logprobs in zip(batch, before, strict=True):
                assert seq.trainer_logprobs is not None and len(seq.trainer_logprobs) == len(seq.input_ids)
                mask = list(seq.loss_mask)
                expected = [0.0] + [lp if m else 0.0 for lp, m in zip(logprobs, mask[1:], strict=True)]
                assert list(seq.trainer_logprobs) == pytest.approx(expected, abs=1e-4), options
                # the batch's sampler logprobs came from the same weights
                assert list(seq.trainer_logprobs) == pytest.approx(list(seq.sampler_logprobs), abs=1e-3)
        finally:
            await backend.close()


async def test_cross_entropy_loss_decreases(backend: TinkerBackend) -> None:
    algo = AlgorithmConfig(loss="cross_entropy")
    batch = [reply_sequence(backend, w, w, 0.0) for w in ("apple", "mango", "peach")]
    losses = [(await backend.train_step(batch, algo))["loss"] for _ in range(6)]
    assert losses[-1] < losses[0] * 0.5, losses


async def test_mini_batches_and_epochs_make_several_optimizer_steps(tiny_model_path: Path) -> None:
    backend = await start_backend(
        tiny_model_path, learning_rate=2e-2, mini_batches=2, ppo_epochs=2, shuffle_seed=0
    )
    try:
        algo = AlgorithmConfig(loss="ppo_clip", clip_low=0.05, clip_high=0.05)
        metrics = await backend.train_step(contrast_batch(backend), algo)
        assert metrics["optimizer_steps"] == 4.0
        # later updates are measured against the pre-update policy, so ratios move and get clipped
        assert metrics["approx_kl"] != 0.0
        assert metrics["clip_frac"] > 0.0
    finally:
        await backend.close()


def test_micro_batches_accumulate_to_the_full_batch_gradient(tiny_model_path: Path) -> None:
    backend = started_backend(tiny_model_path)
    try:
        batch = contrast_batch(backend)
        for aggregation in ("token-mean", "seq-mean-token-mean"):
            algo = AlgorithmConfig(loss="ppo_clip", aggregation=aggregation)
            grads = []
            for micro in (0, 12):
                model = copy.deepcopy(backend.service.trainer.model)
                config = TinkerBackendConfig(model=str(tiny_model_path), micro_batch_tokens=micro)
                # the copy lives where the backend's model does (CUDA on a GPU machine)
                trainer = LocalTrainer(model, config, backend.service.device, 0)
                trainer.forward_backward(batch, list(range(len(batch))), algo, None)
                grads.append(torch.cat([p.grad.flatten() for p in trainer.params]).cpu())
            assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4), aggregation
    finally:
        asyncio.run(backend.close())


async def test_sync_weights_changes_what_the_sampler_serves(backend: TinkerBackend) -> None:
    client = openai.AsyncOpenAI(base_url=backend.inference_urls()[0], api_key="x", max_retries=0)
    prompt = prompt_ids(backend, "plum")
    plum = backend.service.tokenizer.convert_tokens_to_ids("plum")

    async def plum_logprob() -> tuple[float, int]:
        body = (
            await client.completions.create(
                model="m",
                prompt=prompt,
                max_tokens=1,
                logprobs=20,
                temperature=0.0,
                extra_body={"return_token_ids": True},
            )
        ).model_dump()
        return body["choices"][0]["token_ids"][0], body["weight_version"]

    before_token, version = await plum_logprob()
    assert version == 0
    for _ in range(6):
        await backend.train_step(
            [reply_sequence(backend, "plum", "plum", 1.0)], AlgorithmConfig(loss="cross_entropy")
        )
    stale_token, stale_version = await plum_logprob()
    assert (stale_token, stale_version) == (before_token, 0)  # training alone does not touch the sampler
    assert await backend.sync_weights() == 1
    after_token, after_version = await plum_logprob()
    assert after_version == 1
    assert after_token == plum != before_token
    await client.close()


async def test_shared_weights_mode_trains_and_serves(tiny_model_path: Path) -> None:
    backend = await start_backend(tiny_model_path, learning_rate=1e-2, sampler_weights="shared")
    try:
        assert backend.service.engine.model is backend.service.trainer.model
        good = reply_logprob(backend, "apple", "apple")
        await backend.train_step(contrast_batch(backend), AlgorithmConfig())
        assert await backend.sync_weights() == 1
        assert reply_logprob(backend, "apple", "apple", backend.service.engine.model) > good
    finally:
        await backend.close()


async def test_lora_trains_only_adapters_and_kl_uses_the_base_model(tiny_model_path: Path) -> None:
    backend = await start_backend(tiny_model_path, learning_rate=5e-2, lora={"rank": 4, "alpha": 8})
    try:
        trainer = backend.service.trainer
        frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
        assert frozen and all("lora_" in n for n, p in trainer.model.named_parameters() if p.requires_grad)
        good = reply_logprob(backend, "apple", "apple")
        algo = AlgorithmConfig(loss="ppo_clip", kl_coef=0.1)
        first = await backend.train_step(contrast_batch(backend), algo)
        second = await backend.train_step(contrast_batch(backend), algo)
        assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # adapters start at zero: policy == base
        assert second["kl"] > 0.0
        assert reply_logprob(backend, "apple", "apple") > good
        for name, param in trainer.model.named_parameters():
            if name in frozen:
                assert torch.equal(param, frozen[name]), name
        await backend.sync_weights()
        assert reply_logprob(backend, "apple", "apple", backend.service.engine.model) == pytest.approx(
            reply_logprob(backend, "apple", "apple"), abs=1e-5
        )
    finally:
        await backend.close()


async def test_full_fine_tuning_kl_against_the_initial_weights(backend: TinkerBackend) -> None:
    algo = AlgorithmConfig(loss="ppo_clip", kl_coef=0.5, kl_estimator="k3")
    first = await backend.train_step(contrast_batch(backend), algo)
    second = await backend.train_step(contrast_batch(backend), algo)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6) and second["kl"] > 0.0


async def test_entropy_bonus_and_tis_are_honoured(backend: TinkerBackend) -> None:
    batch = contrast_batch(backend)
    for seq in batch:  # pretend the sampler was more confident than the trainer
        seq.sampler_logprobs = FloatArray([v + 0.5 if v else 0.0 for v in seq.sampler_logprobs])
    metrics = await backend.train_step(batch, AlgorithmConfig(tis="token", tis_cap=1.5, entropy_coef=0.01))
    assert metrics["tis/weight_mean"] < 1.0
    assert metrics["sampler_logprob_abs_diff"] == pytest.approx(0.5, abs=1e-3)


async def test_malformed_batches_are_refused_with_a_named_field(backend: TinkerBackend) -> None:
    algo = AlgorithmConfig()
    good = reply_sequence(backend, "apple", "apple", 1.0)
    with pytest.raises(ValueError, match="empty batch"):
        await backend.train_step([], algo)
    short = TrainSequence(
        input_ids=good.input_ids,
        loss_mask=FloatArray([1.0]),
        advantages=good.advantages,
        sampler_logprobs=good.sampler_logprobs,
    )
    with pytest.raises(ValueError, match=r"batch\[1\]\.loss_mask"):
        await backend.train_step([good, short], algo)
    huge = TrainSequence(
        input_ids=TokenArray([1, 10**6]),
        loss_mask=FloatArray([0, 1]),
        advantages=FloatArray([1, 1]),
        sampler_logprobs=FloatArray([0, 0]),
    )
    with pytest.raises(ValueError, match=r"batch\[0\]\.input_ids"):
        await backend.train_step([huge], algo)
    untrained = TrainSequence(
        input_ids=good.input_ids,
        loss_mask=FloatArray([0.0] * len(good.input_ids)),
        advantages=good.advantages,
        sampler_logprobs=good.sampler_logprobs,
    )
    with pytest.raises(ValueError, match="without a trained token"):
        await backend.train_step([untrained], algo)


async def test_checkpoint_round_trip(tiny_model_path: Path, tmp_path: Path) -> None:
    algo = AlgorithmConfig()
    source = await start_backend(tiny_model_path, learning_rate=1e-2)
    try:
        for _ in range(2):
            await source.train_step(contrast_batch(source), algo)
        await source.sync_weights()
        await source.save_checkpoint(tmp_path / "ckpt")
        expected = cpu_params(source.service.trainer.model)  # CPU copies: compared with a CPU reload below
        expected_next = await source.train_step(contrast_batch(source), algo)
        after_next = cpu_params(source.service.trainer.model)
    finally:
        await source.close()
    assert {"model.safetensors", "optimizer.pt", "config.json", "tokenizer.json"} <= {
        p.name for p in (tmp_path / "ckpt").iterdir()
    }
    restored = await start_backend(tiny_model_path, learning_rate=1e-2)
    try:
        await restored.load_checkpoint(tmp_path / "ckpt")
        for name, param in cpu_params(restored.service.trainer.model).items():
            assert torch.equal(param, expected[name]), name
        assert restored.service.engine.weight_version == 1
        sampler_params = cpu_params(restored.service.engine.model)
        assert all(torch.equal(sampler_params[n], p) for n, p in expected.items())
        # the optimizer state came back too: the next step is the same step
        got_next = await restored.train_step(contrast_batch(restored), algo)
        assert got_next["loss"] == pytest.approx(expected_next["loss"], abs=1e-6)
        for name, param in cpu_params(restored.service.trainer.model).items():
            assert torch.allclose(param, after_next[name], atol=1e-6), name
        assert await restored.sync_weights() == 2
    finally:
        await restored.close()
    # the full fine-tuning checkpoint is itself a loadable Hugging Face model
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    assert torch.equal(
        dict(reloaded.named_parameters())["model.embed_tokens.weight"], expected["model.embed_tokens.weight"]
    )


async def test_a_loaded_checkpoint_trains_at_the_loading_runs_lr(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """An SFT run whose schedule ended at LR 0, loaded by an RL run (init_from): the RL run trains
    at its own LR (the optimizer state used to bring the saved LR 0 along, and nothing moved)."""
    algo = AlgorithmConfig()
    source = await start_backend(tiny_model_path, learning_rate=1e-2)
    try:
        source.set_learning_rate_scale(0.0)  # the end of a cosine schedule
        await source.train_step(contrast_batch(source), AlgorithmConfig(loss="cross_entropy", tis="none"))
        await source.save_checkpoint(tmp_path / "sft")
    finally:
        await source.close()
    restored = await start_backend(tiny_model_path, learning_rate=3e-3)
    try:
        await restored.load_checkpoint(tmp_path / "sft")
        before = cpu_params(restored.service.trainer.model)
        metrics = await restored.train_step(contrast_batch(restored), algo)
        assert metrics["lr"] == pytest.approx(3e-3)
        after = cpu_params(restored.service.trainer.model)
        assert any(not torch.equal(after[name], param) for name, param in before.items())
    finally:
        await restored.close()


async def test_lora_checkpoint_round_trip_and_kind_mismatch(tiny_model_path: Path, tmp_path: Path) -> None:
    lora = {"rank": 4, "alpha": 8}
    source = await start_backend(tiny_model_path, learning_rate=5e-2, lora=lora)
    try:
        await source.train_step(contrast_batch(source), AlgorithmConfig())
        await source.save_checkpoint(tmp_path / "lora")
        expected = cpu_params(source.service.trainer.model)
    finally:
        await source.close()
    assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt"} <= {
        p.name for p in (tmp_path / "lora").iterdir()
    }
    restored = await start_backend(tiny_model_path, lora=lora)
    try:
        await restored.load_checkpoint(tmp_path / "lora")
        for name, param in cpu_params(restored.service.trainer.model).items():
            assert torch.equal(param, expected[name]), name
    finally:
        await restored.close()
    full = await start_backend(tiny_model_path)
    try:
        with pytest.raises(ValueError, match="LoRA"):
            await full.load_checkpoint(tmp_path / "lora")
    finally:
        await full.close()
