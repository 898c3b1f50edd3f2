"""A Ray flow worker's cancels that came before their jobs, kept only while they can matter.

The driver sends a worker its jobs in batches (``FlowWorker.submit``, numbered 1, 2, 3, ... per
worker) and cancels in calls of their own (``FlowWorker.cancel``), and it cancels a job only
after sending it. Ray does not order an async actor's calls, so a cancel may find its job:

- running: the worker cancels its task (nothing is kept here);
- not arrived yet (its batch is still on the way): it is kept here, and the job is not run when
  its batch arrives;
- ended already (its result was on the way to the driver when the driver gave up on it):
  nothing is left to do. Keeping such a cancel "in case its job comes" would keep it forever:
  over a long run with many cancels the worker's memory would grow without bound.

The last two look alike to the worker, so each cancel carries the number of the last batch the
driver had sent (``sent_through``): the job is in one of the batches up to it. Once every batch
up to ``sent_through`` has arrived, the job has arrived too, so the cancel is dropped. What is
kept is thus bounded by the calls in flight, not by the length of the run.
"""

from __future__ import annotations

from collections.abc import Iterable


class EarlyCancels:
    """Which batches arrived (every one up to ``arrived_through``, and those after it that came
    early) and the cancels whose job may still be on its way."""

    __slots__ = ("_ahead", "_early", "arrived_through")

    def __init__(self) -> None:
        self.arrived_through = 0  # batches 1..arrived_through have all arrived
        self._ahead: set[int] = set()  # batches past arrived_through that overtook one before them
        self._early: dict[int, int] = {}  # job id -> the sent_through of its cancel

    def __len__(self) -> int:
        """What is held: cancels waiting for their job, and batch numbers that came early."""
        return len(self._early) + len(self._ahead)

    def batch_arrived(self, batch: int, job_ids: Iterable[int]) -> set[int]:
        """Record that ``batch`` (holding ``job_ids``) arrived; the ids among them whose cancel
        came first, which are not to be run."""
        if batch == self.arrived_through + 1:
            self.arrived_through = batch
            while self.arrived_through + 1 in self._ahead:
                self.arrived_through += 1
                self._ahead.discard(self.arrived_through)
        elif batch > self.arrived_through:
            self._ahead.add(batch)
        skipped = {job_id for job_id in job_ids if self._early.pop(job_id, None) is not None}
        if self._early:  # a cancel whose batches have all arrived found its job ended: drop it
            through = self.arrived_through
            self._early = {job_id: sent for job_id, sent in self._early.items() if sent > through}
        return skipped

    def cancel_not_running(self, job_id: int, sent_through: int) -> None:
        """A cancel for a job that is not running here: kept only while its job may be on the
        way (a batch up to ``sent_through`` has not arrived); else the job ended, and it is dropped."""
        if sent_through > self.arrived_through:
            self._early[job_id] = sent_through


__all__ = ["EarlyCancels"]
