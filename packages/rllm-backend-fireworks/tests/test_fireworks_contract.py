"""Contract tests, end to end: FireworksBackend drives the REAL official ``fireworks-ai`` training
SDK (TrainerJobManager, DeploymentManager, FiretitanServiceClient / TrainingClient, WeightSyncer,
futures, retries) over REAL HTTP to FakeFireworksServer, a loopback stand-in for the paid service
that validates and records what arrives and trains a tiny torch bigram model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from fireworks.training.sdk import APIStatusError, RequestFailedError, TrainingAPIError
from fireworks_helpers import MODEL, options
from openai import AsyncOpenAI, BadRequestError

from rllm.algos.config import AlgorithmConfig
from rllm.algos.losses import compute_policy_loss
from rllm.backends.fireworks import FireworksBackend
from rllm.testing.fireworks import ACCOUNT, FakeFireworksServer
from rllm.types import FloatArray, TokenArray, TrainSequence


def _sequence(tokens: list[int], prompt_len: int, advantage: float, seed: int) -> TrainSequence:
    rng = np.random.default_rng(seed)
    n = len(tokens)
    mask = np.array([0.0] * prompt_len + [1.0] * (n - prompt_len), dtype=np.float32)
    logprobs = np.where(mask > 0, -rng.uniform(0.5, 3.0, n), 0.0).astype(np.float32)
    return TrainSequence(
        input_ids=TokenArray(np.array(tokens, dtype=np.int32)),
        loss_mask=FloatArray(mask),
        advantages=FloatArray(mask * advantage),
        sampler_logprobs=FloatArray(logprobs),
    )


BATCH = [
    _sequence([1, 5, 9, 12, 3, 7], 2, 1.0, 0),
    _sequence([2, 4, 8, 16, 32, 64, 100, 1], 3, -0.5, 1),
    _sequence([7, 7, 3, 9], 1, 0.25, 2),
]


def _model(server: FakeFireworksServer, backend: FireworksBackend):
    return server.models[backend.training_client.model_id]


def _expected_gradient(
    logits: torch.Tensor, batch: list[TrainSequence], algo: AlgorithmConfig
) -> torch.Tensor:
    """rllm.algos' loss on the same datums, differentiated locally with torch."""
    table = logits.clone().requires_grad_(True)
    width = max(len(s.input_ids) for s in batch) - 1

    def padded(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])

    lps, masks, advs, olds = [], [], [], []
    for seq in batch:
        tokens = torch.from_numpy(np.frombuffer(seq.input_ids, dtype=np.int32).astype(np.int64))
        lps.append(torch.log_softmax(table[tokens[:-1]], -1).gather(-1, tokens[1:, None]).squeeze(-1))
        masks.append(torch.from_numpy(np.frombuffer(seq.loss_mask, dtype=np.float32)[1:].copy()))
        advs.append(torch.from_numpy(np.frombuffer(seq.advantages, dtype=np.float32)[1:].copy()))
        olds.append(torch.from_numpy(np.frombuffer(seq.sampler_logprobs, dtype=np.float32)[1:].copy()))
    old = padded(olds)
    loss, _ = compute_policy_loss(padded(lps), old, padded(advs), padded(masks), algo, sampler_logprobs=old)
    loss.backward()
    assert table.grad is not None
    return table.grad


async def test_start_creates_trainer_job_and_hot_load_deployment(fake_fireworks: FakeFireworksServer) -> None:
    backend = FireworksBackend(options(fake_fireworks, region="US_VIRGINIA_1"))
    await backend.start()
    res = backend.resources
    assert res is not None and res.created_job and res.created_deployment
    job = fake_fireworks.jobs[res.job_id].body
    assert job["trainingConfig"]["baseModel"] == MODEL and job["trainingConfig"]["loraRank"] == 8
    assert job["trainingConfig"]["region"] == "US_VIRGINIA_1"
    deployment = fake_fireworks.deployments[res.deployment_id]
    assert deployment["hotLoadTrainerJob"] == res.job_name and deployment["hotLoadTransitionType"] == "SYNC"
    # Version 0 (the trainer's initial weights) is on the deployment before any rollout.
    assert fake_fireworks.hotloaded[res.deployment_id][0].startswith("rllm-v0")
    assert backend.served_model_name() == f"accounts/{ACCOUNT}/deployments/{res.deployment_id}"
    await backend.close()
    assert res.job_id not in fake_fireworks.jobs and res.deployment_id not in fake_fireworks.deployments
    assert fake_fireworks.violations == []


