"""Say so when a run cannot learn: steps in a row with no learning signal, and tasks that never
give one.

A step has no learning signal when no trained sequence has a nonzero advantage: every group was
filtered out, or every group's rollouts got the same reward (zero variance: GRPO's advantages
are all 0). The run goes on, its loss zero and its weights moving at most on the optimizer's
momentum, and without this warning nothing tells the user.

A run can also learn most of its tasks and lose one for good: when no rollout of a task is ever
rewarded, its groups have zero variance, it never trains, and the mean reward levels off below what
the model could reach (RL from scratch on ``say-single`` levels off at 7/8 that way; see
benchmarks/history/issue-31.md, "Issue #31 — `distill_vs_rl.py`, quiet machine").
``UnrewardedTaskWatch`` counts such tasks per step and names them at the end of the run; it does not
warn mid-run, since early in training most tasks are unrewarded and that is no fault.
"""

from __future__ import annotations

from collections.abc import Sequence

from rllm.algos.grouping import trajectory_reward
from rllm.types import TrajectoryGroup

NO_LEARNING_STEPS = 3  # consecutive steps without a learning signal before the warning

NO_LEARNING_WARNING = (
    "no learning signal in {steps} steps in a row: no trained sequence had a nonzero advantage "
    "(every group was filtered out, or all rollouts of each task got the same reward), so the "
    "model has learned nothing. Try a larger group_size, a higher rollout.sampling.temperature, a stronger or "
    "better-suited model (backend.options.model), or an easier task; `rllm view` shows the episodes."
)


class NoLearningWatch:
    """Counts consecutive steps without a learning signal (``observe`` takes the step's
    ``train/signal_sequences``); returns the warning once."""

    def __init__(self, steps: int = NO_LEARNING_STEPS) -> None:
        self.steps = steps
        self.idle = 0
        self.warned = False

    def observe(self, signal_sequences: int) -> str | None:
        self.idle = 0 if signal_sequences else self.idle + 1
        if self.idle >= self.steps and not self.warned:
            self.warned = True
            return NO_LEARNING_WARNING.format(steps=self.idle)
        return None


UNREWARDED_APPEARANCES = 5  # a task's groups in a row with no rewarded rollout before it counts
UNREWARDED_NAMED = 5  # tasks named in the end-of-run warning; the rest are counted


class UnrewardedTaskWatch:
    """Tasks none of whose rollouts got a reward > 0 in each of their last ``appearances`` groups.

    ``observe`` takes a step's groups (before filtering; a task's groups of every role count
    together) and returns the step's metric; ``summary`` is the end-of-run warning, or None.
    The streaks restart on ``--resume`` (they are a diagnosis, not state to train from).
    """

    def __init__(self, appearances: int = UNREWARDED_APPEARANCES) -> None:
        self.appearances = appearances
        self.streaks: dict[str, int] = {}  # task id -> unrewarded groups in a row
        self.rollouts: dict[str, int] = {}  # task id -> rollouts over that streak

    def observe(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        rewarded: dict[str, bool] = {}
        rollouts: dict[str, int] = {}
        for group in groups:
            hit = any((trajectory_reward(t) or 0.0) > 0.0 for t in group.trajectories)
            rewarded[group.task_id] = rewarded.get(group.task_id, False) or hit
            rollouts[group.task_id] = rollouts.get(group.task_id, 0) + len(group.trajectories)
        for task, hit in rewarded.items():
            if hit:
                self.streaks.pop(task, None)
                self.rollouts.pop(task, None)
            else:
                self.streaks[task] = self.streaks.get(task, 0) + 1
                self.rollouts[task] = self.rollouts.get(task, 0) + rollouts[task]
        return {"filter/tasks_unrewarded": float(len(self.unrewarded()))}

    def unrewarded(self) -> list[str]:
        return [task for task, streak in self.streaks.items() if streak >= self.appearances]

    def summary(self) -> str | None:
        tasks = self.unrewarded()
        if not tasks:
            return None
        named = ", ".join(f"{t} (0 of {self.rollouts[t]})" for t in tasks[:UNREWARDED_NAMED])
        more = f" and {len(tasks) - UNREWARDED_NAMED} more" if len(tasks) > UNREWARDED_NAMED else ""
        return (
            f"{len(tasks)} task(s) got no reward in any rollout of their last {self.appearances} or more "
            f"groups: {named}{more}. Their groups have zero variance, so they never train and the "
            "mean reward levels off below what the model may reach. Try a larger group_size, a "
            "higher rollout.sampling.temperature, or SFT first (`rllm sft`); `rllm view` shows their "
            "episodes."
        )
