"""Contract tests of the remote service: our batches become the SDK's real types
(tinker.types.Datum / ModelInput / TensorData / AdamParams); only the network is faked, by
FakeTinkerServiceClient below. A live test runs when TINKER_API_KEY is set."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from tinker import types

from rllm.algos.config import AlgorithmConfig
from rllm.algos.losses import compute_policy_loss
from rllm.backends.tinker import TinkerBackend, TinkerBackendConfig, parse_config
from rllm.backends.tinker.remote.custom_loss import make_custom_loss
from rllm.backends.tinker.remote.datums import to_datums
from rllm.backends.tinker.remote.losses import plan_loss
from rllm.backends.tinker.remote.service import RemoteService
from rllm.engine.backend import TrainSequence
from rllm.types import FloatArray, TokenArray


def _sequence(rng: np.random.Generator, prompt: int, response: int) -> TrainSequence:
    n = prompt + response
    return TrainSequence(
        tokens=TokenArray(rng.integers(0, 100, n).tolist()),
        loss_mask=FloatArray([0.0] * prompt + [1.0] * response),
        advantages=FloatArray([float(rng.normal())] * n),
        sampler_logprobs=FloatArray([0.0] * prompt + (-rng.random(response) * 3).tolist()),
    )


def _batch(seed: int = 0) -> list[TrainSequence]:
    rng = np.random.default_rng(seed)
    return [_sequence(rng, 4, 3), _sequence(rng, 2, 6), _sequence(rng, 5, 1)]


def _remote_config(**overrides: Any) -> TinkerBackendConfig:
    return parse_config(
        {
            "service": "remote",
            "model": "Qwen/Qwen3-4B-Instruct-2507",
            "lora": {"rank": 8},
            "learning_rate": 3e-5,
            "remote": {"inference_url": "https://tinker.example/oai/api/v1"},
            **overrides,
        }
    )


def test_datums_are_shifted_and_typed() -> None:
    batch = _batch()
    algo = AlgorithmConfig(loss="ppo_clip", aggregation="token-sum")
    datums = to_datums(batch, algo, plan_loss(algo))
    for seq, datum in zip(batch, datums, strict=True):
        assert isinstance(datum, types.Datum) and isinstance(datum.model_input, types.ModelInput)
        tokens = list(seq.tokens)
        assert datum.model_input.to_ints() == tokens[:-1]
        inputs = datum.loss_fn_inputs
        assert set(inputs) == {"target_tokens", "logprobs", "advantages"}
        assert all(isinstance(v, types.TensorData) for v in inputs.values())
        assert inputs["target_tokens"].dtype == "int64" and inputs["target_tokens"].data == tokens[1:]
        assert inputs["logprobs"].dtype == "float32"
        assert np.allclose(inputs["logprobs"].data, list(seq.sampler_logprobs)[1:])
        # token-sum: the advantage of a masked (prompt) token is 0, trained tokens keep theirs
        expected = np.array(list(seq.advantages)[1:]) * np.array(list(seq.loss_mask)[1:])
        assert np.allclose(inputs["advantages"].data, expected)


def _tinker_builtin_loss(
    name: str, datums: list[types.Datum], logprobs: list[torch.Tensor], cfg: dict
) -> torch.Tensor:
    """Tinker's documented built-in losses, summed over tokens of all datums (the server's side)."""
    total = torch.zeros(())
    for datum, lp in zip(datums, logprobs, strict=True):
        adv = datum.loss_fn_inputs["advantages"].to_torch()
        ratio = torch.exp(lp - datum.loss_fn_inputs["logprobs"].to_torch())
        if name == "importance_sampling":
            total = total - (ratio * adv).sum()
        else:  # ppo
            clipped = torch.clamp(ratio, cfg["clip_low_threshold"], cfg["clip_high_threshold"])
            total = total - torch.minimum(ratio * adv, clipped * adv).sum()
    return total


@pytest.mark.parametrize(
    "aggregation",
    ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"],
)
@pytest.mark.parametrize("loss", ["ppo_clip", "importance_sampling"])
def test_builtin_losses_reproduce_our_aggregated_loss(loss: str, aggregation: str) -> None:
    batch = _batch(1)
    algo = AlgorithmConfig(loss=loss, aggregation=aggregation, clip_low=0.1, clip_high=0.3)
    plan = plan_loss(algo)
    assert plan.loss_fn == {"ppo_clip": "ppo", "importance_sampling": "importance_sampling"}[loss]
    datums = to_datums(batch, algo, plan)
    rng = torch.Generator().manual_seed(0)
    # current-policy logprobs near the sampler's, so some ratios leave the clip range
    current = [
        d.loss_fn_inputs["logprobs"].to_torch() + 0.4 * torch.randn(d.model_input.length, generator=rng)
        for d in datums
    ]
    theirs = _tinker_builtin_loss(plan.loss_fn, datums, current, plan.loss_fn_config or {})
    width = max(len(s.tokens) - 1 for s in batch)

    def pad(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])

    mask = pad([torch.tensor(list(s.loss_mask)[1:]) for s in batch])
    ours, _ = compute_policy_loss(
        pad(current),
        pad([torch.tensor(list(s.sampler_logprobs)[1:]) for s in batch]),
        pad([torch.tensor(list(s.advantages)[1:]) for s in batch]),
        mask,
        algo,
    )
    assert float(theirs) == pytest.approx(float(ours), rel=1e-5, abs=1e-6)


def test_cross_entropy_uses_weights_and_dual_clip_goes_custom() -> None:
    batch = _batch(2)
    algo = AlgorithmConfig(loss="cross_entropy", aggregation="token-sum")
    datums = to_datums(batch, algo, plan_loss(algo))
    assert set(datums[0].loss_fn_inputs) == {"target_tokens", "weights"}
    assert datums[0].loss_fn_inputs["weights"].data == list(batch[0].loss_mask)[1:]
    assert plan_loss(AlgorithmConfig(loss="dual_clip")).loss_fn == "custom"
    assert plan_loss(AlgorithmConfig(loss="gspo")).loss_fn == "gspo"
    assert plan_loss(AlgorithmConfig(loss="cispo")).loss_fn_config == pytest.approx(
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    )


def test_custom_loss_runs_rllm_algos_on_tinker_logprobs() -> None:
    batch = _batch(3)
    algo = AlgorithmConfig(loss="dual_clip", dual_clip_c=2.0)
    datums = to_datums(batch, algo, plan_loss(algo))
    # what the SDK hands a custom loss: one leaf tensor with gradient per datum
    logprobs = [(d.loss_fn_inputs["logprobs"].to_torch() - 0.3).requires_grad_(True) for d in datums]
    loss, metrics = make_custom_loss(algo)(datums, logprobs)
    loss.backward()
    assert all(lp.grad is not None and lp.grad.shape == lp.shape for lp in logprobs)
    for datum, lp in zip(datums, logprobs, strict=True):  # prompt tokens get no gradient
        masked = datum.loss_fn_inputs["weights"].to_torch() == 0
        assert torch.all(lp.grad[masked] == 0)
    assert "clip_frac_lower" in metrics and np.isfinite(float(loss.detach()))


class FakeTinkerServiceClient:
    """A FAKE of the network side of tinker.ServiceClient / TrainingClient: it records the SDK
    types it is given and answers like the service would, without any HTTP."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.saved = 0

    # ServiceClient
    def create_lora_training_client(self, base_model: str, rank: int, seed: int) -> FakeTinkerServiceClient:
        self.calls.append(("create_lora_training_client", (base_model, rank, seed)))
        return self

    def create_training_client_from_state_with_optimizer(self, path: str) -> FakeTinkerServiceClient:
        self.calls.append(("create_training_client_from_state_with_optimizer", path))
        return self

    # TrainingClient
    def forward_backward(self, data: list[types.Datum], loss_fn: str, loss_fn_config: dict | None) -> Any:
        assert all(isinstance(d, types.Datum) for d in data)
        self.calls.append(("forward_backward", (data, loss_fn, loss_fn_config)))
        return SimpleNamespace(metrics={"loss:sum": -0.5})

    def forward_backward_custom(self, data: list[types.Datum], loss_fn: Any) -> Any:
        logprobs = [d.loss_fn_inputs["logprobs"].to_torch().clone().requires_grad_(True) for d in data]
        loss, _metrics = loss_fn(data, logprobs)
        loss.backward()
        self.calls.append(("forward_backward_custom", data))
        return SimpleNamespace(metrics={"loss:sum": float(loss.detach())})

    def optim_step(self, params: types.AdamParams) -> Any:
        assert isinstance(params, types.AdamParams)
        self.calls.append(("optim_step", params))
        return SimpleNamespace()

    def save_weights_for_sampler(self, name: str) -> Any:
        self.saved += 1
        self.calls.append(("save_weights_for_sampler", name))
        return SimpleNamespace(path=f"tinker://run-1/sampler_weights/{name}")

    def save_state(self, name: str) -> Any:
        self.calls.append(("save_state", name))
        return SimpleNamespace(path=f"tinker://run-1/weights/{name}")


