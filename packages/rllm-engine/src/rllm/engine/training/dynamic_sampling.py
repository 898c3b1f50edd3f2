"""``algorithm.dynamic_sampling``: a step keeps rolling out groups until it holds
``tasks_per_step`` groups that carry a learning signal, or has taken ``max_extra_groups`` more
groups than ``tasks_per_step`` (the cap).

A group is one task's ``group_size`` rollouts, as the step dispatched them (a task drawn twice
is two groups here, though its rollouts then train as one group). It carries a signal when the
filters would keep it with ``filter_zero_variance`` on: after masked terminations and the
minimum size, its rewards are not all equal (under turn credit, or its turns differ), so a
group-relative estimator gives it nonzero advantages (``rllm.algos.filters``).

Both loops count the same way (``SignalCount``). The synchronous step rolls out its first round
of groups, then, while it is short, as many more as it is short (within the cap). Its first round
is ``tasks_per_step`` groups plus the shortfall the previous step's share of signal groups
predicts (``first_round``, within the cap), as DAPO's generation batch oversamples: a round of
rollouts waits for its slowest, so one larger round costs less wall time than a second round
after the first; a step that still falls short tops up as before, and one that overshoots keeps
every group it took (more signal groups than asked). The asynchronous step takes finished groups
within the staleness bound until the count is met, so a stale group is never counted. Every group
taken is in the step's batch (its rewards in the step's reward metrics, its task in
``batch/task_ids``); groups without a signal train with zero advantages, or are dropped with
``filter_zero_variance`` (DAPO's setting; on say-single, one seed paired, it took 72 steps to 0.9
against 67 and no less train time a step: the tiny model's update barely costs per row). A step that hits the cap short of its
count says so: ``dynamic_sampling/capped`` in its metrics and, the first time, one warning line;
the run's end repeats how many steps it was.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from rllm.algos.config import AlgorithmConfig
from rllm.algos.filters import filter_groups
from rllm.algos.grouping import group_trajectories
from rllm.engine.rollout.rollout_config import task_drawings
from rllm.engine.training.task_repeats import mark_task_repeats
from rllm.types import Episode, Task

if TYPE_CHECKING:
    from rllm.engine.training.data_order import DataCursor
    from rllm.engine.training.task_sampler import TaskSampler

CAPPED_WARNING = (
    "algorithm.dynamic_sampling: step {step} reached max_extra_groups={cap} with {signal} of "
    "{want} groups carrying a learning signal (the rest of its groups' rewards were all equal); "
    "the step trains on what it has. Raise max_extra_groups or group_size; rollout.curriculum "
    "draws the tasks that still teach more often."
)


def max_extra_groups(algorithm: AlgorithmConfig, want: int) -> int:
    """The cap: groups a step may take beyond ``want`` (``tasks_per_step``); 0 when it is off."""
    settings = algorithm.dynamic_sampling
    if not settings.enabled:
        return 0
    return want if settings.max_extra_groups is None else settings.max_extra_groups


def first_round(algorithm: AlgorithmConfig, want: int, signal_rate: float | None) -> int:
    """Groups the synchronous step rolls out at once: ``want`` (``tasks_per_step``), plus, with
    dynamic sampling, the extra groups that ``signal_rate`` (the previous step's share of groups
    with a signal; None before the first step) predicts the step needs to hold ``want`` signal
    groups, ``ceil(want / signal_rate) - want``, within the cap (the whole cap at a rate of 0)."""
    cap = max_extra_groups(algorithm, want)
    if cap == 0 or signal_rate is None:
        return want
    rate = min(signal_rate, 1.0)
    if rate * (want + cap) < want:  # (a rate of 0, too) even the whole cap is predicted short
        return want + cap
    # The tolerance keeps float noise (4 / (1/3) = 12.000000000000002) from one more group.
    return max(want, math.ceil(want / rate - 1e-9))


def signal_rate(metrics: dict[str, float]) -> float | None:
    """A step's share of groups with a signal, from its ``dynamic_sampling/*`` metrics (None
    without them): what ``first_round`` sizes the next step by."""
    groups = metrics.get("dynamic_sampling/groups")
    if not groups:
        return None
    return metrics["dynamic_sampling/signal_groups"] / groups


def has_signal(episodes: Sequence[Episode], algorithm: AlgorithmConfig) -> bool:
    """Whether one group's episodes would survive ``filter_zero_variance`` (``algorithm`` with it on)."""
    kept, _ = filter_groups(group_trajectories(episodes), algorithm)
    return bool(kept)


