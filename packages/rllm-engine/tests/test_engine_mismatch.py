"""The train/sampler mismatch measured from sequences a backend filled with trainer logprobs,
mapped back onto the steps (what `rllm view` colours), and `max_mismatch` enforced."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllm.engine.training.mismatch import (
    TokenMismatchError,
    check_mismatch,
    measure_mismatch,
    segment_metrics,
)
from rllm.engine.training.sequences import sequences_from_trajectory
from rllm.types import Episode, FloatArray, Step, TokenArray, Trajectory
from rllm.types.errors import StateError


def _step(prompt: list[int], completion: list[int], logprobs: list[float], segment: int = 0, **meta) -> Step:
    return Step(
        prompt_ids=TokenArray(prompt),
        completion_ids=TokenArray(completion),
        completion_logprobs=FloatArray(logprobs),
        advantage=1.0,
        metadata={"segment": segment, **meta},
    )


def _episode() -> Episode:
    # Two turns that extend (one sequence), then a third that does not (a new segment).
    steps = [
        _step([1, 2], [3, 4], [-0.5, -1.0]),
        _step([1, 2, 3, 4, 5], [6], [-0.25]),
        _step(
            [9],
            [7, 8],
            [-2.0, -0.1],
            segment=1,
            segment_reason="the previous reply was changed (e.g. thinking stripped)",
        ),
    ]
    return Episode(task_id="t0", trajectories=[Trajectory(role="solver", steps=steps)])


def _train(episode: Episode, drift: dict[tuple[int, int], float] | None = None):
    """Sequences of the episode with trainer logprobs = sampler logprobs (+ drift at (turn, token))."""
    trajectory = episode.trajectories[0]
    sequences = sequences_from_trajectory(trajectory)
    drift = drift or {}
    for seq in sequences:
        values = list(seq.sampler_logprobs)
        for turn, start, _ in seq.metadata["step_spans"]:
            for (t, k), delta in drift.items():
                if t == turn:
                    values[start + k] += delta
        seq.trainer_logprobs = FloatArray(values)
    return sequences


def test_agreeing_logprobs_measure_zero_and_reach_the_steps():
    episode = _episode()
    sequences = _train(episode)
    assert len(sequences) == 2  # turns 0+1 merged, turn 2 its own segment
    report = measure_mismatch(sequences, [episode])
    assert report.recorded
    assert report.metrics["mismatch/mean_abs"] == 0.0
    assert report.metrics["mismatch/max_abs"] == 0.0
    assert report.metrics["mismatch/kl_k3"] == 0.0
    assert report.metrics["mismatch/tokens"] == 5
    steps = episode.trajectories[0].steps
    assert [s.metadata["train_logprobs"] for s in steps] == [
        [-0.5, -1.0],
        [-0.25],
        [-2.0, pytest.approx(-0.1)],
    ]
    assert episode.metrics["mismatch/mean_abs"] == 0.0
    check_mismatch(report, 0.05, step=3, backend="tinker")  # within the limit: no error


def test_drift_names_step_worst_episode_and_first_drifting_token():
    healthy, corrupted = _episode(), _episode()
    sequences = _train(healthy) + _train(corrupted, {(1, 0): -3.0, (2, 1): 0.2})
    report = measure_mismatch(sequences, [healthy, corrupted])
    assert report.metrics["mismatch/max_abs"] == pytest.approx(3.0)
    assert report.metrics["mismatch/mean_abs"] == pytest.approx(3.2 / 10)
    assert report.metrics["mismatch/frac_over_0.5"] == pytest.approx(1 / 10)
    assert report.metrics["mismatch/kl_k3"] == pytest.approx(
        (math.expm1(-3.0) + 3.0 + math.expm1(0.2) - 0.2) / 10, rel=1e-4
    )
    assert report.worst_episode == corrupted.id
    assert healthy.metrics["mismatch/mean_abs"] == 0.0
    assert corrupted.metrics["mismatch/mean_abs"] == pytest.approx(0.64)
    drift = report.first_drift
    assert drift is not None and (drift.turn, drift.position, drift.token_id) == (1, 0, 6)
    with pytest.raises(TokenMismatchError) as err:
        check_mismatch(report, 0.05, step=7, backend="tinker")
    message = str(err.value)
    assert message.startswith("step 7: train/sampler mismatch 0.3200")
    assert f"worst episode {corrupted.id} (task t0)" in message
    assert "turn 1, completion token 0 (id 6), sampler logprob -0.2500, trainer logprob -3.2500" in message
    check_mismatch(report, None, step=7, backend="tinker")  # off by default


def test_small_drift_reports_the_largest_token():
    episode = _episode()
    report = measure_mismatch(_train(episode, {(2, 1): 0.1, (0, 1): 0.05}), [episode])
    assert report.first_drift is not None and (report.first_drift.turn, report.first_drift.position) == (2, 1)


def test_a_backend_without_trainer_logprobs_is_not_silently_passed():
    episode = _episode()
    sequences = sequences_from_trajectory(episode.trajectories[0])
    report = measure_mismatch(sequences, [episode])
    assert not report.recorded and "mismatch/mean_abs" not in report.metrics
    check_mismatch(report, None, step=1, backend="verl")
    with pytest.raises(
        StateError, match=r"step 1: algorithm\.max_mismatch is set, but backend 'verl' recorded no"
    ):
        check_mismatch(report, 0.05, step=1, backend="verl")


def test_segments_started_and_their_reasons():
    episode = _episode()
    metrics = segment_metrics([episode, Episode(task_id="t1")])
    assert episode.metrics["segments/new"] == 1.0
    assert metrics == {
        "segments/new_per_episode": 0.5,
        "segments/reason/the_previous_reply_was_changed": 1.0,
    }


@given(st.lists(st.floats(-30, 30, allow_nan=False), min_size=1, max_size=50))
def test_k3_estimate_is_finite_and_non_negative(gaps):
    episode = Episode(
        task_id="t",
        trajectories=[Trajectory(steps=[_step([1], list(range(2, 2 + len(gaps))), [-1.0] * len(gaps))])],
    )
    sequences = _train(episode, {(0, k): g for k, g in enumerate(gaps)})
    metrics = measure_mismatch(sequences, [episode]).metrics
    assert math.isfinite(metrics["mismatch/kl_k3"]) and metrics["mismatch/kl_k3"] >= 0.0
    assert metrics["mismatch/max_abs"] == pytest.approx(max(abs(g) for g in gaps), abs=1e-5)
