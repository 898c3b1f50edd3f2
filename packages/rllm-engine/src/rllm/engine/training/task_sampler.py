"""TaskSampler: which tasks a run rolls out next, and what it has seen of them so far.

Both loops take their tasks here (the synchronous step a batch at a time, the asynchronous one a
task at a time) and report each batch's or group's episodes back (``observe``) as soon as they are
in, so the next draw already knows them; ``end_step`` closes a step (promotion, ``curriculum/*``
metrics). The order is the seeded epoch order (rllm.engine.training.data_order) unless
``rollout.curriculum.enabled``, which draws by pass rate (rllm.engine.training.curriculum). Either
way the draws are a pure function of the seed, the cursor (``DataCursor``) and the per-task
record (``TaskOutcomes``), which a checkpoint holds (``SamplerState``): a resumed run sees the
tasks the uninterrupted one would have seen.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import msgspec

from rllm.algos.grouping import group_trajectories, trajectory_reward
from rllm.engine.training.curriculum import (
    CurriculumSettings,
    LevelState,
    band_metrics,
    draw,
    pass_rate,
    task_weight,
)
from rllm.engine.training.data_order import DataCursor, next_batch
from rllm.engine.training.learning_watch import TaskOutcomes
from rllm.engine.training.sampler_state import SamplerState
from rllm.types import ConfigError, Episode, Task
from rllm.types.errors import InputError

if TYPE_CHECKING:
    from rllm.engine.training.trainer_config import TrainerConfig
    from rllm.sdk.cookbook import Cookbook, DifficultyLevels

log = logging.getLogger(__name__)


class TaskSampler:
    """The training split's tasks (at the current difficulty level) and how to draw them."""

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        seed: int,
        settings: CurriculumSettings,
        levels: DifficultyLevels | None = None,
        split: str = "train",
    ) -> None:
        self.seed, self.settings, self.levels, self.split = seed, settings, levels, split
        self.outcomes = TaskOutcomes(window=settings.window)
        self.level = LevelState()
        self._top = levels.level_count() - 1 if levels is not None else 0
        self._known: dict[str, Task] = {}  # every task of every level loaded (unconsumed ids)
        self._set_tasks(list(tasks))

    def _set_tasks(self, tasks: list[Task]) -> None:
        if not tasks:
            raise InputError(f"the training split {self.split!r} has no tasks")
        self.tasks = tasks
        self._known.update((t.id, t) for t in tasks)
        self._ids = {t.id for t in tasks}
        self._cumulative: list[float] | None = None

    @property
    def reports(self) -> bool:
        """Whether steps log ``curriculum/*`` (the curriculum or promotion is on)."""
        return self.settings.enabled or self.settings.promote is not None

    # The draws ------------------------------------------------------------------------------
    def next_batch(self, size: int, position: DataCursor) -> tuple[list[Task], DataCursor]:
        """The next ``size`` tasks from ``position``, and the cursor after them."""
        if position.level != self.level.level:  # promoted: the new level's order starts afresh
            position = DataCursor(draws=position.draws, level=self.level.level)
        if not self.settings.enabled:
            return next_batch(self.tasks, size, self.seed, position)
        cumulative = self._weights_cumulative()
        picked = [self.tasks[draw(cumulative, self.seed, position.draws + i)] for i in range(size)]
        return picked, msgspec.structs.replace(position, draws=position.draws + size)

    def weights(self) -> list[float]:
        """Each task's weight now, in task order (rllm.engine.training.curriculum.task_weight)."""
        return [task_weight(p, self.settings) for p in self.pass_rates()]

    def pass_rates(self) -> list[float | None]:
        return [pass_rate(self.outcomes.recent(t.id), self.settings.pass_reward) for t in self.tasks]

    def _weights_cumulative(self) -> list[float]:
        if self._cumulative is None:
            self._cumulative = list(itertools.accumulate(self.weights()))
        return self._cumulative

    def find(self, task_ids: Iterable[str]) -> list[Task]:
        """The tasks of ``task_ids`` (a checkpoint's unconsumed ones), of any level loaded."""
        ids = list(task_ids)
        missing = [i for i in ids if i not in self._known]
        if missing:
            raise InputError(
                f"the checkpoint's unconsumed tasks {missing[:3]} are not in the training split; "
                "resume with the split the run was started with"
            )
        return [self._known[i] for i in ids]

    # What the run saw -----------------------------------------------------------------------
    def observe(self, episodes: Sequence[Episode]) -> dict[str, float]:
        """Record finished episodes (one appearance of each of their tasks); the record's metric."""
        metrics = self.outcomes.observe(group_trajectories(episodes))
        self._cumulative = None
        return metrics

    def end_step(self, episodes: Sequence[Episode]) -> dict[str, float]:
        """Close a step on its episodes: count them towards promotion (moving up a level when the
        run passed this one) and return the step's ``curriculum/*`` metrics."""
        if not self.reports:
            return {}
        promoted = False
        if self.levels is not None:
            passed = rollouts = 0
            for group in group_trajectories(e for e in episodes if e.task_id in self._ids):
                rewards = [trajectory_reward(t) or 0.0 for t in group.trajectories]
                passed += sum(r >= self.settings.pass_reward for r in rewards)
                rollouts += len(rewards)
            promoted = self.level.observe(passed, rollouts, self.settings, self._top)
            if promoted:
                self._set_tasks(self.levels.load_level(self.split, self.level.level))
                log.info("rollout.curriculum.promote: moved up to level %d", self.level.level)
        rates = self.pass_rates()
        weights = self.weights() if self.settings.enabled else [1.0] * len(rates)
        metrics = band_metrics(rates, weights)
        if self.levels is not None:
            metrics["curriculum/level"] = float(self.level.level)
            metrics["curriculum/level_pass_rate"] = self.level.pass_rate()
            metrics["curriculum/promoted"] = float(promoted)
        return metrics

    # Checkpoints ----------------------------------------------------------------------------
    def state(self) -> SamplerState:
        return SamplerState(tasks=self.outcomes.snapshot(), level=msgspec.structs.replace(self.level))

    def restore(self, state: SamplerState) -> None:
        self.outcomes.restore(state.tasks)
        if state.level.level != self.level.level:
            if self.levels is None or state.level.level > self._top:
                raise InputError(
                    f"the checkpoint is at difficulty level {state.level.level}, which this run's "
                    "cookbook does not have; resume with the cookbook and rollout.curriculum.promote "
                    "the run was started with"
                )
            for level in range(self.level.level + 1, state.level.level + 1):
                self._set_tasks(self.levels.load_level(self.split, level))
        self.level = msgspec.structs.replace(state.level)
        self._cumulative = None


