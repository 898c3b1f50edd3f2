"""A task drawn more than once in a training step (``tasks_per_step`` beyond the split): each
drawing is its own group of ``group_size`` (rllm.engine.training.task_repeats), where grouping by
task id alone merged them into one group of several times that."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rllm.algos.grouping import REPEAT_KEY, group_trajectories
from rllm.engine.training.task_repeats import mark_task_repeats, repeats_note
from rllm.types import Episode, Trajectory


def _as_the_engine_returns(task_ids: list[str], n: int, roles: tuple[str, ...] = ("",)) -> list[Episode]:
    """A step's episodes as ``RolloutEngine.run(tasks, n)`` returns them: by task, then rollout
    index 0..n-1 (each drawing numbered afresh)."""
    return [
        Episode(
            task_id=task,
            rollout_index=ri,
            trajectories=[Trajectory(role=role, reward=float(ri % 2)) for role in roles],
        )
        for task in task_ids
        for ri in range(n)
    ]


@given(
    st.lists(st.sampled_from("abcd"), min_size=1, max_size=12),
    st.integers(min_value=1, max_value=5),
    st.sampled_from([("",), ("solver", "judge")]),
)
def test_each_drawing_of_a_task_is_one_group_of_n_per_role(
    task_ids: list[str], n: int, roles: tuple[str, ...]
) -> None:
    episodes = _as_the_engine_returns(task_ids, n, roles)
    mark_task_repeats(episodes)
    groups = group_trajectories(episodes)
    assert len(groups) == len(task_ids) * len(roles)
    assert all(len(g.trajectories) == n for g in groups)
    # Each group's members are one drawing's: its episodes, in order, rollout indices 0..n-1.
    by_id = {e.id: e for e in episodes}
    for group in groups:
        assert [by_id[i].rollout_index for i in group.episode_ids] == list(range(n))
    # A task drawn once is left as it was; marking again (a batch grown) gives the same marks.
    once = [e for e in episodes if task_ids.count(e.task_id) == 1]
    assert all(REPEAT_KEY not in e.metadata for e in once)
    marks = [e.metadata.get(REPEAT_KEY) for e in episodes]
    mark_task_repeats(episodes)
    assert [e.metadata.get(REPEAT_KEY) for e in episodes] == marks


def test_the_note_is_said_only_when_a_step_draws_tasks_more_than_once() -> None:
    assert repeats_note(8, 8, "train", 4) is None
    note = repeats_note(32, 8, "train", 4)
    assert note == (
        "note: tasks_per_step=32 is more than the 8 tasks of split 'train': a step draws tasks "
        "more than once (4 times each), each drawing its own group of group_size=4"
    )
