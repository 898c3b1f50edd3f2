"""The ``ray`` executor: flow workers as Ray actors across a cluster's nodes.

Each worker is an async Ray actor running what a flow process runs
(:mod:`rllm.engine.rollout.flow_processes`): its own RolloutEngine (the engine's factory, called in
the actor) with an embedded gateway routing to
the backend's inference URLs, bound to its node's IP so the engine's ``GatewayGroup`` admin
(pause/resume, weight version, upstreams, traces) and the worker's flows reach it. The driver
sends each job (msgpack) to the worker with the most room and gets the Episode back msgpack-encoded,
in batches: the jobs of one event-loop pass go to a worker in one ``submit`` call, and finished
rollouts come back in one ``collect`` call (a long poll the driver keeps in flight per worker),
not one actor call per rollout. Each worker runs at most its share of ``rollout.concurrency`` and
queues up to ``prefetch`` more (:class:`~rllm.engine.rollout.worker_pool.WorkerSlots`, as for
every pool).
A worker whose process or node dies fails its in-flight rollouts with :class:`RayWorkerDied`
(a ``FlowProcessDied``: the engine retries them on another worker, as ``infra_error`` when none
is left) and takes no more work. A rollout cancelled in the driver (its step cancelled, a
Ctrl-C, a dropped group) is cancelled in its actor too (a batched ``cancel`` call): its flow,
sandbox and gateway session end there, not only the driver's wait for it.

Ray is the ``rllm-engine[ray]`` extra; this module and :mod:`~rllm.engine.rollout.ray_connect` are the
engine modules that import it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import re
import time
from typing import Any

import msgspec

from rllm.engine.rollout.executors import PoolRequest, RaySettings
from rllm.engine.rollout.ray_cancels import EarlyCancels
from rllm.engine.rollout.ray_connect import connect_ray
from rllm.engine.rollout.worker_metrics import WORKER_KEY
from rllm.engine.rollout.worker_pool import (
    QUIET_LOGGERS_ENV,
    Done,
    EngineFactory,
    FlowProcessDied,
    Job,
    SlottedPool,
    WorkerHandle,
    WorkerSlots,
    encode_done,
    error_line,
    quiet_loggers_from_env,
)
from rllm.types import Episode, SamplingParams, Task, from_msgpack, to_msgpack
from rllm.types.errors import MissingExtraError, StateError

try:
    import ray
    from ray.exceptions import ActorUnavailableError, RayActorError, RayError, RayTaskError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError("rollout.executor = 'ray' needs Ray: pip install 'rllm-engine[ray]'") from exc

log = logging.getLogger(__name__)

RAY_SHUTDOWN_TIMEOUT_S = 60.0  # how long a pool's close waits for ray.shutdown


class RayWorkerDied(FlowProcessDied):
    """The Ray actor (or its node) running a rollout died before answering."""


def ray_error_line(exc: BaseException) -> str:
    """The line that says why a Ray call failed: the worker's own exception (``Type: message``)
    rather than Ray's wrapper, whose text is a page of traceback ending in that line."""
    if (
        isinstance(exc, RayTaskError)
        and isinstance(exc.cause, Exception)
        and not isinstance(exc.cause, RayError)
    ):
        return error_line(exc.cause)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit): ", line)]
    return raised[-1] if raised else (lines[0] if lines else type(exc).__name__)


