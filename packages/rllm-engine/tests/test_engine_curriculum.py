"""rollout.curriculum (rllm.engine.training.curriculum, task_sampler): the weights are the
documented function of each task's recent pass rate, the draws follow the weights, the sampler's
state survives a checkpoint exactly, and promotion moves a levelled generator up."""

from __future__ import annotations

import collections
import itertools
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.engine.training.checkpoint import TrainerState, load_trainer_state, save_checkpoint
from rllm.engine.training.curriculum import CurriculumSettings, draw, effective_tasks
from rllm.engine.training.data_order import DataCursor
from rllm.engine.training.launch import load_train_config
from rllm.engine.training.task_sampler import TaskSampler
from rllm.sdk.cookbook import Cookbook, DifficultyLevels
from rllm.types import ConfigError, Episode, Task, Trajectory

TASKS = [Task(id=f"t{i}", instruction=f"task {i}") for i in range(6)]


def _episodes(rewards: dict[str, list[float]]) -> list[Episode]:
    return [
        Episode(task_id=task, rollout_index=i, trajectories=[Trajectory(reward=r)])
        for task, values in rewards.items()
        for i, r in enumerate(values)
    ]


def _by_definition(rewards: list[float], cfg: CurriculumSettings) -> float:
    """w(p) read straight off the documentation (rllm.engine.training.curriculum)."""
    recent = rewards[-cfg.window :]
    # A task not seen yet counts as half passed.
    p = sum(1 for r in recent if r >= cfg.pass_reward) / len(recent) if recent else 0.5
    return 4 * p * (1 - p) + (1 - p) * cfg.unsolved_weight + p * cfg.solved_weight


rewards_st = st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0])


@settings(max_examples=60, deadline=None)
@given(
    history=st.lists(
        st.dictionaries(st.sampled_from([t.id for t in TASKS]), st.lists(rewards_st, min_size=1, max_size=5)),
        max_size=8,
    ),
    window=st.integers(1, 10),
    pass_reward=st.sampled_from([0.25, 0.5, 1.0]),
    unsolved=st.floats(0.01, 3.0),
    solved=st.floats(0.01, 3.0),
)
def test_each_weight_is_the_documented_function_of_the_tasks_recent_pass_rate(
    history: list[dict[str, list[float]]], window: int, pass_reward: float, unsolved: float, solved: float
) -> None:
    cfg = CurriculumSettings(
        enabled=True, window=window, pass_reward=pass_reward, unsolved_weight=unsolved, solved_weight=solved
    )
    sampler = TaskSampler(TASKS, seed=0, settings=cfg)
    seen: dict[str, list[float]] = collections.defaultdict(list)
    for appearance in history:
        sampler.observe(_episodes(appearance))
        for task, values in appearance.items():
            seen[task] += values
    weights = sampler.weights()
    assert weights == pytest.approx([_by_definition(seen[t.id], cfg) for t in TASKS])
    assert all(w > 0 for w in weights)  # the floors: every task stays drawable
    # The band shares and the effective dataset size the step reports.
    metrics = sampler.end_step([])
    rates = sampler.pass_rates()
    assert metrics["curriculum/tasks_unseen"] == sum(p is None for p in rates) / len(TASKS)
    assert metrics["curriculum/tasks_unsolved"] == sum(p == 0 for p in rates) / len(TASKS)
    assert metrics["curriculum/tasks_solved"] == sum(p == 1 for p in rates) / len(TASKS)
    assert metrics["curriculum/tasks_learning"] == sum(p is not None and 0 < p < 1 for p in rates) / len(
        TASKS
    )
    assert metrics["curriculum/effective_tasks"] == pytest.approx(
        sum(weights) ** 2 / sum(w * w for w in weights)
    )


@given(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=20))
def test_the_effective_dataset_size_is_the_count_for_equal_weights_and_never_more(
    weights: list[float],
) -> None:
    assert 1.0 - 1e-9 <= effective_tasks(weights) <= len(weights) + 1e-9
    assert effective_tasks([weights[0]] * len(weights)) == pytest.approx(len(weights))


