"""Rollouts across flow processes ("workers"), for more agent traffic than one core can carry.

(Not the gateway's upstream inference servers, :mod:`rllm.gateway.upstreams`: these run agent flows.)

One asyncio process runs at most one core's worth of agent code, HTTP clients and trace
handling. With ``RolloutConfig.workers = N`` the engine starts N processes (spawned, so flows
must be importable: a module-level function or class, as for any multiprocessing target). Each
runs its own RolloutEngine: with its own embedded gateway when the engine owns the gateway
(same config, own port, own store), or attached to the same gateway URL. The parent hands each
rollout to the least-loaded worker and gets the Episode back, msgpack-framed over a socket
pair. A worker that dies fails its in-flight rollouts as ``infra_error`` (the engine's retry
policy then runs them on another worker) and takes no more work.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

from rllm.engine.rollout.frames import Frames, Ready, send_start_failure
from rllm.engine.rollout.worker_metrics import WORKER_KEY
from rllm.engine.rollout.worker_pool import (
    Done,
    EngineFactory,
    FlowProcessDied,
    Job,
    SlottedPool,
    WorkerHandle,
    WorkerSlots,
    encode_done,
    quiet_loggers_from_env,
)
from rllm.types import Episode, SamplingParams, Task, from_msgpack, to_msgpack
from rllm.types.errors import InputError, StateError

if TYPE_CHECKING:
    from rllm.engine.rollout.early_flow_processes import EarlyFlowProcesses
    from rllm.engine.rollout.executors import PoolRequest


# ----------------------------------------------------------------------------- worker side
def _worker_main(sock: socket.socket, engine: EngineFactory, engine_kwargs: dict[str, Any]) -> None:
    """Entry point of a worker process: ``engine(**engine_kwargs)`` serving the parent's jobs."""
    from rllm.runtime.event_loop import run

    quiet_loggers_from_env()

    # Ctrl-C reaches the whole process group: the parent alone handles it and closes the pipe,
    # which shuts this worker down; a KeyboardInterrupt here would only print tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    if not run(_serve(sock, engine, engine_kwargs)):
        sys.exit(1)  # its error line went to the driver, which reports it: no traceback here


async def _serve(sock: socket.socket, engine_factory: EngineFactory, engine_kwargs: dict[str, Any]) -> bool:
    """Serve the parent's jobs until it closes the pipe; False (the parent told why) when the
    engine did not start."""
    loop = asyncio.get_running_loop()
    jobs: asyncio.Queue[Job] = asyncio.Queue()
    closed = asyncio.Event()
    try:
        engine = await engine_factory(**engine_kwargs).start()
    except Exception as exc:
        send_start_failure(sock, exc)
        return False
    try:

        async def runner() -> None:
            # One runner per slot of this worker's share of the concurrency. The parent sends a
            # few jobs more than that; a runner whose rollout ends takes the next one from the
            # queue at once, without waiting for a round trip or another loop pass.
            while True:
                waited = 0.0
                if jobs.empty():  # the parent is not keeping up (or the batch is ending)
                    t0 = time.monotonic()
                    job = await jobs.get()
                    waited = time.monotonic() - t0
                else:
                    job = jobs.get_nowait()
                # The model name travels with the job, not through the shared config: rollouts
                # from before and after a rename can be in flight together.
                episode = await engine.run_one(
                    job.task, job.rollout_index, job.is_validation, model=job.model, sampling=job.sampling
                )
                episode.metrics["slot_wait_s"] = waited
                with contextlib.suppress(ConnectionResetError):  # the parent is gone: nobody to tell
                    pipe.send(encode_done(job, episode))

        def on_frame(frame: memoryview) -> None:
            job = from_msgpack(frame, Job)
            # Its sandbox (if the flow has one) is prepared while the job waits for a slot.
            engine.prepare_sandboxes([job.task])
            jobs.put_nowait(job)

        # Connected once the engine is up: jobs the parent sends meanwhile wait in the socket.
        _, pipe = await loop.create_connection(lambda: Frames(on_frame, closed.set), sock=sock)
        runners = [loop.create_task(runner()) for _ in range(engine_kwargs["config"].concurrency)]
        pipe.send(to_msgpack(Ready(engine.gateway_url)))
        try:
            await closed.wait()  # the parent closed the pipe: shut down
        finally:
            for t in runners:
                t.cancel()
            await asyncio.gather(*runners, return_exceptions=True)
    finally:
        await engine.close()
    return True


