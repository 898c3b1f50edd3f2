"""The asynchronous training step (``rollout.max_staleness = K > 0``): rollouts keep running
while the backend trains and syncs.

Each step consumes ``tasks_per_step`` finished groups, as the synchronous loop does (groups the
filters drop count, so the reward curve means the same in both modes), in dispatch order; with
``algorithm.dynamic_sampling`` it takes more, until that many of them carry a learning signal or
the cap is reached (rllm.engine.training.dynamic_sampling). Tasks come from the run's sampler
(``rllm.engine.training.task_sampler``: the seeded order or ``rollout.curriculum``), one at a
time as slots free, and each group taken is recorded there at once, so the next draw knows it. A
group whose oldest model call is older than ``v - K`` (``v``: the weights this update starts
from) is never trained on: it is re-queued or dropped (``rollout.stale_policy``) and counted.
Weight syncs pause the gateway, which lets calls in flight finish (drain) and holds new ones, so
every call is answered, and stamped, by exactly one weight version; a watchdog bounds the sync.
With ``rollout.partial`` the gateway aborts the calls in flight instead and continues them on the
new weights (``rllm.gateway.partial``); a call's trace then records the version of each of its
token spans, and its oldest version is the one the staleness bound checks.

The Trainer delegates its step here when K > 0; K = 0 keeps the Trainer's synchronous step.
Both run the same update (``rllm.engine.training.train_step``: filters, advantages, train, the mismatch
check, the sample); this module keeps only what is asynchronous: rollout scheduling, the
staleness bound and its metrics, and the drained, watched sync it passes as ``publish``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from rllm.engine.training.async_rollouts import AsyncRollouts, FinishedGroup
from rllm.engine.training.checkpoint import TrainerState
from rllm.engine.training.dynamic_sampling import SignalCount, max_extra_groups
from rllm.engine.training.policies import publish_policy_models
from rllm.engine.training.seeding import step_sampling
from rllm.engine.training.staleness import continued_calls, episode_versions, is_stale
from rllm.types import Episode, Task
from rllm.types.errors import StateError

if TYPE_CHECKING:
    from rllm.engine.backend import Backend
    from rllm.engine.rollout.rollout_engine import RolloutEngine
    from rllm.engine.training.task_sampler import TaskSampler
    from rllm.engine.training.train_step import TrainStep
    from rllm.engine.training.trainer_config import TrainerConfig


class StepperTrainer(Protocol):
    """What the asynchronous step uses of its Trainer (which delegates its step here)."""

    config: TrainerConfig
    backend: Backend
    sampler: TaskSampler  # the run's task draw (rllm.engine.training.task_sampler)
    train_step: TrainStep


class AsyncStepper:
    """Produces one training step at a time from continuously running rollouts."""

    def __init__(self, trainer: StepperTrainer, engine: RolloutEngine, state: TrainerState) -> None:
        cfg = trainer.config
        self.trainer, self.engine, self.state = trainer, engine, state
        self.k = cfg.rollout.max_staleness
        try:
            pending = trainer.sampler.find(state.unconsumed_task_ids)
        except ValueError as exc:
            raise StateError(str(exc)) from None
        # Every group of the window starts at once and its rollouts share ``concurrency`` one
        # rollout at a time (first come, first served, so in dispatch order), as the synchronous
        # loop's rollouts do: a group waiting on its slowest rollout holds one slot, not
        # ``group_size`` of them, and the sampler is kept busy by the next groups meanwhile.
        self._slots = asyncio.Semaphore(max(1, cfg.rollout.concurrency))
        # A step holds its groups until its sync: dynamic sampling's extra groups need room too
        # (the staleness bound is still checked on every group, whatever the window).
        window = (self.k + 1) * cfg.tasks_per_step + max_extra_groups(cfg.algorithm, cfg.tasks_per_step)
        # Group ``seq`` of this run belongs to the step the synchronous loop would draw it for:
        # its rollouts sample with that step's seed (rllm.engine.training.seeding).
        self._first_step = state.step + 1
        # Each (step, task) drawn so far: a task's later drawings in a step sample with seeds of
        # their own (rllm.engine.rollout.rollout_config.drawing_sampling), not copies of its first.
        self._drawings: dict[tuple[int, str], int] = {}
        self.rollouts = AsyncRollouts(
            self._run_group, self._next_task, window=window, parallel=window, pending=pending
        )
        self._last_step_end = time.perf_counter()
        self._busy_at_last_step = 0.0

    def start(self) -> AsyncStepper:
        self.rollouts.start()
        return self

    def _next_task(self) -> Task:
        (task,), self.state.data = self.trainer.sampler.next_batch(1, self.state.data)
        return task

    async def _run_group(self, seq: int, task: Task) -> list[Episode]:
        cfg = self.trainer.config
        step = self._first_step + seq // cfg.tasks_per_step
        sampling = step_sampling(self.engine.config.sampling, step)
        drawing = self._drawings.get((step, task.id), 0)
        self._drawings[(step, task.id)] = drawing + 1
        if len(self._drawings) > 4 * (self.k + 2) * cfg.tasks_per_step:  # steps long gone
            self._drawings = {key: n for key, n in self._drawings.items() if key[0] >= step - self.k - 2}
        episodes = await self.engine.run(
            [task], n=cfg.group_size, slots=self._slots, sampling=sampling, drawings=[drawing]
        )
        for episode in episodes:  # a multi-turn episode may span versions: keep both ends
            if (versions := episode_versions(episode)) is not None:
                episode.metrics["weight_version_min"] = float(versions[0])
                episode.metrics["weight_version_max"] = float(versions[1])
        return episodes

    def snapshot(self) -> TrainerState:
        """The state to checkpoint now: the data cursor and the tasks handed out but not yet
        trained on, taken together (rollouts keep handing out tasks while the checkpoint is
        written, so the live state would drift from what the saved one claims)."""
        unconsumed = [t.id for t in self.rollouts.unconsumed()]
        return msgspec.structs.replace(self.state, unconsumed_task_ids=unconsumed)

    async def close(self) -> None:
        await self.rollouts.close()

    async def step(self) -> dict[str, Any]:
        """Take ``tasks_per_step`` finished groups within the bound (with dynamic sampling, until
        that many carry a signal or the cap is reached), recording each in the sampler, then the
        shared step (rllm.engine.training.train_step) with this loop's sync; its metrics plus the
        staleness ones."""
        cfg, state, sampler = self.trainer.config, self.state, self.trainer.sampler
        started = time.perf_counter()
        batch: list[FinishedGroup] = []
        dropped = requeued = 0
        waited = 0.0
        count = SignalCount(cfg.algorithm, cfg.tasks_per_step)
        sampled: dict[str, float] = {}
        while count.missing() > 0:
            t = time.perf_counter()
            group = await self.rollouts.next_group()
            waited += time.perf_counter() - t
            if is_stale(group.episodes, state.weight_version, self.k):
                requeue = cfg.rollout.stale_policy == "requeue"
                self.rollouts.release(group.seq, requeue=requeue)
                requeued += requeue
                dropped += not requeue
                continue
            batch.append(group)
            sampled = sampler.observe(group.episodes)
            count.add(group.episodes)
        batch.sort(key=lambda g: g.seq)
        episodes = [e for g in batch for e in g.episodes]
        sampled.update(count.metrics())
        sampled.update(sampler.end_step(episodes))
        t1 = time.perf_counter()
        staleness = self._staleness_metrics(episodes, state.weight_version)
        sync_s = 0.0

        async def publish() -> None:
            nonlocal sync_s
            t_sync = time.perf_counter()
            await self._sync()
            sync_s = time.perf_counter() - t_sync

        metrics = await self.trainer.train_step.run(episodes, state.step + 1, publish, state.weight_version)
        for group in batch:  # their slots free only now: new groups start on the new weights
            self.rollouts.release(group.seq)
        t2 = time.perf_counter()
        state.step += 1
        return {
            **metrics,
            **sampled,
            **staleness,
            "async/dropped_groups": dropped,
            "async/requeued_groups": requeued,
            **self._utilisation(started, t2, t2 - t1),
            "time/trainer_wait_s": waited,
            "time/sync_s": sync_s,
            "time/rollout_s": t1 - started,
            "time/train_s": t2 - t1,
            "weight_version": state.weight_version,
            "batch/task_ids": [g.task.id for g in batch],
        }

    async def _sync(self) -> None:
        """Pause the gateway (calls in flight finish, or with ``rollout.partial`` are aborted and
        parked; new ones wait), sync, stamp, resume (parked calls continue on the new weights);
        all of it within ``rollout.sync_timeout_s``, or the run stops naming the stuck part."""
        client, timeout = self.engine.client, self.trainer.config.rollout.sync_timeout_s
        try:
            await client.pause(timeout_s=timeout)
        except Exception as exc:
            raise StateError(
                f"the gateway did not drain its calls in flight for a weight sync within "
                f"rollout.sync_timeout_s={timeout}s: {exc}"
            ) from exc
        try:
            try:
                version = await asyncio.wait_for(self.trainer.backend.sync_weights(), timeout)
            except TimeoutError:
                raise StateError(
                    f"weight sync did not finish within rollout.sync_timeout_s={timeout}s "
                    f"(backend {self.trainer.backend.name!r}); the run stops rather than hang"
                ) from None
            self.state.weight_version = version
            await client.set_weight_version(version)
            await publish_policy_models(self.trainer.config.policies, self.trainer.backend, client)
            self.engine.config.model = self.trainer.backend.served_model_name()
        finally:
            await client.resume()

    def _staleness_metrics(self, episodes: list[Episode], update_version: int) -> dict[str, float]:
        spans = [v for e in episodes if (v := episode_versions(e)) is not None]
        if not spans:
            return {}
        lags = [update_version - lo for lo, _ in spans]
        spanned = [hi - lo + 1 for lo, hi in spans]
        return {
            "async/staleness_mean": statistics.fmean(lags),
            "async/staleness_max": max(lags),
            "async/versions_spanned_mean": statistics.fmean(spanned),
            "async/versions_spanned_max": max(spanned),
            "async/continued_calls": continued_calls(episodes),
        }

    def _utilisation(self, started: float, ended: float, trainer_busy: float) -> dict[str, float]:
        wall = ended - self._last_step_end
        busy = self.rollouts.busy_seconds()
        rollout_busy, self._busy_at_last_step = busy - self._busy_at_last_step, busy
        self._last_step_end = ended
        if wall <= 0:
            return {}
        return {
            "async/rollout_utilisation": min(1.0, rollout_busy / wall),
            "async/trainer_utilisation": min(1.0, trainer_busy / wall),
            "time/rollout_wait_s": max(0.0, wall - rollout_busy),
        }