def test_the_draws_follow_the_weights() -> None:
    # One task passes, one fails, one passes 3 of 4, the rest unseen: four different weights.
    sampler = TaskSampler(TASKS, seed=3, settings=CurriculumSettings(enabled=True, window=4))
    sampler.observe(_episodes({"t0": [1.0] * 4, "t1": [0.0] * 4, "t2": [1.0, 0.0, 1.0, 1.0]}))
    weights = sampler.weights()
    assert len(set(weights[:4])) == 4
    drawn, _ = sampler.next_batch(30_000, DataCursor())
    counts = collections.Counter(t.id for t in drawn)
    for task, weight in zip(TASKS, weights, strict=True):
        expected = weight / sum(weights)
        # The draws are seeded (this test sees the same ones every run): 4 standard errors.
        assert abs(counts[task.id] / len(drawn) - expected) < 4 * math.sqrt(expected / len(drawn))


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.floats(0.05, 3.0), min_size=1, max_size=10),
    seed=st.integers(0, 1000),
    first=st.integers(0, 10**6),
    size=st.integers(1, 64),
)
def test_a_batch_holds_each_task_about_in_proportion_to_its_weight(
    weights: list[float], seed: int, first: int, size: int
) -> None:
    """Consecutive draws spread evenly (a golden-ratio sequence): whatever the weights and
    wherever a batch starts, no task's count is off its share by 3 or more (independent draws
    would miss a task of share 1/10 in a batch of 8 four times in ten)."""
    cumulative = list(itertools.accumulate(weights))
    counts = collections.Counter(draw(cumulative, seed, first + k) for k in range(size))
    for i, w in enumerate(weights):
        assert abs(counts[i] - size * w / cumulative[-1]) < 3


def test_off_the_order_is_the_seeded_epoch_order_and_on_it_is_seeded_by_the_draw_count() -> None:
    plain = TaskSampler(TASKS, seed=1, settings=CurriculumSettings())
    first, cursor = plain.next_batch(4, DataCursor())
    second, _ = plain.next_batch(4, cursor)
    assert sorted(t.id for t in first + second[:2]) == sorted(t.id for t in TASKS)  # one epoch
    weighted = TaskSampler(TASKS, seed=1, settings=CurriculumSettings(enabled=True))
    a, after = weighted.next_batch(5, DataCursor())
    assert after.draws == 5
    b, _ = weighted.next_batch(5, DataCursor(draws=0))
    assert a == b  # the same draw numbers, the same record: the same tasks
    c, _ = weighted.next_batch(5, DataCursor(draws=5))
    assert a != c


class Levels:
    """Three levels of two tasks each, ids naming their level."""

    def level_count(self) -> int:
        return 3

    def load_level(self, split: str, level: int) -> list[Task]:
        return [Task(id=f"{split}-L{level}-{i}", instruction=f"level {level}") for i in range(2)]


def _promoting(promote: float = 0.75, steps: int = 2, enabled: bool = True) -> TaskSampler:
    cfg = CurriculumSettings(enabled=enabled, promote=promote, promote_steps=steps, window=4)
    levels = Levels()
    assert isinstance(levels, DifficultyLevels)
    return TaskSampler(levels.load_level("train", 0), seed=0, settings=cfg, levels=levels)


def _step(sampler: TaskSampler, reward: float) -> dict[str, Any]:
    episodes = _episodes({t.id: [reward] * 4 for t in sampler.tasks})
    sampler.observe(episodes)
    return sampler.end_step(episodes)


def test_promotion_waits_for_its_steps_moves_up_one_level_and_stops_at_the_top() -> None:
    sampler = _promoting()
    assert _step(sampler, 1.0)["curriculum/promoted"] == 0.0  # one step of the two measured
    metrics = _step(sampler, 1.0)
    assert metrics["curriculum/promoted"] == 1.0 and metrics["curriculum/level"] == 1.0
    assert [t.id for t in sampler.tasks] == ["train-L1-0", "train-L1-1"]
    assert _step(sampler, 0.5)["curriculum/promoted"] == 0.0  # 0.5 < pass_reward: none passed
    assert _step(sampler, 1.0)["curriculum/promoted"] == 0.0  # 1 of the 2 steps measured passed
    assert _step(sampler, 1.0)["curriculum/level"] == 2.0
    for _ in range(3):
        assert _step(sampler, 1.0)["curriculum/level"] == 2.0  # the top level
    # A cursor of an earlier level starts the new level's order afresh; the draw count goes on.
    tasks, cursor = sampler.next_batch(2, DataCursor(epoch=3, cursor=1, draws=9, level=0))
    assert cursor.level == 2 and cursor.draws == 11 and {t.id[:8] for t in tasks} == {"train-L2"}
    assert sampler.find(["train-L0-1"])[0].id == "train-L0-1"  # an unconsumed task of level 0