# ----------------------------------------------------------------------------- parent side
class _Worker(WorkerHandle):
    def __init__(self, index: int, process: Any, capacity: int) -> None:
        super().__init__(index, capacity)
        self.process = process
        self.pipe: Frames | None = None
        # Its gateway's URL once it is up; "" if it exited first (``start_error``: its own line).
        self.ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.start_error = ""

    def on_frame(self, frame: memoryview) -> None:
        if not self.ready.done():
            ready = from_msgpack(frame, Ready)
            self.start_error = ready.error
            self.ready.set_result(ready.gateway_url)
            return
        done = from_msgpack(frame, Done)
        self.resolve(done.id, done.episode)

    def on_lost(self) -> None:
        self.alive = False
        code = self.process.exitcode
        if not self.ready.done():
            self.ready.set_result("")  # exited before it was ready: start() says so
        self.fail_all(lambda: FlowProcessDied(f"rollout worker {self.index} exited (code {code})"))


class FlowProcessPool(SlottedPool[_Worker]):
    """N flow processes (``RolloutConfig.workers``), each running ``engine(**engine_kwargs)`` (a
    RolloutEngine) on its share of ``concurrency``, with ``prefetch`` jobs more queued in it
    (:class:`~rllm.engine.rollout.worker_pool.WorkerSlots`, as for every pool).

    ``start_timeout_s`` is 300 s, as for Ray workers: a spawned interpreter importing torch took
    over 120 s on a loaded 2-core machine. ``early``: processes started beforehand
    (:mod:`rllm.engine.rollout.early_flow_processes`), used before spawning new ones.
    """

    def __init__(
        self,
        n: int,
        engine_kwargs: dict[str, Any],
        *,
        engine: EngineFactory,
        concurrency: int,
        prefetch: int | None = None,
        start_timeout_s: float = 300.0,
        early: EarlyFlowProcesses | None = None,
    ) -> None:
        self.n = n
        self.early = early  # processes started before this pool, adopted by start()
        self.engine = engine
        self.engine_kwargs = engine_kwargs
        self.start_timeout_s = start_timeout_s
        self.slots: WorkerSlots[_Worker] = WorkerSlots(n, concurrency, prefetch)

    async def start(self) -> FlowProcessPool:
        from rllm.engine.rollout.early_flow_processes import EarlyFlowProcesses

        loop = asyncio.get_running_loop()
        if self.early is None:  # all started at once: each imports while the others do
            self.early = EarlyFlowProcesses(self.n, [])
        try:
            for i in range(self.n):
                kwargs = self.slots.engine_kwargs(self.engine_kwargs, i)
                try:
                    proc, parent_sock = await self._launch(i, kwargs)
                except (pickle.PicklingError, AttributeError, TypeError) as exc:
                    raise InputError(
                        f"workers > 1 needs an importable flow and evaluator (module-level, not a "
                        f"lambda or a local function): {exc}"
                    ) from None
                w = _Worker(i, proc, self.slots.capacity_of(i))
                self.workers.append(w)
                _, w.pipe = await loop.create_connection(
                    lambda w=w: Frames(w.on_frame, w.on_lost), sock=parent_sock
                )
            await self._await_ready()
        except BaseException:
            await self.close()
            raise
        finally:
            if self.early is not None:
                self.early.close()  # any not taken (a pool of fewer workers than started early)
        return self

    async def _await_ready(self) -> None:
        """Every worker's gateway URL; the first worker that fails to start fails the pool at
        once, with its own error line (not after ``start_timeout_s``, not behind a slower one)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.start_timeout_s
        waiting = {w.ready: w for w in self.workers}
        while waiting:
            done, _ = await asyncio.wait(
                waiting, timeout=max(0.0, end - loop.time()), return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                # Still running: slow, not broken (an overloaded machine), so no import hint.
                w = min(waiting.values(), key=lambda w: w.index)
                raise StateError(
                    f"rollout worker {w.index} did not start within {self.start_timeout_s:.0f} s "
                    "(it is still starting; is the machine overloaded?)"
                )
            for fut in sorted(done, key=lambda f: waiting[f].index):
                w = waiting.pop(fut)
                w.gateway_url = fut.result()
                if w.start_error:
                    raise StateError(f"rollout worker {w.index} failed to start: {w.start_error}")
                if not w.gateway_url:
                    await asyncio.to_thread(w.process.join, 10)  # its exit code, once it is reaped
                    raise StateError(
                        f"rollout worker {w.index} did not start (exit code {w.process.exitcode}); "
                        "is the flow importable (defined at module level)?"
                    )

    async def _launch(self, index: int, kwargs: dict[str, Any]) -> tuple[Any, socket.socket]:
        """Worker ``index``'s process, running ``_worker_main(kwargs)``, and the parent's end of
        its socket: an early-started one when one is waiting, else a fresh one. Either gets its
        entry point and arguments over its socket (not as a spawn's arguments), so a flow module
        that fails to import there is reported to the driver in one line."""
        from rllm.engine.rollout.early_flow_processes import EarlyFlowProcesses

        args = (self.engine, kwargs)
        # In a thread: arguments larger than the socket's buffer wait for the process to finish
        # its imports and read them.
        if self.early is not None and (taken := await asyncio.to_thread(self.early.take, _worker_main, args)):
            return taken
        fresh = EarlyFlowProcesses(1, [], first_index=index)  # none started early is left
        try:
            taken = await asyncio.to_thread(fresh.take, _worker_main, args)
        finally:
            fresh.close()  # one not taken (its arguments could not be pickled) ends here
        if taken is None:
            raise StateError(f"rollout worker {index} exited as soon as it was started")
        return taken

    async def run_one(
        self,
        task: Task,
        rollout_index: int,
        is_validation: bool,
        model: str,
        sampling: SamplingParams | None = None,
    ) -> Episode:
        """Run one rollout on the live worker with the most room; raises FlowProcessDied if it exits
        first."""
        w, job_id, fut = self.slots.take(lambda: FlowProcessDied("every rollout worker has exited"))
        assert w.pipe is not None
        try:
            w.pipe.send(to_msgpack(Job(job_id, task, rollout_index, is_validation, model, sampling)))
        except ConnectionResetError:
            w.pending.pop(job_id, None)
            raise FlowProcessDied(f"rollout worker {w.index} exited (code {w.process.exitcode})") from None
        episode = await fut
        # named per worker so the step's slowest-worker sandbox metric sees each process apart
        episode.metadata[WORKER_KEY] = f"process-{w.index}"
        return episode

    async def close(self) -> None:
        for w in self.workers:
            if w.pipe is not None and w.pipe.transport is not None:
                w.pipe.transport.close()
        for w in self.workers:
            if not w.gateway_url and w.process.is_alive():
                w.process.terminate()  # never started (the pool failed): nothing of it to finish
            await asyncio.to_thread(w.process.join, 10)
            if w.process.is_alive():
                w.process.kill()
        self.workers.clear()


async def start_process_pool(request: PoolRequest) -> FlowProcessPool:
    """The ``processes`` executor's pool (``rollout.workers`` processes), started."""
    settings = request.settings
    return await FlowProcessPool(
        settings.workers,
        request.engine_kwargs,
        engine=request.engine,
        concurrency=settings.concurrency,
        prefetch=settings.worker_prefetch,
        early=request.early,
    ).start()
