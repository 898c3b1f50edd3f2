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
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from rllm.engine.rollout.worker_metrics import WORKER_KEY
from rllm.types import Episode, ErrorInfo, EvalOutput, Task, TerminationReason, from_msgpack, to_msgpack
from rllm.types.errors import InputError, RLLMError, StateError
from rllm.types.images import pack_episode_images

if TYPE_CHECKING:
    from rllm.engine.rollout.early_flow_processes import EarlyFlowProcesses

_HEADER = struct.Struct("<I")
log = logging.getLogger(__name__)


class FlowProcessDied(RLLMError, ConnectionError):
    """The flow process running a rollout exited before answering."""


class _Job(msgspec.Struct, array_like=True):
    id: int
    task: Task
    rollout_index: int
    is_validation: bool
    model: str  # the parent's current model name: a trainer renames it after remote weight syncs


class _Done(msgspec.Struct, array_like=True):
    id: int
    episode: Episode


class _Ready(msgspec.Struct, array_like=True):
    gateway_url: str


class _Frames(asyncio.Protocol):
    """Length-prefixed frames over a stream socket. Each whole frame goes to ``on_frame`` as it
    arrives (no coroutine per frame: the parent reads an Episode per rollout); ``on_lost`` runs
    once when the other side goes away. A frame ``on_frame`` cannot handle ends the connection."""

    def __init__(self, on_frame: Callable[[memoryview], None], on_lost: Callable[[], None]) -> None:
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._buf = bytearray()
        self._need = _HEADER.size  # bytes the buffer must hold before a frame can be complete
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []  # frames sent during this loop pass, written together after it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._on_lost()

    def data_received(self, data: bytes) -> None:
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:
                return  # most of a large frame is still on its way: no re-parsing meanwhile
            data = bytes(self._buf)
            self._buf.clear()
        view, pos, end = memoryview(data), 0, len(data)
        try:
            while end - pos >= _HEADER.size:
                (size,) = _HEADER.unpack_from(data, pos)
                if end - pos - _HEADER.size < size:
                    break
                pos += _HEADER.size
                self._on_frame(view[pos : pos + size])
                pos += size
        except Exception:
            log.exception("bad frame from a rollout worker pipe; closing it")
            if self.transport is not None:
                self.transport.close()
            return
        self._buf += view[pos:]
        self._need = _HEADER.size
        if end - pos >= _HEADER.size:
            self._need += _HEADER.unpack_from(data, pos)[0]

    def send(self, payload: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the other end of the rollout worker pipe is gone")
        if not self._out:
            # One write per loop pass, not per frame: each write to the pipe wakes the process at
            # the other end, and the parent sends a burst of jobs whenever a batch of rollouts ends.
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(_HEADER.pack(len(payload)))
        self._out.append(payload)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out))


# ----------------------------------------------------------------------------- worker side
# Loggers a command silenced (comma-separated names; `rllm` sets it, rllm.cli.quiet): a worker
# writes to the same terminal, so they stay silent (ERROR and above only) in the workers too.
QUIET_LOGGERS_ENV = "RLLM_QUIET_LOGGERS"


def quiet_loggers_from_env() -> None:
    """Raise the loggers named in ``$RLLM_QUIET_LOGGERS`` to ERROR in this process."""
    for name in filter(None, os.environ.get(QUIET_LOGGERS_ENV, "").split(",")):
        logging.getLogger(name.strip()).setLevel(logging.ERROR)


def _worker_main(sock: socket.socket, engine_kwargs: dict[str, Any]) -> None:
    """Entry point of a worker process."""
    from rllm.runtime.event_loop import run

    quiet_loggers_from_env()

    # Ctrl-C reaches the whole process group: the parent alone handles it and closes the pipe,
    # which shuts this worker down; a KeyboardInterrupt here would only print tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    run(_serve(sock, engine_kwargs))


