"""Say so when a run cannot learn a task: tasks that never give a learning signal.

A step with no learning signal at all (no trained sequence with a nonzero advantage, steps in a
row) is the ``zero_advantage`` health check, and the other ways a run looks alive while it is not
learning are its siblings (``rllm.engine.training.health``).

A run can also learn most of its tasks and lose one for good: when no rollout of a task is ever
rewarded, its groups have zero variance, it never trains, and the mean reward levels off below what
the model could reach (RL from scratch on ``say-single`` levels off at 7/8 that way; see
benchmarks/history/issue-31.md, "Issue #31 — `distill_vs_rl.py`, quiet machine").
``TaskOutcomes`` counts such tasks per step and names them at the end of the run; it does not
warn mid-run, since early in training most tasks are unrewarded and that is no fault (for the same
reason the ``no_signal`` health check leaves groups all at the reward floor out). Nor does it warn
at the end of a run whose reward is still rising (:func:`reward_still_rising`): a short run of a
config that learns every task later (``say-single`` at step 40 of 200) has tasks not rewarded
yet, which is no sign that they never will be.

``TaskOutcomes`` is the run's one per-task record: besides those streaks it keeps each task's
last rewards, from which ``rollout.curriculum`` weighs the tasks it draws
(rllm.engine.training.curriculum). It is saved in every checkpoint and restored on ``--resume``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from rllm.algos.grouping import trajectory_reward
from rllm.engine.training.sampler_state import TaskRecord
from rllm.types import TrajectoryGroup

RISING_BY = 0.02  # the last third's mean reward above the middle third's by this much: rising
UNREWARDED_APPEARANCES = 5  # a task's groups in a row with no rewarded rollout before it counts
UNREWARDED_NAMED = 5  # tasks named in the end-of-run warning; the rest are counted
RECENT_ROLLOUTS = 16  # rewards kept per task (rollout.curriculum.window sets it for a run)


class TaskOutcomes:
    """Each task's recent rewards, and the tasks none of whose rollouts got a reward > 0 in each of
    their last ``appearances`` appearances.

    ``observe`` takes the groups of one appearance batch (before filtering; a task's groups of
    every role count together: one appearance) and returns the step's metric; ``summary`` is the
    end-of-run warning, or None; ``recent(task)`` the task's last ``window`` rewards. The record
    goes into checkpoints (``snapshot``) and comes back on ``--resume`` (``restore``).
    """

    def __init__(self, appearances: int = UNREWARDED_APPEARANCES, window: int = RECENT_ROLLOUTS) -> None:
        self.appearances = appearances
        self.window = window
        self.records: dict[str, TaskRecord] = {}

    def observe(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        rewards: dict[str, list[float]] = {}
        for group in groups:
            values = [trajectory_reward(t) for t in group.trajectories]
            rewards.setdefault(group.task_id, []).extend(0.0 if r is None else r for r in values)
        for task, values in rewards.items():
            record = self.records.setdefault(task, TaskRecord())
            record.recent = (record.recent + values)[-self.window :]
            if any(r > 0.0 for r in values):
                record.unrewarded_groups = record.unrewarded_rollouts = 0
            else:
                record.unrewarded_groups += 1
                record.unrewarded_rollouts += len(values)
        return self.metrics()

    def metrics(self) -> dict[str, float]:
        return {"filter/tasks_unrewarded": float(len(self.unrewarded()))}

    def recent(self, task: str) -> list[float] | None:
        """The task's last rewards (oldest first); None for a task never seen."""
        record = self.records.get(task)
        return record.recent if record is not None and record.recent else None

    def unrewarded(self) -> list[str]:
        return [task for task, r in self.records.items() if r.unrewarded_groups >= self.appearances]

    def snapshot(self) -> dict[str, TaskRecord]:
        """A copy of the record for a checkpoint (the live one keeps changing)."""
        return copy.deepcopy(self.records)

    def restore(self, records: dict[str, TaskRecord]) -> None:
        self.records = copy.deepcopy(records)
        for record in self.records.values():
            record.recent = record.recent[-self.window :]

    def summary(self) -> str | None:
        tasks = self.unrewarded()
        if not tasks:
            return None
        named = ", ".join(
            f"{t} (0 of {self.records[t].unrewarded_rollouts})" for t in tasks[:UNREWARDED_NAMED]
        )
        more = f" and {len(tasks) - UNREWARDED_NAMED} more" if len(tasks) > UNREWARDED_NAMED else ""
        return (
            f"{len(tasks)} task(s) got no reward in any rollout of their last {self.appearances} or more "
            f"groups: {named}{more}. Their groups have zero variance, so they never train and the "
            "mean reward levels off below what the model may reach. Try a larger group_size, a "
            "higher rollout.sampling.temperature, rollout.curriculum (draws them more often) or "
            "algorithm.dynamic_sampling, or SFT first (`rllm sft`); `rllm view` shows their episodes."
        )


def reward_still_rising(rewards: Sequence[float]) -> bool:
    """Whether a run's per-step mean rewards were still going up at its end: the mean of the last
    third of the steps above the middle third's by more than ``RISING_BY`` (thirds of at least
    two steps; a run too short to tell is not rising)."""
    third = len(rewards) // 3
    if third < 2:
        return False
    middle, last = rewards[-2 * third : -third], rewards[-third:]
    return sum(last) / third > sum(middle) / third + RISING_BY
