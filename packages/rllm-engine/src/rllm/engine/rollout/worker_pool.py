"""What every worker pool shares: the ``processes`` executor's flow processes, the ``ray``
executor's actors, and a plugin's pool (:mod:`rllm.engine.rollout.executors`).

A worker pool runs each rollout in one of its workers, each of which runs a RolloutEngine of its
own (built by the engine's factory, :class:`WorkerEngine`). Shared by every pool:

- the jobs and their results on the wire (:class:`Job`, :class:`Done`, msgpack, array-like), and
  what a worker answers when its Episode cannot be sent (:func:`encode_done`);
- :class:`WorkerSlots`, the slot accounting: how ``concurrency`` is split between the workers,
  how many jobs each may hold (its share plus ``prefetch`` queued in it), each worker's engine
  arguments (its share, its own gateway), the job ids, and which live worker takes the next
  rollout (the one with the most room);
- :class:`WorkerHandle`, the driver's view of one worker: its rollouts in flight, alive or not,
  and :class:`SlottedPool`, what a pool answers from its slots;
- :class:`FlowProcessDied`: a worker died with rollouts in flight (the engine runs them again
  on another worker);
- the loggers a command silenced, silenced in every worker too (:func:`quiet_loggers_from_env`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from rllm.engine.rollout.episode_builder import failed_episode
from rllm.engine.rollout.scoring import apply_eval_output
from rllm.types import Episode, ErrorInfo, EvalOutput, SamplingParams, Task, TerminationReason, to_msgpack
from rllm.types.errors import RLLMError
from rllm.types.images import pack_episode_images


class FlowProcessDied(RLLMError, ConnectionError):
    """The flow worker (a process, a Ray actor) running a rollout exited before answering."""


def error_line(exc: BaseException) -> str:
    """``Type: message``, first line only: what the driver reports for a worker that failed to
    start (its traceback stays in the worker's own log)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class WorkerEngine(Protocol):
    """What a flow worker needs of the engine it builds (a RolloutEngine, attached to the
    driver's gateway or with one of its own)."""

    @property
    def gateway_url(self) -> str: ...

    async def start(self) -> WorkerEngine: ...

    async def close(self) -> None: ...

    async def run_one(
        self,
        task: Task,
        rollout_index: int = 0,
        is_validation: bool = False,
        *,
        model: str | None = None,
        sampling: SamplingParams | None = None,
    ) -> Episode: ...

    def prepare_sandboxes(self, tasks: Iterable[Task]) -> None: ...


# How a worker builds its engine: called with the engine's keyword arguments. A class or a
# module-level function, since it travels to a spawned process or a Ray actor by reference.
EngineFactory = Callable[..., WorkerEngine]


class Job(msgspec.Struct, array_like=True):
    """One rollout, sent to a worker."""

    id: int
    task: Task
    rollout_index: int
    is_validation: bool
    model: str  # the driver's current model name: a trainer renames it after remote weight syncs
    # The sampling of this rollout when its caller chose one (a training step's own seed), else
    # the worker's configured sampling.
    sampling: SamplingParams | None = None


class Done(msgspec.Struct, array_like=True):
    """A finished rollout, sent back by its worker."""

    id: int
    episode: Episode


def encode_done(job: Job, episode: Episode) -> bytes:
    """The Done frame; an episode that cannot be encoded (a flow returned artifacts msgpack cannot
    carry) comes back as an agent_error saying so, rather than leaving the driver waiting."""
    try:
        return to_msgpack(Done(job.id, pack_episode_images(episode)))  # each image sent once
    except Exception as exc:
        error = ErrorInfo(
            type=type(exc).__name__,
            message=f"the rollout's Episode cannot be sent from its worker process (with workers > 1 "
            f"a flow's result, artifacts and metadata must be msgpack-encodable): {exc}",
        )
        failed = failed_episode(job.task.id, job.rollout_index, TerminationReason.AGENT_ERROR, error)
        apply_eval_output(failed, EvalOutput(reward=0.0, is_correct=False))
        return to_msgpack(Done(job.id, failed))


def per_worker_gateway(config: Any, index: int) -> Any:
    """Worker ``index``'s own gateway config (a GatewayConfig, None when the workers attach to
    the driver's gateway): any port, and its own SQLite file."""
    if config is None:
        return None
    changes: dict[str, Any] = {"port": 0}
    if config.store.startswith("sqlite:"):
        changes["store"] = f"{config.store}.worker{index}"
    return msgspec.structs.replace(config, **changes)


# Loggers a command silenced (comma-separated names; `rllm` sets it, rllm.cli.quiet): a worker
# writes to the same terminal, so they stay silent (ERROR and above only) in the workers too.
QUIET_LOGGERS_ENV = "RLLM_QUIET_LOGGERS"


def quiet_loggers_from_env() -> None:
    """Raise the loggers named in ``$RLLM_QUIET_LOGGERS`` to ERROR in this process."""
    for name in filter(None, os.environ.get(QUIET_LOGGERS_ENV, "").split(",")):
        logging.getLogger(name.strip()).setLevel(logging.ERROR)


class WorkerHandle:
    """The driver's side of one worker: the rollouts it holds (by job id) and whether it lives."""

    def __init__(self, index: int, capacity: int) -> None:
        self.index = index
        self.capacity = capacity  # its concurrency share plus the prefetch
        self.pending: dict[int, asyncio.Future[Episode]] = {}
        self.alive = True
        self.gateway_url = ""

    def resolve(self, job_id: int, episode: Episode) -> None:
        """Hand a finished rollout to its waiter (gone when the driver stopped waiting)."""
        fut = self.pending.pop(job_id, None)
        if fut is not None and not fut.done():
            fut.set_result(episode)

    def fail(self, job_id: int, error: BaseException) -> None:
        fut = self.pending.pop(job_id, None)
        if fut is not None and not fut.done():
            fut.set_exception(error)

    def fail_all(self, error: Callable[[], BaseException]) -> None:
        """Fail every rollout this worker holds (it died) with a fresh ``error()`` each."""
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(error())


W = TypeVar("W", bound=WorkerHandle)


class WorkerSlots(Generic[W]):
    """A pool's slot accounting over its ``n`` workers (``workers``, added as they start).

    ``concurrency`` (rollouts running at once) is split between the workers (``shares``); each
    also holds up to ``prefetch`` jobs more than its share (default: half its share), queued in
    the worker, so a finished rollout's slot is refilled at once instead of after a round trip
    through the driver, and stays busy while the driver pauses (a full garbage collection of a
    process holding thousands of Episodes takes tens of milliseconds). ``capacity`` is how many
    jobs the pool takes at a time. A worker without a share (concurrency < workers) gets no
    jobs while the others live; after a worker died the others may get more than their
    capacity: they queue it."""

    def __init__(self, n: int, concurrency: int, prefetch: int | None = None) -> None:
        self.shares = [concurrency // n + (i < concurrency % n) for i in range(n)]
        self.prefetch = max(1, concurrency // (2 * n)) if prefetch is None else prefetch
        self.workers: list[W] = []
        self._ids = 0

    def capacity_of(self, index: int) -> int:
        return self.shares[index] + self.prefetch if self.shares[index] else 0

    @property
    def capacity(self) -> int:
        return sum(self.capacity_of(i) for i in range(len(self.shares)))

    def runs(self, index: int) -> int:
        """How many rollouts worker ``index`` runs at once (1 without a share: it then gets
        jobs only once every worker with a share has died)."""
        return max(1, self.shares[index])

    def engine_kwargs(self, engine_kwargs: dict[str, Any], index: int) -> dict[str, Any]:
        """Worker ``index``'s engine arguments: its share of the concurrency, its own gateway."""
        kwargs = dict(engine_kwargs)
        kwargs["gateway_config"] = per_worker_gateway(kwargs.get("gateway_config"), index)
        kwargs["config"] = msgspec.structs.replace(kwargs["config"], concurrency=self.runs(index))
        return kwargs

    @property
    def gateway_urls(self) -> list[str]:
        return [w.gateway_url for w in self.workers]

    def take(self, none_alive: Callable[[], BaseException]) -> tuple[W, int, asyncio.Future[Episode]]:
        """A slot for the next rollout: the live worker with the most room, a fresh job id and
        the future its Episode will be handed to (held in the worker's ``pending``); raises
        ``none_alive()`` when every worker has died."""
        live = [w for w in self.workers if w.alive]
        if not live:
            raise none_alive()
        w = max(live, key=lambda w: w.capacity - len(w.pending))
        self._ids += 1
        fut: asyncio.Future[Episode] = asyncio.get_running_loop().create_future()
        w.pending[self._ids] = fut
        return w, self._ids, fut


class SlottedPool(Generic[W]):
    """What a worker pool answers from its WorkerSlots (``self.slots``): its workers, its
    capacity and their gateways. The executors' pools derive from it."""

    slots: WorkerSlots[W]

    @property
    def workers(self) -> list[W]:
        return self.slots.workers

    @property
    def capacity(self) -> int:
        return self.slots.capacity

    @property
    def gateway_urls(self) -> list[str]:
        return self.slots.gateway_urls