async def test_a_training_shape_also_shapes_the_deployment(fake_fireworks: FakeFireworksServer) -> None:
    shape = "accounts/fireworks/trainingShapes/ts-qwen3-0p6b"
    backend = FireworksBackend(options(fake_fireworks, training_shape=shape))
    await backend.start()
    try:
        res = backend.resources
        assert res is not None
        (created,) = [p for m, p, _ in fake_fireworks.requests if f"rlorTrainerJobId={res.job_id}" in p]
        assert "trainingShape=accounts%2Ffireworks%2FtrainingShapes%2Fts-qwen3-0p6b" in created
        deployment = fake_fireworks.deployments[res.deployment_id]
        assert deployment["deploymentShape"] == f"{shape}-deployment/versions/1"
    finally:
        await backend.close()


async def test_attach_by_id_leaves_the_resources_alone(fake_fireworks: FakeFireworksServer) -> None:
    owner = FireworksBackend(options(fake_fireworks, deployment_id="kept-deployment", cleanup_on_close=False))
    await owner.start()
    assert owner.resources is not None
    job_id = owner.resources.job_id
    await owner.close()
    jobs_before = len(fake_fireworks.bodies("/rlorTrainerJobs"))
    attached = FireworksBackend(
        options(fake_fireworks, trainer_job_id=job_id, deployment_id="kept-deployment")
    )
    await attached.start()
    assert attached.resources is not None and not attached.resources.created_job
    assert not attached.resources.created_deployment
    assert len(fake_fireworks.bodies("/rlorTrainerJobs")) == jobs_before  # no new job created
    await attached.close()
    assert job_id in fake_fireworks.jobs and "kept-deployment" in fake_fireworks.deployments
    wrong = FireworksBackend(options(fake_fireworks, trainer_job_id=job_id, lora_rank=4))
    with pytest.raises(ValueError, match=r"backend\.options\.lora_rank"):
        await wrong.start()


@pytest.mark.parametrize(
    "algo",
    [
        AlgorithmConfig(),
        AlgorithmConfig(loss="dual_clip", aggregation="seq-mean-token-sum"),
        AlgorithmConfig(loss="cispo", aggregation="seq-mean-token-mean"),
    ],
    ids=["ppo_clip-token-mean", "dual_clip-seq-mean-token-sum", "cispo-seq-mean-token-mean"],
)
async def test_forward_backward_custom_gradient_is_rllm_algos_gradient(
    fake_fireworks: FakeFireworksServer, backend: FireworksBackend, algo: AlgorithmConfig
) -> None:
    model = _model(fake_fireworks, backend)
    before = model.logits.detach().clone()
    metrics = await backend.train_step(BATCH, algo)
    expected = _expected_gradient(before, BATCH, algo)
    torch.testing.assert_close(model.grads_since_step[-1], expected, rtol=1e-4, atol=1e-6)
    assert metrics["optimizer_steps"] == 1.0 and "loss" in metrics
    # The SDK's custom-loss path: a forward for logprobs, then a linearised cross_entropy backward.
    fb = fake_fireworks.bodies("/api/v1/forward_backward")[-1]["forward_backward_input"]
    assert fb["loss_fn"] == "cross_entropy" and len(fb["data"]) == len(BATCH)


async def test_optim_step_sync_and_hot_load(
    fake_fireworks: FakeFireworksServer, backend: FireworksBackend
) -> None:
    model = _model(fake_fireworks, backend)
    before = model.logits.detach().clone()
    await backend.train_step(BATCH, AlgorithmConfig())
    assert not torch.equal(before, model.logits.detach())
    adam = fake_fireworks.bodies("/api/v1/optim_step")[-1]["adam_params"]
    assert adam["learning_rate"] == 1e-2 and adam["beta2"] == 0.999 and adam["grad_clip_norm"] == 0.0
    assert await backend.sync_weights() == 1
    assert backend.resources is not None
    snapshot = fake_fireworks.hotloaded[backend.resources.deployment_id][-1]
    assert snapshot.startswith("rllm-v1")
    torch.testing.assert_close(fake_fireworks.sampler_snapshots[snapshot]["logits"], model.logits.detach())


async def test_a_failed_hot_load_is_reported_and_the_version_kept(
    fake_fireworks: FakeFireworksServer, backend: FireworksBackend
) -> None:
    fake_fireworks.fail_hotload_of = "rllm-v1"
    try:
        with pytest.raises(RuntimeError, match="rllm-v1"):
            await backend.sync_weights()
    finally:
        fake_fireworks.fail_hotload_of = None
    assert backend.weight_version == 0
    assert await backend.sync_weights() == 1  # the next sync loads a fresh snapshot