class SignalCount:
    """One step's count of groups and of those with a signal, against ``want`` and the cap."""

    def __init__(self, algorithm: AlgorithmConfig, want: int) -> None:
        self.enabled = algorithm.dynamic_sampling.enabled
        self.want = want
        self.cap = max_extra_groups(algorithm, want)
        self._test = msgspec.structs.replace(algorithm, filter_zero_variance=True)
        self.groups = 0
        self.signal = 0

    def add(self, episodes: Sequence[Episode]) -> None:
        """Count one group (its episodes)."""
        self.groups += 1
        if self.enabled:
            self.signal += has_signal(episodes, self._test)

    def add_batch(self, episodes: Sequence[Episode], group_size: int) -> None:
        """Count a batch of groups, ``group_size`` episodes each in dispatch order (``RolloutEngine.run``)."""
        for start in range(0, len(episodes), group_size):
            self.add(episodes[start : start + group_size])

    @property
    def extra(self) -> int:
        return max(0, self.groups - self.want)

    def missing(self) -> int:
        """Groups still to take: up to ``want`` at first, then (dynamic sampling) as many as
        the signal count is short of ``want``, within the cap; 0 when the step is complete."""
        if self.groups < self.want:
            return self.want - self.groups
        if not self.enabled:
            return 0
        return max(0, min(self.want - self.signal, self.cap - self.extra))

    @property
    def capped(self) -> bool:
        return self.enabled and self.signal < self.want and self.extra >= self.cap

    def metrics(self) -> dict[str, float]:
        if not self.enabled:
            return {}
        return {
            "dynamic_sampling/signal_groups": float(self.signal),
            "dynamic_sampling/groups": float(self.groups),
            "dynamic_sampling/extra_groups": float(self.extra),
            "dynamic_sampling/capped": float(self.capped),
        }


class CapWatch:
    """Counts the steps that hit the cap (``observe`` takes a step's metrics); returns the first
    one's warning line, and ``summary`` the end-of-run line."""

    def __init__(self, algorithm: AlgorithmConfig, want: int) -> None:
        self.want = want
        self.cap = max_extra_groups(algorithm, want)
        self.capped_steps = 0
        self.steps = 0

    def observe(self, step: int, metrics: dict[str, object]) -> str | None:
        if "dynamic_sampling/capped" not in metrics:
            return None
        self.steps += 1
        if not metrics["dynamic_sampling/capped"]:
            return None
        self.capped_steps += 1
        if self.capped_steps > 1:
            return None
        signal = int(metrics["dynamic_sampling/signal_groups"])  # type: ignore[call-overload]
        return CAPPED_WARNING.format(step=step, cap=self.cap, signal=signal, want=self.want)

    def summary(self) -> str | None:
        if not self.capped_steps:
            return None
        return (
            f"algorithm.dynamic_sampling reached max_extra_groups={self.cap} in {self.capped_steps} "
            f"of {self.steps} steps short of {self.want} groups with a learning signal "
            "(dynamic_sampling/capped in metrics.jsonl)."
        )


async def fill_step(
    sampler: TaskSampler,
    run: Callable[[list[Task], list[int]], Awaitable[list[Episode]]],
    algorithm: AlgorithmConfig,
    sizes: tuple[int, int],
    drawn: tuple[list[Task], DataCursor, list[Episode]],
) -> tuple[list[Task], DataCursor, list[Episode], dict[str, float]]:
    """The synchronous step's batch from its first round of groups (``drawn``: their tasks, the
    cursor after them, their episodes, ``first_round`` groups of them; ``sizes``:
    ``tasks_per_step`` and ``group_size``). Each round of
    episodes is recorded in the sampler as it comes in (its next draw knows them); while the count
    is short (``SignalCount.missing``), ``run`` rolls out that many more groups (with each
    task's drawing number in the step, counting the earlier rounds: ``task_drawings``). Returns the
    batch's tasks, the cursor after them, their episodes and the metrics of the draw."""
    want, group_size = sizes
    tasks, next_data, episodes = drawn
    mark_task_repeats(episodes)  # the sampler records each drawing of a task apart
    sampled = sampler.observe(episodes)
    count = SignalCount(algorithm, want)
    count.add_batch(episodes, group_size)
    while (missing := count.missing()) > 0:
        more, next_data = sampler.next_batch(missing, next_data)
        # A task the step drew before is a new drawing: new samples, not copies of the first.
        more_episodes = await run(more, task_drawings(more, tasks))
        mark_task_repeats(more_episodes)
        sampled = sampler.observe(more_episodes)
        count.add_batch(more_episodes, group_size)
        tasks, episodes = [*tasks, *more], [*episodes, *more_episodes]
    return tasks, next_data, episodes, {**sampled, **count.metrics(), **sampler.end_step(episodes)}
