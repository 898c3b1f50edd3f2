"""A batch of rollouts: ``n`` per task, run ``width`` at a time, each task's group handed on as
soon as its last rollout ends (the RolloutEngine's ``run`` / ``stream`` / ``stream_indexed``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable

from rllm.engine.rollout.rollout_progress import RolloutProgress
from rllm.types import Episode, Task


async def stream_groups(
    run_one: Callable[[int, int], Awaitable[Episode]],
    tasks: list[Task],
    n: int,
    *,
    width: int,
    slots: asyncio.Semaphore | None,
    progress: RolloutProgress,
) -> AsyncGenerator[tuple[int, list[Episode]], None]:
    """``(index in tasks, its n episodes by rollout_index)`` for each task as its group completes.

    ``run_one(index in tasks, rollout_index)`` runs one rollout (it never raises); at most ``width`` run
    at once, each also holding one of ``slots`` while it runs when given (a limit shared with
    other batches). Rollouts start in task-major order, so early tasks complete early (streamed
    eval results, resumability). Closing the generator cancels the rollouts still running."""
    total = len(tasks) * n
    if total == 0:
        return
    pending: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for ti in range(len(tasks)):
        for ri in range(n):
            pending.put_nowait((ti, ri))
    results: list[list[Episode | None]] = [[None] * n for _ in tasks]
    remaining = [n] * len(tasks)
    finished: asyncio.Queue[int] = asyncio.Queue()

    async def worker() -> None:
        while True:
            try:
                ti, ri = pending.get_nowait()
            except asyncio.QueueEmpty:
                return
            if slots is None:
                episode = await run_one(ti, ri)
            else:
                async with slots:
                    episode = await run_one(ti, ri)
            results[ti][ri] = episode
            progress.update(episode)
            remaining[ti] -= 1
            if remaining[ti] == 0:
                finished.put_nowait(ti)

    workers = [asyncio.create_task(worker()) for _ in range(min(width, total))]
    try:
        for _ in range(len(tasks)):
            ti = await finished.get()
            yield ti, [ep for ep in results[ti] if ep is not None]
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