async def _serve(sock: socket.socket, engine_kwargs: dict[str, Any]) -> None:
    from rllm.engine.rollout.rollout_engine import RolloutEngine

    loop = asyncio.get_running_loop()
    jobs: asyncio.Queue[_Job] = asyncio.Queue()
    closed = asyncio.Event()

    async with RolloutEngine(**engine_kwargs) as engine:

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
                    job.task, job.rollout_index, job.is_validation, model=job.model
                )
                episode.metrics["slot_wait_s"] = waited
                with contextlib.suppress(ConnectionResetError):  # the parent is gone: nobody to tell
                    pipe.send(_encode_done(job, episode))

        def on_frame(frame: memoryview) -> None:
            job = from_msgpack(frame, _Job)
            # Its sandbox (if the flow has one) is prepared while the job waits for a slot.
            engine.prepare_sandboxes([job.task])
            jobs.put_nowait(job)

        # Connected once the engine is up: jobs the parent sends meanwhile wait in the socket.
        _, pipe = await loop.create_connection(lambda: _Frames(on_frame, closed.set), sock=sock)
        runners = [loop.create_task(runner()) for _ in range(engine.config.concurrency)]
        pipe.send(to_msgpack(_Ready(engine.gateway_url)))
        try:
            await closed.wait()  # the parent closed the pipe: shut down
        finally:
            for t in runners:
                t.cancel()
            await asyncio.gather(*runners, return_exceptions=True)


def _encode_done(job: _Job, episode: Episode) -> bytes:
    """The Done frame; an episode that cannot be encoded (a flow returned artifacts msgpack cannot
    carry) comes back as an agent_error saying so, rather than leaving the parent waiting."""
    try:
        return to_msgpack(_Done(job.id, pack_episode_images(episode)))  # each image sent once
    except Exception as exc:
        from rllm.engine.rollout.episode_builder import failed_episode
        from rllm.engine.rollout.scoring import apply_eval_output

        error = ErrorInfo(
            type=type(exc).__name__,
            message=f"the rollout's Episode cannot be sent from its worker process (with workers > 1 "
            f"a flow's result, artifacts and metadata must be msgpack-encodable): {exc}",
        )
        failed = failed_episode(job.task.id, job.rollout_index, TerminationReason.AGENT_ERROR, error)
        apply_eval_output(failed, EvalOutput(reward=0.0, is_correct=False))
        return to_msgpack(_Done(job.id, failed))


# ----------------------------------------------------------------------------- parent side
class _Worker:
    def __init__(self, index: int, process: Any, capacity: int) -> None:
        self.index = index
        self.process = process
        self.capacity = capacity  # its concurrency share plus the prefetch
        self.pipe: _Frames | None = None
        self.pending: dict[int, asyncio.Future[Episode]] = {}
        self.alive = True
        self.gateway_url = ""
        # Its gateway's URL once it is up; "" if it exited first.
        self.ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_frame(self, frame: memoryview) -> None:
        if not self.ready.done():
            self.ready.set_result(from_msgpack(frame, _Ready).gateway_url)
            return
        done = from_msgpack(frame, _Done)
        fut = self.pending.pop(done.id, None)
        if fut is not None and not fut.done():
            fut.set_result(done.episode)

    def on_lost(self) -> None:
        self.alive = False
        code = self.process.exitcode
        if not self.ready.done():
            self.ready.set_result("")  # exited before it was ready: start() says so
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(FlowProcessDied(f"rollout worker {self.index} exited (code {code})"))
        self.pending.clear()


