"""``rollout.curriculum``: draw each step's tasks by their recent pass rate, and move a
difficulty-parameterised generator up a level when the run passes its current one.

A task's pass rate ``p`` is the share of its last ``window`` rollouts (trajectories, of every
role; ``rllm.engine.training.learning_watch.TaskOutcomes`` keeps them) whose reward is at least
``pass_reward``. Its weight is

    w(p) = 4·p·(1 − p) + (1 − p)·unsolved_weight + p·solved_weight

so a task the policy sometimes passes and sometimes fails (its groups carry a learning signal)
weighs most, one it always fails weighs ``unsolved_weight`` and one it always passes
``solved_weight``: both are > 0, so no task is ever left out. The defaults (2 and 0.1) spend
little on solved tasks and keep a task not yet passed drawn as often as one being learned (a
task starved of rollouts before its first pass may never get one). A task not
yet seen counts as ``p = 0.5`` (it is drawn early).

Each draw picks task ``i`` with probability ``w_i / Σ w`` (with replacement: a task may be drawn
twice in a step, its rollouts then form one group). Draw number ``k`` takes the point
``u_k = (u_0 + k·φ) mod 1`` (φ the golden ratio's fraction, ``u_0`` drawn from the seed) on the
weights laid end to end: each ``u_k`` is uniform over seeds, so the probability holds, and
consecutive points spread evenly, so a step's batch holds each task about in proportion to its
weight (independent draws would leave a task of small share out of a step as often as not; with
equal weights this is close to the plain epoch order). The draws are a pure function of the seed,
the draw count and the record, all of which a checkpoint holds: a resumed run draws exactly the
tasks the uninterrupted run would have drawn.

Promotion (``promote``): a cookbook whose tasks come in difficulty levels (``rllm.sdk.cookbook.
DifficultyLevels``) starts at level 0; once the rollouts of the last ``promote_steps`` steps at the
current level pass at a rate of at least ``promote``, the run moves to the next level's tasks.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence

import msgspec

from rllm.types.errors import InvariantError

BANDS = ("unseen", "unsolved", "learning", "solved")


class CurriculumSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``rollout.curriculum``: see the module docstring for the weighting."""

    enabled: bool = False  # draw tasks by their pass rate (False: the seeded epoch order)
    window: int = 16  # a task's pass rate is over its last ``window`` rollouts
    pass_reward: float = 1.0  # a rollout passes when its reward is at least this
    # The weight of a task every recent rollout failed: as much as one being learned (2 vs at
    # most 2.05), so a task not yet passed keeps its share of rollouts until one passes it (at 0.5
    # such tasks starved and RL levelled off at 7/8 on say-single: benchmarks/history/issue-51.md,
    # "#51 round 1").
    unsolved_weight: float = 2.0
    solved_weight: float = 0.1  # the weight of a task every recent rollout passed
    promote: float | None = None  # move up a difficulty level at this pass rate (None: never)
    promote_steps: int = 5  # ... measured over this many steps at the current level

    def __post_init__(self) -> None:
        if self.window < 1:
            raise InvariantError(f"window must be >= 1, got {self.window}", "window")
        if not math.isfinite(self.pass_reward):
            raise InvariantError(f"pass_reward must be finite, got {self.pass_reward}", "pass_reward")
        for name in ("unsolved_weight", "solved_weight"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise InvariantError(
                    f"{name} must be a finite number > 0 (a floor: every task is still drawn now "
                    f"and then), got {value}",
                    name,
                )
        if self.promote is not None and not (0.0 < self.promote <= 1.0):
            raise InvariantError(f"promote must be a pass rate in (0, 1], got {self.promote}", "promote")
        if self.promote_steps < 1:
            raise InvariantError(f"promote_steps must be >= 1, got {self.promote_steps}", "promote_steps")


def pass_rate(rewards: Sequence[float] | None, pass_reward: float) -> float | None:
    """The share of ``rewards`` at least ``pass_reward``; None for a task not seen yet."""
    if not rewards:
        return None
    return sum(r >= pass_reward for r in rewards) / len(rewards)


def task_weight(p: float | None, settings: CurriculumSettings) -> float:
    """w(p) = 4·p·(1 − p) + (1 − p)·unsolved_weight + p·solved_weight; an unseen task as p = 0.5."""
    p = 0.5 if p is None else p
    return 4.0 * p * (1.0 - p) + (1.0 - p) * settings.unsolved_weight + p * settings.solved_weight


def band(p: float | None) -> str:
    """unseen, unsolved (p = 0), learning (0 < p < 1) or solved (p = 1)."""
    if p is None:
        return "unseen"
    return "unsolved" if p == 0.0 else "solved" if p == 1.0 else "learning"


GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0  # the step of the draws' low-discrepancy sequence


def draw(cumulative: Sequence[float], seed: int, number: int) -> int:
    """The index drawn by draw ``number`` of a run seeded ``seed``: ``i`` with probability
    ``w_i / Σ w``, where ``cumulative`` holds the running sums of the weights."""
    start = random.Random(f"{seed}:curriculum").random()
    target = math.fmod(start + number * GOLDEN, 1.0) * cumulative[-1]
    return min(bisect.bisect_right(cumulative, target), len(cumulative) - 1)


def effective_tasks(weights: Sequence[float]) -> float:
    """The effective dataset size (Kish): (Σ w)² / Σ w², the number of equally weighted tasks
    that would spread the draws as evenly; the task count when every weight is equal."""
    total = math.fsum(weights)
    squares = math.fsum(w * w for w in weights)
    return total * total / squares if squares > 0 else 0.0


def band_metrics(rates: Sequence[float | None], weights: Sequence[float]) -> dict[str, float]:
    """``curriculum/*``: the share of tasks in each band and the effective dataset size."""
    n = len(rates) or 1
    counts: dict[str, int] = dict.fromkeys(BANDS, 0)
    for p in rates:
        counts[band(p)] += 1
    out = {f"curriculum/tasks_{name}": counts[name] / n for name in BANDS}
    out["curriculum/effective_tasks"] = effective_tasks(weights)
    return out


class LevelState(msgspec.Struct, kw_only=True):
    """Where promotion stands (a checkpoint holds it): the level, and the (passed, rollouts) of
    each step at it so far (the last ``promote_steps``)."""

    level: int = 0
    steps: list[tuple[int, int]] = msgspec.field(default_factory=list)

    def observe(self, passed: int, rollouts: int, settings: CurriculumSettings, top: int) -> bool:
        """Count one step's rollouts at this level; True when the run moves up a level now."""
        self.steps = [*self.steps, (passed, rollouts)][-settings.promote_steps :]
        if settings.promote is None or self.level >= top or len(self.steps) < settings.promote_steps:
            return False
        done = sum(r for _, r in self.steps)
        if done == 0 or sum(p for p, _ in self.steps) / done < settings.promote:
            return False
        self.level += 1
        self.steps = []
        return True

    def pass_rate(self) -> float:
        done = sum(r for _, r in self.steps)
        return sum(p for p, _ in self.steps) / done if done else 0.0
