"""The one training step both loops run (rllm.engine.training.train_step): it trains, measures the
train/sampler mismatch, writes the sample, checks ``algorithm.max_mismatch`` and only then
publishes the new weights, so a drifted update never reaches the sampler in either loop.

The backend is a stand-in (nothing here trains): it records each batch and writes trainer
logprobs a set distance from the sampler's, the drift the step must measure.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import pytest

from rllm.algos.config import AlgorithmConfig
from rllm.engine.training.health_config import HealthSection
from rllm.engine.training.metrics_log import read_episode_sample, sample_path
from rllm.engine.training.mismatch import TokenMismatchError
from rllm.engine.training.train_step import TIMEOUT_WARN_FRACTION, TrainStep, stop_if_infrastructure_down
from rllm.engine.training.trainer_config import TrainerConfig
from rllm.types import Episode, ErrorInfo, FloatArray, Step, TerminationReason, TrainSequence, Trajectory
from rllm.types.errors import StateError


class DriftingBackend:
    """Trains on nothing; each trained token's trainer logprob is the sampler's plus ``drift``."""

    name = "drifting"

    def __init__(self, drift: float) -> None:
        self.drift = drift
        self.batches: list[int] = []

    async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        self.batches.append(len(batch))
        for seq in batch:
            seq.trainer_logprobs = FloatArray(
                lp + self.drift if trained else 0.0
                for lp, trained in zip(seq.sampler_logprobs, seq.loss_mask, strict=True)
            )
        return {"loss": 0.25}


def _episodes(rewards: dict[str, list[float]]) -> list[Episode]:
    return [
        Episode(
            task_id=task,
            rollout_index=i,
            trajectories=[
                Trajectory(
                    steps=[Step(prompt_ids=[1, 2], completion_ids=[3, 4, 5], completion_logprobs=[-0.5] * 3)],
                    reward=reward,
                )
            ],
        )
        for task, group in rewards.items()
        for i, reward in enumerate(group)
    ]


def _step(tmp_path: Path, backend: DriftingBackend, **algorithm: Any) -> TrainStep:
    config = TrainerConfig(
        cookbook="fake",
        sample_groups=2,
        progress=False,
        algorithm=AlgorithmConfig(**algorithm),
        health=HealthSection(probe_sequences=0),  # the stand-in has no sampler to probe
    )
    return TrainStep(config, cast(Any, backend), tmp_path)


class Publish:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1


async def test_a_step_within_the_bound_trains_measures_and_publishes_once(tmp_path: Path) -> None:
    backend, publish = DriftingBackend(0.01), Publish()
    step = _step(tmp_path, backend, max_mismatch=0.05, filter_zero_variance=False)
    metrics = await step.run(_episodes({"a": [0.0, 1.0], "b": [1.0, 1.0]}), 3, publish)
    assert backend.batches == [4] and publish.calls == 1
    assert metrics["train/sequences"] == 4 and metrics["train/loss"] == 0.25
    assert metrics["mismatch/mean_abs"] == pytest.approx(0.01, abs=1e-6)
    assert metrics["mismatch/tokens"] == 12
    assert metrics["reward/mean"] == 0.75
    # The sample shows the trainer's logprobs on the steps (rllm view colours by them).
    sample = read_episode_sample(sample_path(tmp_path, 3))
    steps = [s for e in sample.episodes for t in e.trajectories for s in t.steps]
    assert all(s.metadata["train_logprobs"] == pytest.approx([-0.49] * 3, abs=1e-6) for s in steps)


async def test_a_drifted_step_stops_before_its_weights_are_published(tmp_path: Path) -> None:
    backend, publish = DriftingBackend(0.3), Publish()
    step = _step(tmp_path, backend, max_mismatch=0.05, filter_zero_variance=False)
    with pytest.raises(
        TokenMismatchError, match=r"^step 7: train/sampler mismatch 0\.3000 nats .*max_mismatch=0\.05"
    ):
        await step.run(_episodes({"a": [0.0, 1.0]}), 7, publish)
    assert backend.batches == [2]
    assert publish.calls == 0  # the sampler keeps the weights it had
    # The sample was written first: the viewer shows where it drifted.
    sample = read_episode_sample(sample_path(tmp_path, 7))
    assert all(e.metrics["mismatch/mean_abs"] == pytest.approx(0.3, abs=1e-6) for e in sample.episodes)


async def test_a_step_with_nothing_to_train_neither_trains_nor_publishes(tmp_path: Path) -> None:
    # Every group has zero variance and is filtered out: no update, so no new weights.
    backend, publish = DriftingBackend(0.3), Publish()
    step = _step(tmp_path, backend, max_mismatch=0.05, filter_zero_variance=True)
    metrics = await step.run(_episodes({"a": [1.0, 1.0], "b": [0.0, 0.0]}), 1, publish)
    assert backend.batches == [] and publish.calls == 0
    assert metrics["train/sequences"] == 0 and metrics["train/signal_sequences"] == 0
    assert metrics["filter/groups_kept"] == 0
    assert "mismatch/mean_abs" not in metrics  # nothing trained, nothing measured


def _versioned(episodes: list[Episode], versions: list[int]) -> list[Episode]:
    for episode, version in zip(episodes, versions, strict=True):
        for trajectory in episode.trajectories:
            for s in trajectory.steps:
                s.weight_version = version
    return episodes


async def test_lagged_steps_of_an_asynchronous_batch_do_not_count_towards_the_mismatch(
    tmp_path: Path,
) -> None:
    # K > 0: a step sampled by an older version differs from the trainer by the policy's lag, no
    # token fault. Here the lagged episodes drift 0.3 and the fresh ones 0.01: the bound holds.
    class LagBackend(DriftingBackend):
        async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
            for seq in batch:
                lag = 0.3 if seq.metadata.get("trajectory_id") in lagged_ids else 0.01
                seq.trainer_logprobs = FloatArray(
                    lp + lag if trained else 0.0
                    for lp, trained in zip(seq.sampler_logprobs, seq.loss_mask, strict=True)
                )
            return {}

    backend, publish = LagBackend(0.0), Publish()
    episodes = _versioned(_episodes({"a": [0.0, 1.0], "b": [1.0, 0.0]}), [4, 5, 4, 5])
    lagged_ids = {
        t.id for e in episodes if e.trajectories[0].steps[0].weight_version == 4 for t in e.trajectories
    }
    step = _step(tmp_path, backend, max_mismatch=0.05, filter_zero_variance=False)
    metrics = await step.run(episodes, 9, publish, weight_version=5)
    assert publish.calls == 1
    assert metrics["mismatch/mean_abs"] == pytest.approx(0.01, abs=1e-6)
    assert metrics["mismatch/tokens"] == 6 and metrics["mismatch/lagged_tokens"] == 6
    # The lagged steps still carry the trainer's logprobs for the viewer.
    sample = read_episode_sample(sample_path(tmp_path, 9))
    assert all(
        "train_logprobs" in s.metadata for e in sample.episodes for t in e.trajectories for s in t.steps
    )


async def test_a_fresh_step_that_drifts_still_stops_an_asynchronous_run(tmp_path: Path) -> None:
    backend, publish = DriftingBackend(0.3), Publish()
    episodes = _versioned(_episodes({"a": [0.0, 1.0]}), [5, 4])
    step = _step(tmp_path, backend, max_mismatch=0.05, filter_zero_variance=False)
    with pytest.raises(TokenMismatchError, match=r"^step 2: train/sampler mismatch 0\.3000"):
        await step.run(episodes, 2, publish, weight_version=5)
    assert publish.calls == 0


def _cut_off(episodes: list[Episode], count: int) -> list[Episode]:
    for episode in episodes[:count]:
        episode.termination_reason = TerminationReason.TIMEOUT
        episode.trajectories[0].reward = 0.0
    return episodes


@pytest.mark.parametrize(("cut", "warned"), [(0, False), (1, False), (2, True), (20, True)])
async def test_a_step_reports_its_cut_off_rollouts_and_warns_when_many_were(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cut: int, warned: bool
) -> None:
    # 20 rollouts: 1 cut off (5%) is under the 10% threshold, 2 are at it.
    episodes = _cut_off(_episodes({"a": [0.0, 1.0] * 5, "b": [1.0, 0.0] * 5}), cut)
    backend, publish = DriftingBackend(0.0), Publish()
    step = _step(tmp_path, backend, filter_zero_variance=False)
    with caplog.at_level(logging.WARNING, logger="rllm.engine.training.train_step"):
        metrics = await step.run(episodes, 5, publish)
    assert metrics["rollout/timeout_frac"] == pytest.approx(cut / 20)
    lines = [r.getMessage() for r in caplog.records if "cut off" in r.getMessage()]
    assert warned == (cut / 20 >= TIMEOUT_WARN_FRACTION) == bool(lines)
    if warned:
        (line,) = lines
        assert line.startswith(
            f"step 5: {cut / 20:.0%} of rollouts ({cut}/20) were cut off at their deadline"
        )
        assert "rollout.deadline_s=120 s" in line and "\n" not in line


@pytest.mark.parametrize("failed", [0, 1, 19, 20])
def test_a_batch_stops_the_run_only_when_every_rollout_failed_for_infrastructure(failed: int) -> None:
    """Some rollouts lost to an outage still leave the rest to train on (the engine retried them,
    the step says so in termination/infra_error); all of them lost is a run that cannot learn."""
    episodes = _episodes({"a": [0.0, 1.0] * 5, "b": [1.0, 0.0] * 5})
    for episode in episodes[:failed]:
        episode.termination_reason = TerminationReason.INFRA_ERROR
        episode.error = ErrorInfo(
            type="InternalServerError", message="Error code: 503 -\n no healthy upstream"
        )
    if failed < len(episodes):
        stop_if_infrastructure_down(episodes, "step 3")
        return
    with pytest.raises(StateError) as raised:
        stop_if_infrastructure_down(episodes, "step 3")
    assert str(raised.value) == (
        "step 3: all 20 rollouts failed for infrastructure reasons (nothing to train on; is the sampler "
        "or the gateway's upstream down?); the first: InternalServerError: Error code: 503 - no healthy upstream"
    )
