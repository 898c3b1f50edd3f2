"""Several policies on the local service: one LoRA adapter each on one base model (real torch,
real peft, the tiny model), each trained only by its own batches, sampled by name, checkpointed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import msgspec
import openai
import pytest
import torch
from tinker_helpers import contrast_batch, cpu_params, prompt_ids

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.engine.training.policies import PolicySection
from rllm.types import ConfigError, TrainSequence
from rllm.types.errors import InputError

ALGO = AlgorithmConfig(loss="ppo_clip")


def _policies(**sections: PolicySection) -> dict[str, PolicySection]:
    return sections or {"judge": PolicySection(learning_rate=5e-2)}


async def _two_policy_backend(model: Path, **options: object) -> TinkerBackend:
    backend = TinkerBackend(
        {
            "model": str(model),
            "torch_threads": 2,
            "dtype": "float32",
            "learning_rate": 5e-2,
            "lora": {"rank": 4},
            **options,
        }
    )
    backend.use_policies(_policies())
    await backend.start()
    return backend


@pytest.fixture
def two_policies(tiny_model_path: Path) -> Iterator[TinkerBackend]:
    backend = asyncio.run(_two_policy_backend(tiny_model_path))
    yield backend
    asyncio.run(backend.close())


def _adapter(params: dict[str, torch.Tensor], policy: str) -> dict[str, torch.Tensor]:
    """The parameters of ``policy``'s adapter (peft names them ``...lora_A.POLICY.weight``)."""
    return {n: p for n, p in params.items() if "lora_" in n and f".{policy}." in n}


def _base(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: p for n, p in params.items() if "lora_" not in n}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


async def test_each_adapter_changes_only_from_its_own_policys_batch(two_policies: TinkerBackend) -> None:
    model = two_policies.service.trainer.model
    before = cpu_params(model)
    assert _adapter(before, "judge") and _adapter(before, "default")
    metrics = await two_policies.train_policy_step("judge", contrast_batch(two_policies), ALGO)
    after_judge = cpu_params(model)
    assert metrics["num_tokens"] > 0 and metrics["lr"] == pytest.approx(5e-2)
    assert not _same(_adapter(before, "judge"), _adapter(after_judge, "judge"))
    # The default policy had no data: its adapter is bitwise what it was, and so is the base.
    assert _same(_adapter(before, "default"), _adapter(after_judge, "default"))
    assert _same(_base(before), _base(after_judge))
    await two_policies.train_policy_step("default", contrast_batch(two_policies), ALGO)
    after_default = cpu_params(model)
    assert not _same(_adapter(after_judge, "default"), _adapter(after_default, "default"))
    assert _same(_adapter(after_judge, "judge"), _adapter(after_default, "judge"))


async def test_a_request_naming_a_policy_samples_with_its_adapter(two_policies: TinkerBackend) -> None:
    for _ in range(3):
        await two_policies.train_policy_step("judge", contrast_batch(two_policies), ALGO)
    version = await two_policies.sync_weights()
    service = two_policies.service
    assert {e.weight_version for e in service.engines.values()} == {version}
    client = openai.AsyncOpenAI(base_url=two_policies.inference_urls()[0], api_key="x")
    prompt = prompt_ids(two_policies, "apple")
    scores: dict[str, list[float]] = {}
    for model in ("judge", two_policies.served_model_name()):
        answer = await client.completions.create(
            model=model, prompt=prompt, max_tokens=1, temperature=0.0, logprobs=1
        )
        assert answer.model == model
        assert answer.choices[0].logprobs is not None
        scores[model] = list(answer.choices[0].logprobs.token_logprobs or [])
    # Trained toward "apple" after "say: apple", the judge's adapter scores its reply otherwise.
    assert scores["judge"] != scores[two_policies.served_model_name()]
    listed = await client.models.list()
    assert {m.id for m in listed.data} == {"judge", two_policies.served_model_name()}
    await client.close()


