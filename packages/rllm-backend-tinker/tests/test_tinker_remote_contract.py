"""Contract tests of the remote service, end to end: our TinkerBackend(service="remote") drives
the REAL official ``tinker`` SDK (ServiceClient, TrainingClient, futures, protobuf/zstd
encoding, JWT auth) over REAL HTTP to FakeTinkerServer (rllm.testing.tinker), a loopback
stand-in for the paid Tinker service that validates and records what arrives on the wire and
trains a tiny bigram model with the documented losses. A live test runs when TINKER_API_KEY is set.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinker
import torch

from rllm.algos.config import AlgorithmConfig
from rllm.algos.losses import compute_policy_loss
from rllm.backends.tinker import TinkerBackend
from rllm.testing.tinker import FAKE_API_KEY, FakeTinkerServer
from rllm.tinker_api import make_custom_loss, plan_loss, to_datums
from rllm.types import FloatArray, TokenArray, TrainSequence

MODEL = "Qwen/Qwen3-4B-Instruct-2507"
INFERENCE_URL = "https://tinker.example/oai/api/v1"
AGGREGATIONS = [
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]


# The fake Tinker service (fake_tinker) and a clean TINKER_* environment come from conftest.py.
pytestmark = pytest.mark.usefixtures("no_tinker_env")


def _remote(server: FakeTinkerServer, **overrides: Any) -> TinkerBackend:
    remote = {"base_url": server.url, "api_key": FAKE_API_KEY, "inference_url": INFERENCE_URL}
    return TinkerBackend(
        {
            "service": "remote",
            "model": MODEL,
            "lora": {"rank": 8},
            "learning_rate": 3e-2,
            "remote": {**remote, **overrides.pop("remote", {})},
            **overrides,
        }
    )


@pytest.fixture
async def backend(fake_tinker: FakeTinkerServer) -> AsyncIterator[TinkerBackend]:
    backend = _remote(fake_tinker)
    await backend.start()
    yield backend
    await backend.close()


def _model_id(backend: TinkerBackend) -> str:
    return backend.service.training_client.model_id


def _wire(server: FakeTinkerServer, backend: TinkerBackend, name: str) -> list[Any]:
    """What reached the fake service for this backend's current training run."""
    return [b for b in server.bodies(name) if b.get("model_id") == _model_id(backend)]


def _batch(server: FakeTinkerServer, model_id: str, seed: int = 0) -> list[TrainSequence]:
    """Sequences as a sampler of the current remote policy would report them: sampler logprobs are
    the service model's own plus noise, so importance ratios sit near 1 and some leave the clip range."""
    rng = np.random.default_rng(seed)
    batch = []
    for prompt, response in [(4, 3), (2, 6), (5, 1)]:
        n = prompt + response
        tokens = rng.integers(0, 100, n).tolist()
        model_lp = np.array(server.model_logprobs(model_id, tokens))
        sampler = [0.0] * prompt + (model_lp + rng.normal(0.0, 0.3, n - 1))[prompt - 1 :].tolist()
        batch.append(
            TrainSequence(
                input_ids=TokenArray(tokens),
                loss_mask=FloatArray([0.0] * prompt + [1.0] * response),
                advantages=FloatArray([float(rng.normal())] * n),
                sampler_logprobs=FloatArray(sampler),
            )
        )
    return batch


def _padded(rows: list[list[float]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0.0] * (width - len(r)) for r in rows])


