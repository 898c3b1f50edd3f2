"""What a checkpoint keeps of the task sampler: each task's record and the difficulty level.

Plain structs, apart from the code that fills them (``learning_watch``, ``task_sampler``), so that
reading a checkpoint (``checkpoint``, and with it commands like ``rllm export``) imports no
numerics.
"""

from __future__ import annotations

import msgspec

from rllm.engine.training.curriculum import LevelState


class TaskRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One task's outcomes so far (a checkpoint holds one per task seen)."""

    # The rewards of its last ``window`` trajectories (rollouts, of every role), oldest first.
    recent: list[float] = msgspec.field(default_factory=list)
    # Appearances in a row with no rewarded rollout, and the rollouts over that streak.
    unrewarded_groups: int = 0
    unrewarded_rollouts: int = 0


class SamplerState(msgspec.Struct, kw_only=True):
    """What a checkpoint keeps of the sampler: the per-task record and the difficulty level."""

    tasks: dict[str, TaskRecord] = msgspec.field(default_factory=dict)
    level: LevelState = msgspec.field(default_factory=LevelState)
