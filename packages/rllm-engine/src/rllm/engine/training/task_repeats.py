"""A task drawn more than once in one training step: each drawing its own group.

With ``tasks_per_step`` larger than the training split (``say-single``: 32 a step from 8 tasks),
the data order hands a step the same task several times. Grouping by task id alone merged those
drawings into one group of several times ``group_size`` (4 drawings of 4 rollouts: a group of
16), so the baseline each rollout is compared with was not the one the user set. Each drawing's
rollouts carry rollout indices 0..group_size-1 (the engine numbers them per drawing), so the
k-th episode of a (task, rollout index) in a step belongs to the k-th drawing:
:func:`mark_task_repeats` records that in ``metadata[REPEAT_KEY]``, which
:func:`rllm.algos.grouping.group_trajectories` groups by. Episodes of a task drawn once are left
as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from rllm.algos.grouping import REPEAT_KEY
from rllm.types import Episode


def mark_task_repeats(episodes: Sequence[Episode]) -> None:
    """Mark each episode with its task's drawing within ``episodes`` (one step's, in the order
    the engine returned them): the k-th of its (task, rollout index) is drawing k (only k >= 1
    is written). Recomputed from scratch on every call, so a step's batch grown by more groups
    (dynamic sampling) is marked again whole."""
    seen: dict[tuple[str, int], int] = {}
    for episode in episodes:
        key = (episode.task_id, episode.rollout_index)
        drawing = seen.get(key, 0)
        seen[key] = drawing + 1
        if drawing:
            episode.metadata[REPEAT_KEY] = drawing
        else:
            episode.metadata.pop(REPEAT_KEY, None)


def repeats_note(tasks_per_step: int, split_tasks: int, split: str, group_size: int) -> str | None:
    """The one line a run says at its start when its steps draw tasks more than once."""
    if tasks_per_step <= split_tasks:
        return None
    return (
        f"note: tasks_per_step={tasks_per_step} is more than the {split_tasks} tasks of split "
        f"{split!r}: a step draws tasks more than once ({tasks_per_step / split_tasks:.3g} times "
        f"each), each drawing its own group of group_size={group_size}"
    )


__all__ = ["mark_task_repeats", "repeats_note"]
