"""A task no rollout of which is ever rewarded never trains (zero-variance groups): the run
counts such tasks per step and names them at its end (rllm.engine.training.learning_watch)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rllm.engine.training.learning_watch import TaskOutcomes
from rllm.types import Trajectory, TrajectoryGroup


def _group(task: str, rewards: list[float], role: str = "") -> TrajectoryGroup:
    return TrajectoryGroup(task_id=task, role=role, trajectories=[Trajectory(reward=r) for r in rewards])


def test_a_task_counts_after_its_appearances_in_a_row_without_reward_and_is_named() -> None:
    watch = TaskOutcomes(appearances=3)
    for _ in range(2):
        assert watch.observe([_group("lemon", [0.0] * 8), _group("piano", [1.0, 0.0])]) == {
            "filter/tasks_unrewarded": 0.0
        }
        assert watch.summary() is None  # two appearances are not enough
    assert watch.observe([_group("lemon", [0.0] * 8)]) == {"filter/tasks_unrewarded": 1.0}
    summary = watch.summary()
    assert summary is not None
    assert summary.startswith("1 task(s) got no reward") and "lemon (0 of 24)" in summary
    assert "piano" not in summary and "group_size" in summary


def test_a_single_rewarded_rollout_resets_the_task_and_all_correct_groups_never_count() -> None:
    watch = TaskOutcomes(appearances=2)
    watch.observe([_group("lemon", [0.0] * 4), _group("apple", [1.0] * 4)])
    watch.observe([_group("lemon", [0.0, 0.0, 0.5, 0.0]), _group("apple", [1.0] * 4)])
    assert watch.observe([_group("lemon", [0.0] * 4), _group("apple", [1.0] * 4)]) == {
        "filter/tasks_unrewarded": 0.0
    }
    assert watch.summary() is None


def test_roles_of_one_task_count_together_and_negative_rewards_are_unrewarded() -> None:
    watch = TaskOutcomes(appearances=1)
    # the judge was rewarded, the solver not: the task still gives a learning signal
    watch.observe([_group("t", [0.0, 0.0], "solver"), _group("t", [1.0, 0.0], "judge")])
    assert watch.summary() is None
    watch.observe([_group("u", [-1.0, -1.0], "solver"), _group("u", [0.0, 0.0], "judge")])
    assert watch.summary() is not None and "u (0 of 4)" in watch.summary()


def test_the_summary_names_a_few_tasks_and_counts_the_rest() -> None:
    watch = TaskOutcomes(appearances=1)
    watch.observe([_group(f"task{i}", [0.0]) for i in range(8)])
    summary = watch.summary()
    assert summary is not None and summary.startswith("8 task(s)") and "and 3 more" in summary


@given(st.lists(st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), max_size=4), max_size=12))
def test_the_count_is_the_tasks_whose_last_k_appearances_had_no_reward(
    steps: list[list[tuple[str, bool]]],
) -> None:
    """Against a direct reading of the definition: per step, a task is rewarded if any of its
    groups had a rewarded rollout; it counts when its last 2 appearances were both unrewarded."""
    watch = TaskOutcomes(appearances=2)
    history: dict[str, list[bool]] = {}
    for step in steps:
        got = watch.observe([_group(task, [1.0 if hit else 0.0, 0.0]) for task, hit in step])
        per_step: dict[str, bool] = {}
        for task, hit in step:
            per_step[task] = per_step.get(task, False) or hit
        for task, hit in per_step.items():
            history.setdefault(task, []).append(hit)
        expected = sum(1 for h in history.values() if len(h) >= 2 and not any(h[-2:]))
        assert got == {"filter/tasks_unrewarded": float(expected)}


def test_a_run_whose_reward_still_rises_is_not_told_its_tasks_are_unlearnable() -> None:
    """The end-of-run warning waits for the reward to stop rising: a 40-step run of a config that
    reaches 1.0 by step 200 still has tasks not rewarded yet (say-single's first 40 steps climb
    from about 0.1 to 0.6), which is no sign that they never will be."""
    from rllm.engine.training.learning_watch import reward_still_rising

    climbing = [0.1 + 0.5 * step / 40 for step in range(40)]
    assert reward_still_rising(climbing)
    levelled_off = [0.1 + 0.5 * min(step, 10) / 10 for step in range(40)]  # 0.6 from step 10 on
    assert not reward_still_rising(levelled_off)
    assert not reward_still_rising([0.0, 0.5, 1.0])  # too short to tell: the warning stands


@given(
    st.lists(st.floats(min_value=0.0, max_value=1.0), max_size=60), st.floats(min_value=0.0, max_value=1.0)
)
def test_a_reward_that_never_goes_up_is_never_rising(rewards: list[float], start: float) -> None:
    from rllm.engine.training.learning_watch import reward_still_rising

    falling = sorted(rewards, reverse=True)
    assert not reward_still_rising(falling) and not reward_still_rising([start] * len(rewards))
