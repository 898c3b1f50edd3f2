"""Several policies on the remote service: one Tinker training client per policy, driven through
the REAL official ``tinker`` SDK over REAL HTTP to FakeTinkerServer (rllm.testing.tinker, a
loopback stand-in for the paid service that records what reaches it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import torch

from rllm.algos.adapters import LoraConfig
from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.engine.training.policies import PolicySection, publish_policy_models
from rllm.gateway import GatewayConfig, GatewayServer
from rllm.gateway.policy_routes import route_policy
from rllm.testing.tinker import FAKE_API_KEY, FakeTinkerServer
from rllm.types import ConfigError, FloatArray, TokenArray, TrainSequence
from rllm.types.errors import InputError

MODEL = "Qwen/Qwen3-4B-Instruct-2507"
INFERENCE_URL = "https://tinker.example/oai/api/v1"


# The fake Tinker service (fake_tinker) and a clean TINKER_* environment come from conftest.py.
pytestmark = pytest.mark.usefixtures("no_tinker_env")


def _remote(server: FakeTinkerServer) -> TinkerBackend:
    backend = TinkerBackend(
        {
            "service": "remote",
            "model": MODEL,
            "lora": {"rank": 8},
            "learning_rate": 3e-2,
            "remote": {"base_url": server.url, "api_key": FAKE_API_KEY, "inference_url": INFERENCE_URL},
        }
    )
    backend.use_policies(
        {"judge": PolicySection(lora=LoraConfig(rank=4), learning_rate=5e-3, weight_decay=0.1)}
    )
    return backend


@pytest.fixture
async def backend(fake_tinker: FakeTinkerServer) -> AsyncIterator[TinkerBackend]:
    backend = _remote(fake_tinker)
    await backend.start()
    yield backend
    await backend.close()


def _ids(backend: TinkerBackend) -> dict[str, str]:
    return {name: run.training_client.model_id for name, run in backend.service.runs.items()}  # pyright: ignore[reportAttributeAccessIssue]


def _batch(first_token: int, rows: int = 2) -> list[TrainSequence]:
    """Sequences whose first token tells whose they are (the fake records every datum)."""
    rng = np.random.default_rng(first_token)
    return [
        TrainSequence(
            input_ids=TokenArray([first_token, *rng.integers(0, 100, 5).tolist()]),
            loss_mask=FloatArray([0.0, 0.0, 1.0, 1.0, 1.0, 1.0]),
            advantages=FloatArray([float(rng.normal())] * 6),
            sampler_logprobs=FloatArray([0.0, 0.0, -4.6, -4.6, -4.6, -4.6]),
        )
        for _ in range(rows)
    ]


def _first_tokens(server: FakeTinkerServer, model_id: str, endpoint: str) -> list[int]:
    return [
        datum["model_input"][0]
        for body in server.bodies(endpoint)
        if body.get("model_id") == model_id
        for datum in body["data"]
    ]


async def test_each_policy_has_its_own_training_client_rank_and_sampler(
    backend: TinkerBackend, fake_tinker: FakeTinkerServer
) -> None:
    ids = _ids(backend)
    assert set(ids) == {"default", "judge"} and ids["default"] != ids["judge"]
    ranks = {
        b["lora_config"]["rank"]
        for b in fake_tinker.bodies("create_model")
        if any(i.startswith(b["session_id"]) for i in ids.values())
    }
    assert ranks == {8, 4}
    names = backend.policy_model_names()
    assert names == {
        "default": f"tinker://{ids['default']}/sampler_weights/rllm-v0",
        "judge": f"tinker://{ids['judge']}/sampler_weights/rllm-judge-v0",
    }
    assert names["default"] == backend.served_model_name()
    assert all(name in fake_tinker.sampler_checkpoints for name in names.values())


async def test_a_step_trains_each_client_on_its_own_policys_sequences_only(
    backend: TinkerBackend, fake_tinker: FakeTinkerServer
) -> None:
    ids = _ids(backend)
    before = {p: fake_tinker.models[i].logits.detach().clone() for p, i in ids.items()}
    algo = AlgorithmConfig(loss="importance_sampling")
    await backend.train_policy_step("judge", _batch(7, rows=3), algo)
    # Only the judge's run moved: the default's got no request and kept its weights.
    assert _first_tokens(fake_tinker, ids["judge"], "forward_backward") == [7, 7, 7]
    assert _first_tokens(fake_tinker, ids["default"], "forward_backward") == []
    assert torch.equal(fake_tinker.models[ids["default"]].logits.detach(), before["default"])
    assert not torch.equal(fake_tinker.models[ids["judge"]].logits.detach(), before["judge"])
    await backend.train_policy_step("default", _batch(3), algo)
    assert _first_tokens(fake_tinker, ids["default"], "forward_backward") == [3, 3]
    assert _first_tokens(fake_tinker, ids["judge"], "forward_backward") == [7, 7, 7]
    # each optim_step carries its own policy's optimizer settings
    (judge_step,) = [b for b in fake_tinker.bodies("optim_step") if b.get("model_id") == ids["judge"]]
    (default_step,) = [b for b in fake_tinker.bodies("optim_step") if b.get("model_id") == ids["default"]]
    assert judge_step["adam_params"]["learning_rate"] == pytest.approx(5e-3)
    assert judge_step["adam_params"]["weight_decay"] == pytest.approx(0.1)
    assert default_step["adam_params"]["learning_rate"] == pytest.approx(3e-2)
    with pytest.raises(InputError, match="unknown policy 'jduge'"):
        await backend.train_policy_step("jduge", _batch(3), algo)
    assert fake_tinker.violations == []


async def test_sync_saves_every_policys_sampler_under_its_own_name(
    backend: TinkerBackend, fake_tinker: FakeTinkerServer
) -> None:
    ids = _ids(backend)
    await backend.train_policy_step("judge", _batch(5), AlgorithmConfig(loss="importance_sampling"))
    assert await backend.sync_weights() == 1
    names = backend.policy_model_names()
    assert names["judge"] == f"tinker://{ids['judge']}/sampler_weights/rllm-judge-v1"
    assert names["default"] == f"tinker://{ids['default']}/sampler_weights/rllm-v1"
    for policy, name in names.items():
        assert torch.equal(
            fake_tinker.sampler_checkpoints[name], fake_tinker.models[ids[policy]].logits.detach()
        )


async def test_after_a_sync_the_gateway_routes_each_role_to_its_policys_new_sampler(
    backend: TinkerBackend,
) -> None:
    """The trainer's publish_policy_models after a sync: the real gateway's routes follow the
    renamed sampler checkpoints (its config was built from the names before the sync)."""
    config = GatewayConfig(
        upstreams=["http://127.0.0.1:1/v1"],
        health_interval_s=0,
        policies=backend.policy_model_names(),
        roles={"judge": "judge"},
    )
    async with GatewayServer(config) as gateway:
        await backend.sync_weights()
        await publish_policy_models({"judge": PolicySection()}, backend, gateway.local_client())
        names = backend.policy_model_names()
        for role, policy in (("judge", "judge"), ("solver", "default")):
            body: dict[str, object] = {"model": "anything"}
            assert route_policy(gateway.config.policies, gateway.config.roles, role, body) == policy
            assert body["model"] == names[policy] and str(body["model"]).endswith("-v1")


async def test_checkpoint_restores_every_policys_state(
    backend: TinkerBackend, fake_tinker: FakeTinkerServer, tmp_path: Path
) -> None:
    algo = AlgorithmConfig(loss="importance_sampling")
    await backend.train_policy_step("judge", _batch(5), algo)
    await backend.train_policy_step("default", _batch(6), algo)
    await backend.sync_weights()
    await backend.save_checkpoint(tmp_path / "ckpt")
    old = _ids(backend)
    saved = {p: fake_tinker.models[i].logits.detach().clone() for p, i in old.items()}
    await backend.train_policy_step("judge", _batch(8), algo)  # drift past the checkpoint

    await backend.load_checkpoint(tmp_path / "ckpt")
    new = _ids(backend)
    assert set(new.values()).isdisjoint(old.values())
    for policy, model_id in new.items():
        assert torch.equal(fake_tinker.models[model_id].logits.detach(), saved[policy])
    assert backend.policy_model_names()["judge"] == f"tinker://{new['judge']}/sampler_weights/rllm-judge-v1"

    other = TinkerBackend(backend.config)  # the same run without the judge policy
    await other.start()
    try:
        with pytest.raises(InputError, match="holds policies default, judge, the run has default"):
            await other.load_checkpoint(tmp_path / "ckpt")
    finally:
        await other.close()
    assert fake_tinker.violations == []


def test_a_policy_lora_target_tinker_cannot_honour_is_refused(fake_tinker: FakeTinkerServer) -> None:
    with pytest.raises(ConfigError, match=r"policies\.judge\.lora\.target_modules"):
        TinkerBackend(
            {
                "service": "remote",
                "model": MODEL,
                "lora": {"rank": 8},
                "remote": {"inference_url": INFERENCE_URL},
            }
        ).use_policies({"judge": PolicySection(lora=LoraConfig(rank=4, target_modules=["q_proj"]))})