async def test_remote_service_drives_the_sdk(tmp_path: Path) -> None:
    fake = FakeTinkerServiceClient()
    service = RemoteService(_remote_config(mini_batches=2, grad_clip=0.5), client_factory=lambda cfg: fake)
    await service.start()
    assert fake.calls[0] == ("create_lora_training_client", ("Qwen/Qwen3-4B-Instruct-2507", 8, 0))
    assert service.served_model_name() == "tinker://run-1/sampler_weights/rllm-v0"
    assert service.inference_urls() == ["https://tinker.example/oai/api/v1"]
    metrics = await service.train_step(_batch(), AlgorithmConfig(loss="ppo_clip"))
    kinds = [name for name, _ in fake.calls]
    assert kinds.count("forward_backward") == 2 and kinds.count("optim_step") == 2
    assert metrics["optimizer_steps"] == 2.0 and metrics["tinker/loss:sum"] == -0.5
    adam = next(arg for name, arg in fake.calls if name == "optim_step")
    assert (adam.learning_rate, adam.grad_clip_norm, adam.beta1) == (3e-5, 0.5, 0.9)
    _, loss_fn, loss_cfg = next(arg for name, arg in fake.calls if name == "forward_backward")
    assert loss_fn == "ppo" and loss_cfg == pytest.approx(
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    )
    await service.train_step(_batch(), AlgorithmConfig(loss="dual_clip"))
    assert "forward_backward_custom" in [name for name, _ in fake.calls]
    assert await service.sync_weights() == 1
    assert service.served_model_name().endswith("rllm-v1")
    await service.save_checkpoint(tmp_path / "ckpt")
    await service.load_checkpoint(tmp_path / "ckpt")
    assert (
        "create_training_client_from_state_with_optimizer",
        "tinker://run-1/weights/rllm-state-v1",
    ) in fake.calls
    assert service.weight_version == 1


@pytest.mark.live
@pytest.mark.skipif(not os.environ.get("TINKER_API_KEY"), reason="needs TINKER_API_KEY (live Tinker service)")
async def test_live_remote_train_step() -> None:
    model = os.environ.get("TINKER_TEST_MODEL", "Qwen/Qwen3-4B-Instruct-2507")
    url = os.environ.get(
        "TINKER_OAI_URL", "https://tinker.thinkingmachines.dev/services/tinker-prod/oai/api/v1"
    )
    backend = TinkerBackend(
        {
            "service": "remote",
            "model": model,
            "lora": {"rank": 8},
            "learning_rate": 1e-5,
            "remote": {"inference_url": url},
        }
    )
    algo = AlgorithmConfig(loss="importance_sampling")
    backend.validate(algo)
    await backend.start()
    try:
        metrics = await backend.train_step(_batch(), algo)
        assert metrics["optimizer_steps"] == 1.0
        assert await backend.sync_weights() == 1
    finally:
        await backend.close()