class FlowProcessPool:
    """N flow processes (``RolloutConfig.workers``), each running a RolloutEngine built from
    ``engine_kwargs``.

    ``concurrency`` (rollouts running at once) is split between the workers; each also gets up
    to ``prefetch`` jobs more than its share (default: half its share), queued in the worker, so
    that a finished rollout's slot is refilled at once instead of after a round trip through
    this process, and stays busy while this process pauses (a full garbage collection of a
    parent holding thousands of Episodes takes tens of milliseconds). ``capacity`` is how many
    jobs the pool takes at a time. ``start_timeout_s`` is 300 s, as for Ray workers: a spawned
    interpreter importing torch took over 120 s on a loaded 2-core machine. ``early``: processes
    started beforehand (:mod:`rllm.engine.rollout.early_flow_processes`), used before spawning new ones.
    """

    def __init__(
        self,
        n: int,
        engine_kwargs: dict[str, Any],
        *,
        concurrency: int,
        prefetch: int | None = None,
        start_timeout_s: float = 300.0,
        early: EarlyFlowProcesses | None = None,
    ) -> None:
        self.n = n
        self.early = early  # processes started before this pool, adopted by start()
        self.engine_kwargs = engine_kwargs
        self.start_timeout_s = start_timeout_s
        self.slots = [concurrency // n + (i < concurrency % n) for i in range(n)]
        self.prefetch = max(1, concurrency // (2 * n)) if prefetch is None else prefetch
        self.workers: list[_Worker] = []
        self._ids = 0

    def _capacity(self, index: int) -> int:
        # A worker without a share (concurrency < workers) gets no jobs while the others live.
        return self.slots[index] + self.prefetch if self.slots[index] else 0

    @property
    def capacity(self) -> int:
        return sum(self._capacity(i) for i in range(self.n))

    @property
    def gateway_urls(self) -> list[str]:
        return [w.gateway_url for w in self.workers]

    async def start(self) -> FlowProcessPool:
        loop = asyncio.get_running_loop()
        try:
            for i in range(self.n):
                kwargs = dict(self.engine_kwargs)
                kwargs["gateway_config"] = _per_worker(kwargs.get("gateway_config"), i)
                kwargs["config"] = msgspec.structs.replace(
                    kwargs["config"], concurrency=max(1, self.slots[i])
                )
                try:
                    proc, parent_sock = await self._launch(i, kwargs)
                except (pickle.PicklingError, AttributeError, TypeError) as exc:
                    raise InputError(
                        f"workers > 1 needs an importable flow and evaluator (module-level, not a "
                        f"lambda or a local function): {exc}"
                    ) from None
                w = _Worker(i, proc, self._capacity(i))
                self.workers.append(w)
                _, w.pipe = await loop.create_connection(
                    lambda w=w: _Frames(w.on_frame, w.on_lost), sock=parent_sock
                )
            for w in self.workers:
                with contextlib.suppress(TimeoutError):
                    w.gateway_url = await asyncio.wait_for(w.ready, self.start_timeout_s)
                if not w.gateway_url and w.process.exitcode is None:
                    # Still running: slow, not broken (an overloaded machine), so no import hint.
                    raise StateError(
                        f"rollout worker {w.index} did not start within {self.start_timeout_s:.0f} s "
                        "(it is still starting; is the machine overloaded?)"
                    )
                if not w.gateway_url:
                    raise StateError(
                        f"rollout worker {w.index} did not start (exit code {w.process.exitcode}); "
                        "is the flow importable (defined at module level)?"
                    )
        except BaseException:
            await self.close()
            raise
        finally:
            if self.early is not None:
                self.early.close()  # any not taken (a pool of fewer workers than started early)
        return self

    async def _launch(self, index: int, kwargs: dict[str, Any]) -> tuple[Any, socket.socket]:
        """Worker ``index``'s process, running ``_worker_main(kwargs)``, and the parent's end of
        its socket: an early-started one when one is waiting, else a fresh spawn."""
        # In a thread: arguments larger than the socket's buffer wait for the process to finish
        # its imports and read them.
        if self.early is not None and (taken := await asyncio.to_thread(self.early.take, kwargs)) is not None:
            return taken
        parent_sock, child_sock = socket.socketpair()
        proc = multiprocessing.get_context("spawn").Process(
            target=_worker_main, args=(child_sock, kwargs), name=f"rllm-rollout-{index}", daemon=True
        )
        try:
            proc.start()
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        return proc, parent_sock

    async def run_one(self, task: Task, rollout_index: int, is_validation: bool, model: str) -> Episode:
        """Run one rollout on the live worker with the most room; raises FlowProcessDied if it exits
        first. (After a worker died the others may get more than their capacity: they queue it.)"""
        live = [w for w in self.workers if w.alive]
        if not live:
            raise FlowProcessDied("every rollout worker has exited")
        w = max(live, key=lambda w: w.capacity - len(w.pending))
        assert w.pipe is not None
        self._ids += 1
        fut: asyncio.Future[Episode] = asyncio.get_running_loop().create_future()
        w.pending[self._ids] = fut
        try:
            w.pipe.send(to_msgpack(_Job(self._ids, task, rollout_index, is_validation, model)))
        except ConnectionResetError:
            w.pending.pop(self._ids, None)
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
            await asyncio.to_thread(w.process.join, 10)
            if w.process.is_alive():
                w.process.kill()
        self.workers = []


def _per_worker(config: Any, index: int) -> Any:
    """A worker's own gateway config: any port, and its own SQLite file."""
    if config is None:
        return None
    changes: dict[str, Any] = {"port": 0}
    if config.store.startswith("sqlite:"):
        changes["store"] = f"{config.store}.worker{index}"
    return msgspec.structs.replace(config, **changes)