async def test_the_sampler_state_survives_a_checkpoint_and_draws_the_same_next_tasks(tmp_path: Path) -> None:
    """A run checkpointed mid-way and resumed into a fresh sampler draws exactly the tasks the
    uninterrupted sampler draws next, across a promotion."""

    async def save_backend(path: Path) -> None:
        (path / "weights").write_text("w")

    live = _promoting(promote=0.5, steps=1)
    cursor = DataCursor()
    script = [0.0, 1.0, 0.5, 1.0, 0.0, 1.0]  # each step's reward for every task of the batch
    for reward in script[:3]:
        batch, cursor = live.next_batch(3, cursor)
        episodes = _episodes({t.id: [reward, 1.0 - reward] for t in batch})
        live.observe(episodes)
        live.end_step(episodes)
    state = TrainerState(step=3, data=cursor, sampler=live.state())
    path = await save_checkpoint(tmp_path, state, save_backend)
    restored = load_trainer_state(path)
    resumed = _promoting(promote=0.5, steps=1)
    resumed.restore(restored.sampler)
    assert restored.data == cursor and resumed.level == live.level
    assert msgspec.json.encode(resumed.state()) == msgspec.json.encode(live.state())
    position = {"live": cursor, "resumed": restored.data}
    for reward in script[3:]:
        drawn = {}
        for name, sampler in (("live", live), ("resumed", resumed)):
            batch, position[name] = sampler.next_batch(3, position[name])
            episodes = _episodes({t.id: [reward, 1.0 - reward] for t in batch})
            sampler.observe(episodes)
            drawn[name] = ([t.id for t in batch], sampler.end_step(episodes))
        assert drawn["live"] == drawn["resumed"]


def test_a_checkpoint_at_a_level_the_cookbook_lacks_is_refused() -> None:
    sampler = _promoting()
    state = sampler.state()
    state.level.level = 5
    with pytest.raises(ValueError, match="difficulty level 5"):
        _promoting().restore(state)


def test_curriculum_keys_are_checked_naming_the_dotted_key() -> None:
    for override, key in (
        ("rollout.curriculum.enabeld=true", "rollout.curriculum.enabeld"),
        ("rollout.curriculum.window=0", "rollout.curriculum.window"),
        ("rollout.curriculum.unsolved_weight=0", "rollout.curriculum.unsolved_weight"),
        ("rollout.curriculum.promote=1.5", "rollout.curriculum.promote"),
        ("rollout.curriculum.promote_steps=0", "rollout.curriculum.promote_steps"),
        # say-single's tasks have no difficulty levels to move up.
        ("rollout.curriculum.promote=0.8", "rollout.curriculum.promote"),
    ):
        with pytest.raises(ConfigError) as caught:
            load_train_config("say-single", overrides=[override])
        assert caught.value.key == key, (override, str(caught.value))


def test_a_cookbook_with_levels_is_loaded_at_level_zero() -> None:
    from rllm.engine.training.task_sampler import sampler_for

    say = load_train_config("say-single")[1]
    cookbook = Cookbook(
        name="lv", flow=say.flow, evaluator=say.evaluator, load_tasks=say.load_tasks, levels=Levels()
    )
    config, _ = load_train_config("lv", cookbook=cookbook, overrides=["rollout.curriculum.promote=0.9"])
    sampler = sampler_for(config, cookbook)
    assert [t.id for t in sampler.tasks] == ["train-L0-0", "train-L0-1"]
    plain, _ = load_train_config("lv", cookbook=cookbook)
    assert [t.id for t in sampler_for(plain, cookbook).tasks] == [t.id for t in say.load_tasks("train")]