class FlowWorker:
    """A Ray actor (wrapped with ``ray.remote`` by the pool): one RolloutEngine, ``slots``
    rollouts at a time; jobs beyond that wait in the actor (the prefetch).

    Jobs arrive in batches (``submit``) and finished rollouts leave in batches (``collect``, a
    long poll the driver always keeps one of in flight): an actor call costs the driver, the
    worker and Ray's core worker a task submission and a result object each, so one call per
    loop pass's jobs and one per batch of results, instead of one per rollout, is most of what
    Ray added per rollout over the process executor's socket pair."""

    def __init__(self, engine: EngineFactory, engine_kwargs: dict[str, Any], slots: int) -> None:
        self._factory = engine
        self._kwargs = engine_kwargs
        self._slots = slots
        self._engine: Any = None
        self._free: asyncio.Semaphore | None = None
        self._running: dict[int, asyncio.Task[None]] = {}
        self._cancels = EarlyCancels()  # cancels that arrived before their job (bounded)
        # Finished rollouts not yet collected: an encoded Done each, or (job id, the exception
        # the engine raised) for one that failed outside its episode (a bug: the driver raises it).
        self._out: list[bytes | tuple[int, Exception]] = []
        self._has_out: asyncio.Event | None = None

    async def start(self) -> tuple[str, str]:
        """Start the engine and its gateway; its URL and this node's id."""
        quiet_loggers_from_env()
        kwargs = dict(self._kwargs)
        host = ray.util.get_node_ip_address()
        if kwargs.get("gateway_url") is None:
            # The gateway listens on the node's address: the driver's admin reaches it from afar,
            # with the admin key the driver's engine put in this config (owned_gateway_config).
            cfg = kwargs.pop("gateway_config")
            kwargs["upstreams"] = None
            kwargs["gateway_config"] = msgspec.structs.replace(cfg, host=host, port=0)
        self._engine = await self._factory(**kwargs).start()
        self._free = asyncio.Semaphore(self._slots)
        self._has_out = asyncio.Event()
        return self._engine.gateway_url, ray.get_runtime_context().get_node_id()

    async def submit(self, jobs_bytes: bytes, batch: int) -> None:
        """Start a batch of rollouts (a msgpack list of ``Job``; ``batch`` numbers the driver's
        submit calls to this worker, 1, 2, 3, ...); their results go to ``collect``."""
        assert self._engine is not None, "start() first"
        jobs: list[Job] = []
        try:
            jobs = from_msgpack(jobs_bytes, list[Job])
        finally:  # arrived, even unreadable: later cancels must not wait for it
            skipped = self._cancels.batch_arrived(batch, [j.id for j in jobs])
        jobs = [j for j in jobs if j.id not in skipped]
        # Their sandboxes (if the flow has them) are prepared while the jobs wait for a slot.
        self._engine.prepare_sandboxes([j.task for j in jobs])
        loop = asyncio.get_running_loop()
        for job in jobs:
            self._running[job.id] = loop.create_task(self._one(job))

    async def _one(self, job: Job) -> None:
        assert self._engine is not None and self._free is not None and self._has_out is not None
        try:
            t0 = time.monotonic()
            async with self._free:
                waited = time.monotonic() - t0
                episode = await self._engine.run_one(
                    job.task, job.rollout_index, job.is_validation, model=job.model, sampling=job.sampling
                )
            episode.metrics["slot_wait_s"] = waited
            self._out.append(encode_done(job, episode))
            self._has_out.set()
        except Exception as exc:
            self._out.append((job.id, exc))
            self._has_out.set()
        finally:
            self._running.pop(job.id, None)

    async def collect(self) -> list[bytes | tuple[int, Exception]]:
        """The rollouts finished since the last call (msgpack ``Done`` each); waits for one."""
        assert self._has_out is not None, "start() first"
        await self._has_out.wait()
        self._has_out.clear()
        out, self._out = self._out, []
        return out

    async def cancel(self, job_ids: list[int], sent_through: int) -> None:
        """End these rollouts here (their flow task gets CancelledError: its sandbox and gateway
        session are released), not only the driver's wait for them. ``sent_through``: the last
        batch the driver had sent. A cancel that overtook its job's ``submit`` (Ray does not
        order an async actor's calls) stops the job on arrival; one that came after its job
        ended is dropped (:mod:`rllm.engine.rollout.ray_cancels`)."""
        for job_id in job_ids:
            task = self._running.get(job_id)
            if task is not None:
                task.cancel()
            else:
                self._cancels.cancel_not_running(job_id, sent_through)

    async def held(self) -> dict[str, int]:
        """What this worker holds: rollouts running or queued, and cancel bookkeeping (for tests
        and debugging: both stay bounded however long the run)."""
        return {"running": len(self._running), "cancels": len(self._cancels)}

    async def stop(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        if self._engine is not None:
            await self._engine.close()
            self._engine = None


class _Handle(WorkerHandle):
    """The driver's side of one FlowWorker: besides its rollouts in flight (by job id), the jobs
    and cancels of this loop pass not yet sent, and the task keeping a ``collect`` call in flight."""

    def __init__(self, index: int, actor: Any, capacity: int) -> None:
        super().__init__(index, capacity)
        self.actor = actor
        self.unsent: dict[int, Job] = {}  # by job id, in the order they came
        self.cancels: list[int] = []
        self.batches = 0  # submit calls sent to this worker (each numbered, see FlowWorker.submit)
        self.collector: asyncio.Task[None] | None = None
        self.node_id = ""


class RayFlowPool(SlottedPool[_Handle]):
    """``n`` FlowWorker actors on the Ray cluster of ``settings``; the interface of
    :class:`~rllm.engine.rollout.flow_processes.FlowProcessPool` (see :mod:`rllm.engine.rollout.executors`).

    ``completed_by_node`` counts the rollouts each node's workers finished; ``submit_calls`` the
    actor calls that carried jobs; ``workers_lost`` the workers that died; ``sandbox_acquire_s``
    each worker's sandbox acquire latencies (by worker index). Each episode names its worker in
    ``metadata["rollout_worker"]``."""

    def __init__(
        self,
        n: int,
        engine_kwargs: dict[str, Any],
        *,
        engine: EngineFactory,
        concurrency: int,
        prefetch: int | None = None,
        settings: RaySettings | None = None,
    ) -> None:
        self.n = n
        self.engine = engine
        self.engine_kwargs = engine_kwargs
        self.settings = settings or RaySettings()
        self.slots: WorkerSlots[_Handle] = WorkerSlots(n, concurrency, prefetch)
        self.completed_by_node: collections.Counter[str] = collections.Counter()
        self.workers_lost = 0
        self.sandbox_acquire_s: dict[int, list[float]] = {}
        self._connected = False
        self._calls: set[asyncio.Task[None]] = set()  # submit calls not yet answered
        self.submit_calls = 0  # actor calls that carried jobs (fewer than the jobs: batched)

    def _actor_options(self) -> dict[str, Any]:
        resources = dict(self.settings.resources_per_worker)
        options: dict[str, Any] = {
            "num_cpus": resources.pop("CPU", 0.0),
            "num_gpus": resources.pop("GPU", 0.0),
            "scheduling_strategy": "SPREAD",
            "max_restarts": 0,  # a dead worker's rollouts are retried elsewhere by the engine
            "max_concurrency": 10_000,  # the pool bounds the calls; the actor must not
        }
        memory = resources.pop("memory", None)
        if memory:
            options["memory"] = memory
        if resources:
            options["resources"] = resources
        runtime_env = dict(self.settings.runtime_env or {})
        quiet = os.environ.get(QUIET_LOGGERS_ENV)
        if quiet:  # the loggers `rllm` quieted stay quiet in the workers too
            runtime_env["env_vars"] = {QUIET_LOGGERS_ENV: quiet, **runtime_env.get("env_vars", {})}
        if runtime_env:
            options["runtime_env"] = runtime_env
        return options

    async def start(self) -> RayFlowPool:
        self._connected = await asyncio.to_thread(
            connect_ray,
            self.settings.address,
            uv_runtime_env=self.settings.uv_runtime_env,
            connect_timeout_s=self.settings.connect_timeout_s,
        )
        try:
            actor_cls = ray.remote(FlowWorker).options(**self._actor_options())
            for i in range(self.n):
                kwargs = self.slots.engine_kwargs(self.engine_kwargs, i)
                actor = actor_cls.remote(self.engine, kwargs, self.slots.runs(i))
                self.workers.append(_Handle(i, actor, self.slots.capacity_of(i)))
            starts = [w.actor.start.remote() for w in self.workers]
            try:
                ready = await asyncio.wait_for(asyncio.gather(*starts), self.settings.start_timeout_s)
            except TimeoutError:
                raise StateError(
                    f"{self.n} Ray rollout workers did not all start within {self.settings.start_timeout_s:g} s: "
                    f"does the cluster have {self.settings.resources_per_worker} free per worker "
                    "(rollout.ray.resources_per_worker)?"
                ) from None
            except RayError as exc:  # the first that fails, at once: its own line, not Ray's page
                raise StateError(f"a Ray rollout worker failed to start: {ray_error_line(exc)}") from None
            for w, (url, node) in zip(self.workers, ready, strict=True):
                w.gateway_url, w.node_id = url, node
                w.collector = asyncio.get_running_loop().create_task(self._collect(w))
        except BaseException:
            await self.close()
            raise
        return self

    async def run_one(
        self,
        task: Task,
        rollout_index: int,
        is_validation: bool,
        model: str,
        sampling: SamplingParams | None = None,
    ) -> Episode:
        w, job_id, fut = self.slots.take(lambda: RayWorkerDied("every Ray rollout worker has died"))
        if not w.unsent and not w.cancels:
            self._flush_soon(w)
        w.unsent[job_id] = Job(job_id, task, rollout_index, is_validation, model, sampling)
        try:
            episode = await fut
        except asyncio.CancelledError:
            # A job not sent yet is never sent; one sent ends in its actor too (its flow task gets
            # CancelledError there, so its sandbox and session are released), not only this wait.
            if w.pending.pop(job_id, None) is not None and w.unsent.pop(job_id, None) is None and w.alive:
                if not w.unsent and not w.cancels:
                    self._flush_soon(w)
                w.cancels.append(job_id)
            raise
        self.completed_by_node[w.node_id] += 1
        episode.metadata[WORKER_KEY] = f"ray-{w.index}@{w.node_id[:12]}"
        if "sandbox_acquire_s" in episode.metrics:
            self.sandbox_acquire_s.setdefault(w.index, []).append(episode.metrics["sandbox_acquire_s"])
        return episode

    def _flush_soon(self, w: _Handle) -> None:
        # Everything queued for a worker during one loop pass goes in one actor call each for
        # jobs and cancels: the engine starts a burst of rollouts whenever a batch of them ends.
        asyncio.get_running_loop().call_soon(self._flush, w)

    def _flush(self, w: _Handle) -> None:
        jobs, cancels = list(w.unsent.values()), w.cancels
        w.unsent, w.cancels = {}, []
        if not w.alive:
            return  # its pending rollouts have been failed already
        if jobs:
            self.submit_calls += 1
            w.batches += 1
            ref = w.actor.submit.remote(to_msgpack(jobs), w.batches)
            self._calls.add(asyncio.get_running_loop().create_task(self._sent(w, ref, [j.id for j in jobs])))
        if cancels:
            with contextlib.suppress(Exception):
                w.actor.cancel.remote(cancels, w.batches)  # runs although its result is never read

    async def _sent(self, w: _Handle, ref: Any, job_ids: list[int]) -> None:
        """Wait for a ``submit`` call: a worker that refused it fails its jobs (one that died
        fails all its rollouts, in ``_collect``)."""
        try:
            await ref
        except (RayActorError, ActorUnavailableError):
            self._lost(w, "its submit call failed")
        except Exception as exc:
            for job_id in job_ids:
                w.fail(job_id, exc)
        finally:
            self._calls.discard(asyncio.current_task())  # type: ignore[arg-type]

    async def _collect(self, w: _Handle) -> None:
        """Keep one ``collect`` call in flight to ``w`` and hand each finished rollout to its
        waiter; when the worker or its node dies, fail every rollout it holds."""
        try:
            while True:
                for item in await w.actor.collect.remote():
                    if isinstance(item, tuple):
                        w.fail(*item)
                        continue
                    done = from_msgpack(item, Done)
                    w.resolve(done.id, done.episode)
        except asyncio.CancelledError:
            raise
        except (RayActorError, ActorUnavailableError) as exc:
            self._lost(w, str(exc))
        except Exception as exc:  # an answer this driver cannot read: the worker is unusable
            log.exception("Ray rollout worker %d answered what the driver cannot read", w.index)
            self._lost(w, f"{type(exc).__name__}: {exc}")

    def _lost(self, w: _Handle, why: str) -> None:
        if w.alive:
            w.alive = False
            self.workers_lost += 1
            log.warning("Ray rollout worker %d on node %s died: %s", w.index, w.node_id[:12], why)
        w.fail_all(lambda: RayWorkerDied(f"Ray rollout worker {w.index} (node {w.node_id[:12]}) died"))

    async def close(self) -> None:
        for w in self.workers:
            if w.collector is not None:
                w.collector.cancel()
        for call in list(self._calls):
            call.cancel()
        live = [w for w in self.workers if w.alive]
        if live:
            stops = [w.actor.stop.remote() for w in live]
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*stops, return_exceptions=True), 30)
        for w in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(w.actor)
        self.workers.clear()
        if self._connected:
            self._connected = False
            # Ray's shutdown waits on its own processes and threads without a bound; a run that
            # has finished must not hang on it (the process's exit ends what is left).
            try:
                await asyncio.wait_for(asyncio.to_thread(ray.shutdown), RAY_SHUTDOWN_TIMEOUT_S)
            except TimeoutError:
                log.warning(
                    "Ray did not shut down within %g s; what is left of it ends with this process",
                    RAY_SHUTDOWN_TIMEOUT_S,
                )


async def start_ray_pool(request: PoolRequest) -> RayFlowPool:
    """The ``ray`` executor's pool (``rollout.ray.num_workers`` actors, else ``rollout.workers``), started."""
    settings = request.settings
    return await RayFlowPool(
        settings.ray.num_workers or settings.workers,
        request.engine_kwargs,
        engine=request.engine,
        concurrency=settings.concurrency,
        prefetch=settings.worker_prefetch,
        settings=settings.ray,
    ).start()