def _our_loss(
    batch: list[TrainSequence], current: list[list[float]], algo: AlgorithmConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """rllm.algos' loss on the service model's logprobs (shifted like the datums)."""
    return compute_policy_loss(
        _padded(current),
        _padded([list(s.sampler_logprobs)[1:] for s in batch]),
        _padded([list(s.advantages)[1:] for s in batch]),
        _padded([list(s.loss_mask)[1:] for s in batch]),
        algo,
    )


async def test_start_opens_a_session_and_a_lora_run(
    backend: TinkerBackend, fake_tinker: FakeTinkerServer
) -> None:
    model_id = _model_id(backend)
    (create,) = [b for b in fake_tinker.bodies("create_model") if model_id.startswith(b["session_id"])]
    assert create["base_model"] == MODEL and create["lora_config"]["rank"] == 8
    assert create["lora_config"]["seed"] == 0 and create["optimizer_config"] == {"type": "adamw"}
    # the first sampler checkpoint exists from the start, so agents can sample before any training
    assert backend.served_model_name() == f"tinker://{model_id}/sampler_weights/rllm-v0"
    assert backend.served_model_name() in fake_tinker.sampler_checkpoints
    assert backend.inference_urls() == [INFERENCE_URL]
    assert backend.tokenizer_path() == MODEL  # get_info's tokenizer_id
    assert fake_tinker.violations == []


async def test_datums_on_the_wire_are_shifted_and_typed(
    backend: TinkerBackend, fake_tinker: FakeTinkerServer
) -> None:
    batch = _batch(fake_tinker, _model_id(backend))
    await backend.train_step(batch, AlgorithmConfig(loss="ppo_clip", aggregation="token-sum"))
    (request,) = _wire(fake_tinker, backend, "forward_backward")
    assert request["content_encoding"] == "zstd" and request["forward_only"] is False
    assert request["loss_fn"] == "ppo"
    assert request["loss_fn_config"] == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    for seq, datum in zip(batch, request["data"], strict=True):
        tokens = list(seq.input_ids)
        assert datum["model_input"] == tokens[:-1] and datum["target_tokens"] == tokens[1:]
        assert np.allclose(datum["logprobs"], list(seq.sampler_logprobs)[1:])
        # token-sum: a prompt token's advantage is 0, a trained token keeps its own
        expected = np.array(list(seq.advantages)[1:]) * np.array(list(seq.loss_mask)[1:])
        assert np.allclose(datum["advantages"], expected)
    assert fake_tinker.violations == []


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("loss", ["ppo_clip", "importance_sampling", "cross_entropy"])
async def test_builtin_losses_on_the_service_equal_our_aggregated_loss(
    loss: str, aggregation: str, backend: TinkerBackend, fake_tinker: FakeTinkerServer
) -> None:
    """Tinker's built-ins sum over tokens; our per-token scaling must make that sum equal to
    rllm.algos' aggregated loss, computed here on the same (pre-update) model logprobs."""
    model_id = _model_id(backend)
    batch = _batch(fake_tinker, model_id, seed=1)
    current = [fake_tinker.model_logprobs(model_id, list(s.input_ids)) for s in batch]
    algo = AlgorithmConfig(loss=loss, aggregation=aggregation, clip_low=0.1, clip_high=0.3)
    metrics = await backend.train_step(batch, algo)
    ours, _ = _our_loss(batch, current, algo)
    assert metrics["tinker/loss:sum"] == pytest.approx(float(ours), rel=1e-4, abs=1e-6)
    (request,) = _wire(fake_tinker, backend, "forward_backward")
    assert request["loss_fn"] == plan_loss(algo).loss_fn
    assert fake_tinker.violations == []


@pytest.mark.parametrize("loss", ["cispo", "gspo"])
async def test_other_builtins_send_their_name_and_clip_thresholds(
    loss: str, backend: TinkerBackend, fake_tinker: FakeTinkerServer
) -> None:
    batch = _batch(fake_tinker, _model_id(backend), seed=2)
    metrics = await backend.train_step(batch, AlgorithmConfig(loss=loss, clip_low=0.2, clip_high=0.28))
    (request,) = _wire(fake_tinker, backend, "forward_backward")
    assert request["loss_fn"] == loss
    assert request["loss_fn_config"] == pytest.approx(
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
    )
    assert np.isfinite(metrics["tinker/loss:sum"]) and fake_tinker.violations == []


async def test_dual_clip_runs_our_loss_through_forward_backward_custom(
    backend: TinkerBackend, fake_tinker: FakeTinkerServer
) -> None:
    """No built-in twin: the SDK runs a forward pass, our rllm.algos loss on the returned
    logprobs, then a cross_entropy backward with weights = -dLoss/dlogprob."""
    model_id = _model_id(backend)
    batch = _batch(fake_tinker, model_id, seed=3)
    algo = AlgorithmConfig(loss="dual_clip", dual_clip_c=2.0, aggregation="seq-mean-token-mean")
    current = [fake_tinker.model_logprobs(model_id, list(s.input_ids)) for s in batch]
    metrics = await backend.train_step(batch, algo)

    forward, backward = _wire(fake_tinker, backend, "forward_backward")
    assert (forward["loss_fn"], forward["forward_only"]) == ("cross_entropy", True)
    assert (backward["loss_fn"], backward["forward_only"]) == ("cross_entropy", False)
    assert forward["seq_id"] + 1 == backward["seq_id"]
    # what we compute locally on the service's logprobs is what the service is asked to backprop
    datums = to_datums(batch, algo, plan_loss(algo), tinker.types)
    logprobs = [torch.tensor(lp, requires_grad=True) for lp in current]
    loss, our_metrics = make_custom_loss(algo, batch)(datums, logprobs)
    loss.backward()
    for seq, fwd, bwd, lp in zip(batch, forward["data"], backward["data"], logprobs, strict=True):
        assert set(fwd) == {"model_input", "target_tokens", "weights"}  # only these leave the client
        assert fwd["weights"] == list(seq.loss_mask)[1:]
        assert np.allclose(bwd["weights"], (-lp.grad).tolist(), atol=1e-6)
        assert all(w == 0 for w, m in zip(bwd["weights"], list(seq.loss_mask)[1:], strict=True) if m == 0)
    assert metrics["tinker/loss:sum"] == pytest.approx(float(loss.detach()), rel=1e-5)
    assert all(f"tinker/{k}" in metrics for k in our_metrics)
    assert fake_tinker.violations == []


async def test_optim_steps_use_our_adamw_settings_in_seq_order(fake_tinker: FakeTinkerServer) -> None:
    backend = _remote(
        fake_tinker,
        mini_batches=2,
        ppo_epochs=2,
        grad_clip=0.5,
        weight_decay=0.01,
        betas=(0.8, 0.95),
        eps=1e-6,
    )
    await backend.start()
    try:
        model_id = _model_id(backend)
        before = fake_tinker.models[model_id].logits.detach().clone()
        metrics = await backend.train_step(_batch(fake_tinker, model_id, seed=4), AlgorithmConfig())
        assert metrics["optimizer_steps"] == 4.0 and metrics["num_sequences"] == 3.0
        steps = _wire(fake_tinker, backend, "optim_step")
        assert len(steps) == 4 and len(_wire(fake_tinker, backend, "forward_backward")) == 4
        assert steps[0]["adam_params"] == pytest.approx(
            {
                "learning_rate": 3e-2,
                "beta1": 0.8,
                "beta2": 0.95,
                "eps": 1e-6,
                "weight_decay": 0.01,
                "grad_clip_norm": 0.5,
            }
        )
        model = fake_tinker.models[model_id]
        # forward_backward, optim_step alternate, and every request ran in seq_id order
        assert model.seq_ids == list(range(1, len(model.seq_ids) + 1)) and model.optimizer_steps == 4
        assert not torch.equal(before, model.logits.detach())
        assert "tinker/optim/grad_norm" in metrics
    finally:
        await backend.close()
    assert fake_tinker.violations == []


async def test_sync_weights_changes_the_served_model_name(
    backend: TinkerBackend, fake_tinker: FakeTinkerServer
) -> None:
    """The Trainer must re-read served_model_name() after each sync: it names the new checkpoint."""
    model_id = _model_id(backend)
    first = backend.served_model_name()
    await backend.train_step(
        _batch(fake_tinker, model_id, seed=5), AlgorithmConfig(loss="importance_sampling")
    )
    assert await backend.sync_weights() == 1
    served = backend.served_model_name()
    assert served == f"tinker://{model_id}/sampler_weights/rllm-v1" != first
    saved = fake_tinker.sampler_checkpoints[served]
    assert torch.equal(saved, fake_tinker.models[model_id].logits.detach())
    assert not torch.equal(saved, fake_tinker.sampler_checkpoints[first])
    assert await backend.sync_weights() == 2 and backend.served_model_name().endswith("rllm-v2")


async def test_checkpoint_round_trip_restores_weights_and_adam_state(
    backend: TinkerBackend, fake_tinker: FakeTinkerServer, tmp_path: Path
) -> None:
    old_id = _model_id(backend)
    algo = AlgorithmConfig(loss="importance_sampling")
    await backend.train_step(_batch(fake_tinker, old_id, seed=6), algo)
    await backend.sync_weights()
    await backend.save_checkpoint(tmp_path / "ckpt")
    saved = fake_tinker.models[old_id]
    saved_logits = saved.logits.detach().clone()
    saved_moments = saved.optimizer.state[saved.logits]["exp_avg"].clone()
    await backend.train_step(_batch(fake_tinker, old_id, seed=7), algo)  # drift past the checkpoint

    await backend.load_checkpoint(tmp_path / "ckpt")
    new_id = _model_id(backend)
    assert new_id != old_id  # a new training run continues from the saved state
    (load,) = [
        b
        for b in fake_tinker.bodies("load_weights")
        if new_id == f"{b['session_id']}:train:{b['model_seq_id']}"
    ]
    assert load["optimizer"] is True and load["path"] == f"tinker://{old_id}/weights/rllm-state-v1-s1"
    restored = fake_tinker.models[new_id]
    assert torch.equal(restored.logits.detach(), saved_logits)
    assert torch.equal(restored.optimizer.state[restored.logits]["exp_avg"], saved_moments)
    assert backend.service.weight_version == 1
    assert backend.served_model_name() == f"tinker://{new_id}/sampler_weights/rllm-v1"
    metrics = await backend.train_step(_batch(fake_tinker, new_id, seed=8), algo)
    assert metrics["optimizer_steps"] == 1.0 and restored.seq_ids[0] == 1
    assert fake_tinker.violations == []


async def test_checkpoint_errors_name_the_problem(backend: TinkerBackend, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a remote tinker checkpoint"):
        await backend.load_checkpoint(tmp_path / "missing")
    await backend.save_checkpoint(tmp_path / "ckpt")
    state = tmp_path / "ckpt" / "tinker_remote_state.json"
    saved = state.read_text()
    state.write_text(saved.replace(MODEL, "other/model"))
    with pytest.raises(ValueError, match="other/model"):
        await backend.load_checkpoint(tmp_path / "ckpt")
    # a failure the service reports on the future reaches the caller through the SDK
    state.write_text(saved.replace("/weights/", "/weights/gone-"))
    with pytest.raises(tinker.RequestFailedError, match="no training checkpoint"):
        await backend.load_checkpoint(tmp_path / "ckpt")


async def test_validate_refusals_stop_before_the_network(
    backend: TinkerBackend, fake_tinker: FakeTinkerServer
) -> None:
    for algo, option in [
        (AlgorithmConfig(kl_coef=0.1), "kl_coef"),
        (AlgorithmConfig(entropy_coef=0.01), "entropy_coef"),
        (AlgorithmConfig(tis="token"), "tis"),
    ]:
        with pytest.raises(ValueError, match=option):
            backend.validate(algo)
        with pytest.raises(ValueError, match=option):
            await backend.train_step(_batch(fake_tinker, _model_id(backend)), algo)
    assert _wire(fake_tinker, backend, "forward_backward") == []


async def test_close_finishes_the_session(fake_tinker: FakeTinkerServer) -> None:
    backend = _remote(fake_tinker)
    await backend.start()
    session_id = _model_id(backend).split(":")[0]
    await backend.close()
    assert fake_tinker.sessions[session_id]["finished"] == "success"


async def test_a_rejected_api_key_fails_start_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeTinkerServer() as server:  # its own server: the rejection is recorded as a violation
        backend = _remote(server, remote={"api_key": "tml-wrong-key"})
        with pytest.raises(tinker.AuthenticationError):
            await backend.start()
        await backend.close()
        assert server.violations == ["/api/v1/client/config: bad credential"]
        monkeypatch.delenv("TINKER_API_KEY", raising=False)
        with pytest.raises(ValueError, match="API key"):
            await _remote(server, remote={"api_key": ""}).start()


@pytest.mark.live
@pytest.mark.skipif(not os.environ.get("TINKER_API_KEY"), reason="needs TINKER_API_KEY (live Tinker service)")
async def test_live_remote_train_step() -> None:
    model = os.environ.get("TINKER_TEST_MODEL", MODEL)
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
        rng = np.random.default_rng(0)
        batch = [
            TrainSequence(
                input_ids=TokenArray(rng.integers(100, 1000, 8).tolist()),
                loss_mask=FloatArray([0.0] * 4 + [1.0] * 4),
                advantages=FloatArray([1.0] * 8),
                sampler_logprobs=FloatArray([0.0] * 4 + [-1.0] * 4),
            )
        ]
        metrics = await backend.train_step(batch, algo)
        assert metrics["optimizer_steps"] == 1.0
        first = backend.served_model_name()
        assert await backend.sync_weights() == 1 and backend.served_model_name() != first
    finally:
        await backend.close()