async def test_a_checkpoint_restores_every_adapter_bitwise(tiny_model_path: Path, tmp_path: Path) -> None:
    backend = await _two_policy_backend(tiny_model_path)
    try:
        for policy in ("judge", "default"):
            await backend.train_policy_step(policy, contrast_batch(backend), ALGO)
        await backend.sync_weights()
        saved = cpu_params(backend.service.trainer.model)
        await backend.save_checkpoint(tmp_path / "ckpt")
        assert (tmp_path / "ckpt" / "policies" / "judge" / "adapter_config.json").is_file()
        await backend.train_policy_step("judge", contrast_batch(backend), ALGO)
    finally:
        await backend.close()
    resumed = await _two_policy_backend(tiny_model_path)
    try:
        assert not _same(cpu_params(resumed.service.trainer.model), saved)  # fresh adapters differ
        await resumed.load_checkpoint(tmp_path / "ckpt")
        restored = cpu_params(resumed.service.trainer.model)
        for policy in ("judge", "default"):
            assert _same(_adapter(restored, policy), _adapter(saved, policy)), policy
        # Each sampler copy holds what its trainer's adapter was saved with.
        for policy, engine in resumed.service.engines.items():
            assert _same(_adapter(cpu_params(engine.model), policy), _adapter(saved, policy)), policy
    finally:
        await resumed.close()


async def test_the_lr_schedule_scales_each_policys_own_learning_rate(tiny_model_path: Path) -> None:
    # `rllm sft`'s schedule sets a factor (set_learning_rate_scale): every policy's optimizer
    # follows it from its own learning rate (default 1e-2, judge 5e-2), none from another's.
    backend = await _two_policy_backend(tiny_model_path, learning_rate=1e-2)
    try:
        assert backend.set_learning_rate_scale(0.5) == pytest.approx(5e-3)
        trainers = backend.service.trainers
        assert [g["lr"] for g in trainers["default"].optimizer.param_groups] == pytest.approx([5e-3])
        assert [g["lr"] for g in trainers["judge"].optimizer.param_groups] == pytest.approx([2.5e-2])
        metrics = await backend.train_policy_step("judge", contrast_batch(backend), ALGO)
        assert metrics["lr"] == pytest.approx(2.5e-2)
    finally:
        await backend.close()


def _as(policy: str, batch: list[TrainSequence]) -> list[TrainSequence]:
    return [msgspec.structs.replace(s, metadata={**s.metadata, "policy": policy}) for s in batch]


async def test_the_held_out_loss_scores_each_sequence_with_its_policys_adapter(
    two_policies: TinkerBackend,
) -> None:
    batch = contrast_batch(two_policies)
    await two_policies.train_policy_step("judge", batch, ALGO)  # the judge's adapter moved, not the default's
    as_default = await two_policies.eval_loss(_as("default", batch))
    as_judge = await two_policies.eval_loss(_as("judge", batch))
    untagged = await two_policies.eval_loss(contrast_batch(two_policies))
    assert as_judge["policy/judge/loss"] == as_judge["loss"] != as_default["loss"]
    assert untagged["loss"] == as_default["loss"] == as_default["policy/default/loss"]  # unset: the default
    mixed = await two_policies.eval_loss(_as("default", batch[:2]) + _as("judge", batch[2:]))
    assert {"policy/default/loss", "policy/judge/loss"} <= set(mixed)
    weighted = sum(mixed[f"policy/{p}/loss"] * mixed[f"policy/{p}/num_tokens"] for p in ("default", "judge"))
    assert mixed["loss"] == pytest.approx(weighted / mixed["num_tokens"])
    with pytest.raises(InputError, match="unknown policy 'jduge'"):
        await two_policies.eval_loss(_as("jduge", batch))


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        ({"lora": {"rank": 0}}, "lora.rank >= 1"),
        ({"lora": {"rank": 4}, "sampler_weights": "shared"}, "sampler_weights='copy'"),
    ],
)
def test_a_service_that_cannot_hold_several_adapters_refuses_them(options: dict, refused: str) -> None:
    backend = TinkerBackend({"model": "x", **options})
    with pytest.raises(ConfigError, match=refused):
        backend.use_policies(_policies())
