"""Seeded, resumable batch order over a task list.

The order is a pure function of (seed, epoch): a resumed run that restores (epoch, cursor)
sees exactly the batch it would have seen without the interruption; no RNG state to carry.
(``rollout.curriculum`` draws by pass rate instead, with the same property:
rllm.engine.training.task_sampler.)
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec

from rllm.types import Task
from rllm.types.errors import InputError


class DataCursor(msgspec.Struct, kw_only=True):
    epoch: int = 0
    cursor: int = 0  # index into the epoch's permutation of the next task to hand out
    draws: int = 0  # rollout.curriculum: tasks drawn so far (each draw is seeded by its number)
    level: int = 0  # rollout.curriculum.promote: the difficulty level epoch and cursor refer to


def epoch_order(n_tasks: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n_tasks))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def next_batch(
    tasks: Sequence[Task], size: int, seed: int, position: DataCursor
) -> tuple[list[Task], DataCursor]:
    """The next ``size`` tasks and the cursor after them; an epoch's tail spills into the next epoch."""
    if not tasks:
        raise InputError("the training split has no tasks")
    batch: list[Task] = []
    epoch, cursor = position.epoch, position.cursor
    order = epoch_order(len(tasks), seed, epoch)
    while len(batch) < size:
        if cursor >= len(order):
            epoch, cursor = epoch + 1, 0
            order = epoch_order(len(tasks), seed, epoch)
        take = order[cursor : cursor + size - len(batch)]
        batch.extend(tasks[i] for i in take)
        cursor += len(take)
    return batch, msgspec.structs.replace(position, epoch=epoch, cursor=cursor)
