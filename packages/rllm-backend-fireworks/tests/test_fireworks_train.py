"""Two training steps of the ``say`` cookbook on the fireworks backend, through the real engine:
trainer, rollout engine, gateway (plain capture), the say agent's openai client, the backend's
loopback upstream and the SDK. Against the loopback fake always; against the real service when
FIREWORKS_API_KEY is set (``live``)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from fireworks_helpers import MODEL

from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_metrics
from rllm.testing.fireworks import FakeFireworksServer

# The live run's key is the real one; the fake's conftest fixture replaces it for other tests.
LIVE_KEY = os.environ.get("FIREWORKS_API_KEY", "")
# The smallest base model Fireworks offers for RL fine-tuning (override: FIREWORKS_TEST_MODEL).
LIVE_MODEL = os.environ.get("FIREWORKS_TEST_MODEL", "accounts/fireworks/models/qwen3-0p6b")

RUN = [
    "progress=false",
    "plot=false",
    "tensorboard=false",
    "total_steps=2",
    "tasks_per_step=2",
    "group_size=2",
    "val_every=0",
    "ckpt_every=0",
    "rollout.workers=1",
    "algorithm.filter_zero_variance=false",
]


def _run(tmp_path: Path, options: dict[str, object], *extra: str, resume: bool = False) -> int:
    flags = [f"backend.options.{k}={v}" for k, v in options.items()]
    overrides = [*RUN, *flags, *extra]
    trainer = build_trainer("say", backend="fireworks", out_dir=str(tmp_path), overrides=overrides)
    return asyncio.run(trainer.fit(resume=resume, allow_changes=["total_steps"] if resume else ())).steps


def _two_steps(tmp_path: Path, options: dict[str, object]) -> list[dict]:
    assert _run(tmp_path, options) == 2
    return read_metrics(tmp_path / "metrics.jsonl")


@pytest.mark.slow
def test_two_steps_of_say_against_the_fake(tmp_path: Path) -> None:
    with FakeFireworksServer() as server:
        rows = _two_steps(
            tmp_path,
            {"model": MODEL, "base_url": server.url, "lora_rank": 8, "poll_interval_s": 0.01},
        )
        assert len(rows) == 2 and all(row["train/sequences"] > 0 for row in rows)
        (model,) = server.models.values()
        assert model.optimizer_steps == 2
        (loaded,) = server.hotloaded.values()
        assert [name.split("-")[1] for name in loaded] == ["v0", "v1", "v2"]
        assert server.violations == []
        assert server.jobs == {} and server.deployments == {}  # what start() created is gone


@pytest.mark.slow
def test_a_run_resumes_in_a_new_trainer_job(tmp_path: Path) -> None:
    with FakeFireworksServer() as server:
        fake = {"model": MODEL, "base_url": server.url, "lora_rank": 8, "poll_interval_s": 0.01}
        assert _run(tmp_path, fake, "ckpt_every=2") == 2
        (first_job,) = server.created_jobs
        assert _run(tmp_path, fake, "ckpt_every=2", "total_steps=3", resume=True) == 3
        loaded = server.bodies("/api/v1/load_weights")
        assert len(loaded) == 1 and loaded[0]["path"].startswith(f"cross_job://{first_job}/")
        assert loaded[0]["optimizer"] is True
        restored = [m for m in server.models.values() if m.job_id != first_job]
        assert len(restored) == 1 and restored[0].optimizer_steps == 3
        assert server.violations == []


@pytest.mark.live
@pytest.mark.skipif(not LIVE_KEY, reason="needs FIREWORKS_API_KEY (live Fireworks service, billed)")
def test_two_steps_of_say_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIREWORKS_API_KEY", LIVE_KEY)
    live: dict[str, object] = {"model": LIVE_MODEL, "lora_rank": 8, "learning_rate": 1e-4}
    # Provisioning dominates a short run's time and cost: reuse kept resources when named.
    for option, env in (
        ("trainer_job_id", "FIREWORKS_TEST_TRAINER_JOB"),
        ("deployment_id", "FIREWORKS_TEST_DEPLOYMENT"),
    ):
        if os.environ.get(env):
            live[option] = os.environ[env]
    rows = _two_steps(tmp_path, live)
    assert len(rows) == 2 and all(row["train/sequences"] > 0 for row in rows)