def sampler_for(config: TrainerConfig, cookbook: Cookbook) -> TaskSampler:
    """The run's sampler: the train split, or with ``rollout.curriculum.promote`` the cookbook's
    difficulty levels from level 0 (refused, naming the key, for a cookbook without levels)."""
    settings = config.rollout.curriculum
    levels = check_curriculum(config, cookbook)
    tasks = (
        levels.load_level(config.train_split, 0)
        if levels is not None
        else cookbook.load_tasks(config.train_split)
    )
    return TaskSampler(tasks, seed=config.seed, settings=settings, levels=levels, split=config.train_split)


def check_curriculum(config: TrainerConfig, cookbook: Cookbook) -> DifficultyLevels | None:
    """The cookbook's levels when ``rollout.curriculum.promote`` asks for them (None when it does
    not); a ConfigError naming the key when the cookbook has none, or none for the train split."""
    if config.rollout.curriculum.promote is None:
        return None
    levels = cookbook.levels
    if levels is None:
        raise ConfigError.for_key(
            "rollout.curriculum.promote",
            f"cookbook {cookbook.name!r} has no difficulty levels to move up (Cookbook.levels, "
            "rllm.sdk.cookbook.DifficultyLevels); unset it",
        )
    if levels.level_count() < 2:
        raise ConfigError.for_key(
            "rollout.curriculum.promote", f"cookbook {cookbook.name!r} has a single difficulty level"
        )
    try:
        levels.load_level(config.train_split, 0)
    except (ValueError, KeyError, LookupError) as exc:
        raise ConfigError.for_key("train_split", f"no difficulty levels: {exc}") from None
    return levels