async def test_resume_in_the_same_job_and_in_a_new_one(
    fake_fireworks: FakeFireworksServer, backend: FireworksBackend, tmp_path: Path
) -> None:
    model = _model(fake_fireworks, backend)
    await backend.train_step(BATCH, AlgorithmConfig())
    await backend.sync_weights()
    await backend.save_checkpoint(tmp_path)
    saved = model.logits.detach().clone()
    saved_adam = {k: v.clone() for k, v in model.optimizer.state_dict()["state"][0].items()}
    await backend.train_step(BATCH, AlgorithmConfig())
    await backend.sync_weights()
    await backend.load_checkpoint(tmp_path)
    torch.testing.assert_close(model.logits.detach(), saved)
    assert backend.weight_version == 1 and backend.optimizer_steps == 1

    fresh = FireworksBackend(options(fake_fireworks, seed=7))
    await fresh.start()
    try:
        await fresh.load_checkpoint(tmp_path)
        assert backend.resources is not None
        loaded = fake_fireworks.bodies("/api/v1/load_weights")[-1]
        assert loaded["path"].startswith(f"cross_job://{backend.resources.job_id}/")
        restored = _model(fake_fireworks, fresh)
        torch.testing.assert_close(restored.logits.detach(), saved)
        for key, value in saved_adam.items():
            torch.testing.assert_close(restored.optimizer.state_dict()["state"][0][key], value)
        assert fresh.weight_version == 1
    finally:
        await fresh.close()
    wrong = FireworksBackend(options(fake_fireworks, lora_rank=4))
    await wrong.start()
    try:
        with pytest.raises(ValueError, match=r"backend\.options\.lora_rank"):
            await wrong.load_checkpoint(tmp_path)
    finally:
        await wrong.close()


async def test_sdk_retries_transient_errors(
    fake_fireworks: FakeFireworksServer, backend: FireworksBackend
) -> None:
    sent = len(fake_fireworks.bodies("/api/v1/forward_backward"))
    fake_fireworks.fail_next["forward_backward"] = [503]
    await backend.train_step(BATCH, AlgorithmConfig())
    assert len(fake_fireworks.bodies("/api/v1/forward_backward")) == sent + 2  # the 503, then the retry


async def test_sdk_errors_reach_the_caller(
    fake_fireworks: FakeFireworksServer, backend: FireworksBackend
) -> None:
    fake_fireworks.fail_next["optim_step"] = [400]
    with pytest.raises(APIStatusError, match="injected HTTP 400"):
        await backend.train_step(BATCH, AlgorithmConfig())
    # A request the service accepts but fails while running comes back as a failed future.
    bad = [_sequence([1, 2, 999], 1, 1.0, 0)]
    with pytest.raises(RequestFailedError, match="outside the vocabulary"):
        await backend.train_step(bad, AlgorithmConfig())
    fake_fireworks.violations.clear()


async def test_failed_job_creation_is_reported(fake_fireworks: FakeFireworksServer) -> None:
    fake_fireworks.fail_next["rlorTrainerJobs"] = [400]
    backend = FireworksBackend(options(fake_fireworks))
    with pytest.raises(TrainingAPIError, match="injected HTTP 400"):
        await backend.start()
    assert backend.resources is None


async def test_agents_reach_the_deployment_with_token_ids(
    fake_fireworks: FakeFireworksServer, backend: FireworksBackend
) -> None:
    """The real openai client, through the backend's loopback upstream, to the deployment."""
    client = AsyncOpenAI(base_url=backend.inference_urls()[0], api_key="unused-by-the-adapter")
    out = await client.completions.create(
        model=backend.served_model_name(),
        prompt=[3, 1, 4],
        max_tokens=5,
        temperature=0.7,
        logprobs=1,
        extra_body={"return_token_ids": True},
    )
    choice = out.choices[0].model_dump()
    assert choice["prompt_token_ids"] == [3, 1, 4] and len(choice["token_ids"]) == 5
    assert "raw_output" not in choice
    sent = fake_fireworks.bodies("/inference/v1/completions")[-1]
    assert sent["raw_output"] is True and sent["top_k"] == 0 and "return_token_ids" not in sent
    # logprob is the sampling distribution's (T=0.7), not the raw model's.
    assert backend.resources is not None
    snapshot = fake_fireworks.hotloaded[backend.resources.deployment_id][-1]
    table = fake_fireworks.sampler_snapshots[snapshot]["logits"]
    prev, expected = 4, []
    for token in choice["token_ids"]:
        expected.append(float(torch.log_softmax(table[prev] / 0.7, -1)[token]))
        prev = token
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == pytest.approx(expected, abs=1e-5)
    with pytest.raises(BadRequestError, match="stream"):
        await client.completions.create(model=backend.served_model_name(), prompt=[1], stream=True)
    await client.close()
