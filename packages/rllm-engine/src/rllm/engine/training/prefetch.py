"""The synchronous loop's next-step rollouts, started while this step trains (``rollout.prefetch``).

Step N+1's tasks do not depend on step N's update, only its samples do. Once step N's episodes
are in, the Trainer pauses the gateway (nothing is in flight, so the pause takes hold at once),
starts step N+1's rollouts and trains step N. The new rollouts do everything up to their first
model call meanwhile (client set-up, building the request, an environment reset, a sandbox
start); the call then waits at the gateway's door (``CallLedger.wait_admitted``), before its
trace is opened and stamped with a weight version. The Trainer syncs the new weights, sets the
new version and resumes: every prefetched call is sampled from, and stamped with, step N's new
weights, exactly as if it had started after the sync. A rollout's deadline stands still while
its call waits (``rllm.engine.rollout.flow_runner.DeadlineClock``).

The batch is the one ``next_batch`` gives step N+1 (the cursor after step N's), so the data
order, checkpoints and resume are those of a run without prefetch; a step that fails or is
interrupted cancels the prefetched rollouts (their sessions are deleted with them).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from rllm.engine.training.data_order import DataCursor
from rllm.types import Episode, Task


@dataclass(slots=True)
class Prefetched:
    """Rollouts of the batch ``next_batch`` draws from ``data``, started ahead of their step."""

    data: DataCursor  # the cursor the batch was drawn from (the step's own ``state.data``)
    tasks: list[Task]
    next_data: DataCursor
    rollouts: asyncio.Task[list[Episode]]

    async def cancel(self) -> None:
        """Cancel the rollouts and wait until they have ended (their sessions deleted)."""
        self.rollouts.cancel()
        # wait(), not await: a second Ctrl-C meanwhile still reaches the caller.
        await asyncio.wait([self.rollouts])
        if not self.rollouts.cancelled():
            self.rollouts.exception()  # retrieved: it ended before the cancel, nobody trains on it


def prefetch_allowed(
    completed: int, total_steps: int, val_every: int, ckpt_every: int, validating: bool
) -> bool:
    """Whether the step that ends at ``completed`` may start the next step's rollouts.

    Not after the last step (nothing follows), nor when a validation or a checkpoint follows
    it: those run on the weights and state of step ``completed`` with nothing else in flight,
    as without prefetch (a checkpoint's RNG state then is the one a resumed run restores).
    """
    if completed >= total_steps:
        return False
    if validating and val_every and completed % val_every == 0:
        return False
    return not (ckpt_every and completed % ckpt_every == 0)
