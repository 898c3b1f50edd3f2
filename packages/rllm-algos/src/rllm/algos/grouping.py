"""Episodes → TrajectoryGroups, and each trajectory's reward.

A group holds the trajectories of one role (trajectory name) across the rollouts of one task:
those are the samples a group-relative estimator compares.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from rllm.algos.config import AlgorithmConfig
from rllm.algos.errors import AlgorithmInputError, RewardError
from rllm.types import Episode, Trajectory, TrajectoryGroup

# Episode metadata: which drawing of its task, within one training step, an episode belongs to
# (absent: the first). A task drawn twice in a step (``tasks_per_step`` beyond the split) makes
# two groups of ``group_size``, not one of twice that (rllm.engine.training.task_repeats).
REPEAT_KEY = "task_repeat"


def group_trajectories(
    episodes: Iterable[Episode], config: AlgorithmConfig | None = None
) -> list[TrajectoryGroup]:
    """Group every trajectory by (task_id, drawing, trajectory name), in order of first
    appearance; the drawing is ``metadata[REPEAT_KEY]`` (0 when absent).

    Each group records the episode id and termination reason of every member, so filters can
    mask by termination later. ``config`` is accepted for symmetry with the other transforms.
    """
    buckets: dict[tuple[str, int, str], TrajectoryGroup] = {}
    for episode in episodes:
        if not isinstance(episode, Episode):
            raise AlgorithmInputError(f"expected Episode objects, got {type(episode).__name__}")
        repeat = episode.metadata.get(REPEAT_KEY, 0)
        for trajectory in episode.trajectories:
            key = (episode.task_id, repeat if isinstance(repeat, int) else 0, trajectory.role)
            group = buckets.get(key)
            if group is None:
                group = buckets[key] = TrajectoryGroup(task_id=episode.task_id, role=trajectory.role)
            group.trajectories.append(trajectory)
            group.episode_ids.append(episode.id)
            group.termination_reasons.append(episode.termination_reason)
    return list(buckets.values())


def trajectory_reward(trajectory: Trajectory) -> float | None:
    """The trajectory's reward, else its last step's reward, else None."""
    if trajectory.reward is not None:
        return float(trajectory.reward)
    if trajectory.steps and trajectory.steps[-1].reward is not None:
        return float(trajectory.steps[-1].reward)
    return None


def group_rewards(groups: Sequence[TrajectoryGroup]) -> tuple[np.ndarray, np.ndarray]:
    """All rewards of ``groups`` flattened: (rewards float64 [n], group index int64 [n]).

    Raises RewardError naming the episode and trajectory when a reward is missing or not finite,
    and says so when a group mixes rewarded and unrewarded trajectories (usually failed rollouts
    that should be masked with ``mask_terminations``).
    """
    sizes = np.fromiter((len(g.trajectories) for g in groups), dtype=np.int64, count=len(groups))
    rewards = np.empty(int(sizes.sum()), dtype=np.float64)
    row = 0
    for group in groups:
        missing: list[int] = []
        for i, trajectory in enumerate(group.trajectories):
            value = trajectory_reward(trajectory)
            if value is None:
                missing.append(i)
                value = math.nan
            elif not math.isfinite(value):
                raise RewardError(f"reward of {_where(group, i)} is {value}; rewards must be finite")
            rewards[row + i] = value
        if missing:
            _raise_missing(group, missing)
        row += len(group.trajectories)
    return rewards, np.repeat(np.arange(len(groups), dtype=np.int64), sizes)


def _raise_missing(group: TrajectoryGroup, missing: list[int]) -> None:
    where = ", ".join(_where(group, i) for i in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    hint = "set Trajectory.reward or the last Step.reward"
    if len(missing) < len(group.trajectories):
        raise RewardError(
            f"group (task {group.task_id!r}, trajectory {group.role!r}) mixes rewarded and unrewarded "
            f"trajectories; no reward on {where}{more}. {hint}, or mask failed rollouts with "
            "`mask_terminations`"
        )
    raise RewardError(
        f"no reward on {where}{more} (neither a trajectory reward nor a last-step reward); {hint}"
    )


def _where(group: TrajectoryGroup, i: int) -> str:
    episode = group.episode_ids[i] if i < len(group.episode_ids) else "?"
    return f"episode {episode!r} trajectory {group.role!r} (task {group.task_id!r})"
