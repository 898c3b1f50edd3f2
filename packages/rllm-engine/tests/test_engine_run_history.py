"""The run directory's history: per-step episode samples and one history after a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm.engine.training.metrics_log import (
    DROPPED_METRICS,
    MetricsLogger,
    read_episode_sample,
    read_metrics,
    sample_steps,
    truncate_history,
    write_episode_sample,
)
from rllm.types import Episode, Step, Trajectory


def _episode(task_id: str, index: int) -> Episode:
    step = Step(
        prompt_ids=[1, 2], completion_ids=[3, 4, 5], completion_logprobs=[-0.1, -0.2, -0.3], advantage=0.5
    )
    return Episode(task_id=task_id, rollout_index=index, trajectories=[Trajectory(steps=[step], reward=1.0)])


def test_sample_keeps_every_rollout_of_the_first_groups(tmp_path: Path) -> None:
    episodes = [_episode(task, i) for task in ("a", "b", "c") for i in range(2)]
    trained = [t.id for e in episodes[2:] for t in e.trajectories]  # group "a" was filtered out
    path = write_episode_sample(tmp_path, 3, episodes, trained, groups=2)
    assert path is not None and path.parent.name == "samples"
    sample = read_episode_sample(path)
    assert sample.step == 3
    assert [(e.task_id, e.rollout_index) for e in sample.episodes] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert set(sample.trained_trajectory_ids) == {t.id for e in episodes[2:4] for t in e.trajectories}
    step = sample.episodes[0].trajectories[0].steps[0]
    assert list(step.completion_ids) == [3, 4, 5] and step.advantage == 0.5
    assert sample_steps(tmp_path) == [3]


def test_no_groups_writes_nothing(tmp_path: Path) -> None:
    assert write_episode_sample(tmp_path, 1, [], [], groups=2) is None
    assert sample_steps(tmp_path) == []


def _log_steps(out: Path, steps: range) -> None:
    logger = MetricsLogger(out, tensorboard=False)
    for step in steps:
        logger.log(step, {"reward/mean": step / 100})
        write_episode_sample(out, step, [_episode(f"t{step}", 0)], [], groups=1)
    logger.close()


def test_resume_keeps_one_history(tmp_path: Path) -> None:
    # A run killed at step 47 with its last checkpoint at 40, then resumed and finished.
    _log_steps(tmp_path, range(1, 48))
    assert truncate_history(tmp_path, 40) == 7
    _log_steps(tmp_path, range(41, 51))
    steps = [row["step"] for row in read_metrics(tmp_path / "metrics.jsonl")]
    assert steps == list(range(1, 51))
    assert sample_steps(tmp_path) == list(range(1, 51))
    dropped = read_metrics(tmp_path / DROPPED_METRICS)
    assert [r["step"] for r in dropped] == list(range(41, 48))
    assert all(r["dropped_on_resume_from"] == 40 for r in dropped)


def test_fresh_start_drops_everything_including_step_zero(tmp_path: Path) -> None:
    _log_steps(tmp_path, range(0, 3))
    assert truncate_history(tmp_path, 0) == 3
    assert read_metrics(tmp_path / "metrics.jsonl") == [] and sample_steps(tmp_path) == []


def test_nothing_to_drop_leaves_the_file_alone(tmp_path: Path) -> None:
    assert truncate_history(tmp_path, 5) == 0
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / DROPPED_METRICS).exists()


def test_a_torn_last_row_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + '{"step": 2, "rew')
    assert read_metrics(path) == [{"step": 1}]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    total=st.integers(1, 30),
    ckpt_every=st.integers(1, 10),
    crashes=st.lists(st.integers(1, 30), max_size=3),
)
def test_any_crash_and_resume_sequence_leaves_one_history(
    tmp_path_factory: pytest.TempPathFactory, total: int, ckpt_every: int, crashes: list[int]
) -> None:
    out = tmp_path_factory.mktemp("run")
    step = 0
    for crash in [*sorted(c for c in crashes if c <= total), total]:
        # Resume from the last checkpoint at or before the current step, then run to the crash.
        resumed = (step // ckpt_every) * ckpt_every
        truncate_history(out, resumed)
        _log_steps(out, range(resumed + 1, max(crash, resumed) + 1))
        step = max(crash, resumed)
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, step + 1))
    assert sample_steps(out) == list(range(1, step + 1))


def test_sample_always_keeps_the_best_and_the_worst_group(tmp_path: Path) -> None:
    # The step's only successful group is its last task: it must be viewable.
    episodes = []
    for task, reward in (("a", 0.5), ("b", 0.5), ("c", 0.0), ("d", 1.0)):
        for i in range(2):
            episode = _episode(task, i)
            episode.metrics["reward"] = reward
            episodes.append(episode)
    for groups, kept in ((1, ["d", "c"]), (2, ["d", "c"]), (3, ["a", "c", "d"])):
        path = write_episode_sample(tmp_path, groups, episodes, [], groups=groups)
        assert path is not None
        assert sorted({e.task_id for e in read_episode_sample(path).episodes}) == sorted(kept), groups
