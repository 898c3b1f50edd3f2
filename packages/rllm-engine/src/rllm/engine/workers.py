"""Rollouts across worker processes, for more agent traffic than one core can carry.

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
import multiprocessing
import pickle
import socket
import struct
from typing import Any

import msgspec

from rllm.types import Episode, Task, from_msgpack, to_msgpack

_HEADER = struct.Struct("<I")


class WorkerDied(ConnectionError):
    """The process running a rollout exited before answering."""


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


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    return await reader.readexactly(size)


def _write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(_HEADER.pack(len(payload)) + payload)


# ----------------------------------------------------------------------------- worker side
def _worker_main(sock: socket.socket, engine_kwargs: dict[str, Any]) -> None:
    """Entry point of a worker process."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_serve(sock, engine_kwargs))


async def _serve(sock: socket.socket, engine_kwargs: dict[str, Any]) -> None:
    from rllm.engine.rollout_engine import RolloutEngine

    reader, writer = await asyncio.open_connection(sock=sock)
    async with RolloutEngine(**engine_kwargs) as engine:
        _write_frame(writer, to_msgpack(_Ready(engine.gateway_url)))
        running: set[asyncio.Task[None]] = set()

        async def run(job: _Job) -> None:
            engine.config.model = job.model
            episode = await engine.run_one(job.task, job.rollout_index, job.is_validation)
            _write_frame(writer, to_msgpack(_Done(job.id, episode)))

        try:
            while True:
                job = from_msgpack(await _read_frame(reader), _Job)
                t = asyncio.create_task(run(job))
                running.add(t)
                t.add_done_callback(running.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the parent closed the pipe: shut down
        finally:
            for t in running:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)


# ----------------------------------------------------------------------------- parent side
class _Worker:
    def __init__(
        self, index: int, process: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.index = index
        self.process = process
        self.reader = reader
        self.writer = writer
        self.pending: dict[int, asyncio.Future[Episode]] = {}
        self.alive = True
        self.gateway_url = ""
        self.listener: asyncio.Task[None] | None = None

    async def listen(self) -> None:
        try:
            while True:
                done = from_msgpack(await _read_frame(self.reader), _Done)
                fut = self.pending.pop(done.id, None)
                if fut is not None and not fut.done():
                    fut.set_result(done.episode)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.alive = False
            code = self.process.exitcode
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(WorkerDied(f"rollout worker {self.index} exited (code {code})"))
            self.pending.clear()


class WorkerPool:
    """N worker processes, each running a RolloutEngine built from ``engine_kwargs``."""

    def __init__(self, n: int, engine_kwargs: dict[str, Any], *, start_timeout_s: float = 120.0) -> None:
        self.n = n
        self.engine_kwargs = engine_kwargs
        self.start_timeout_s = start_timeout_s
        self.workers: list[_Worker] = []
        self._ids = 0

    @property
    def gateway_urls(self) -> list[str]:
        return [w.gateway_url for w in self.workers]

    async def start(self) -> WorkerPool:
        ctx = multiprocessing.get_context("spawn")
        try:
            for i in range(self.n):
                parent_sock, child_sock = socket.socketpair()
                kwargs = dict(self.engine_kwargs)
                kwargs["gateway_config"] = _per_worker(kwargs.get("gateway_config"), i)
                proc = ctx.Process(
                    target=_worker_main, args=(child_sock, kwargs), name=f"rllm-rollout-{i}", daemon=True
                )
                try:
                    proc.start()
                except (pickle.PicklingError, AttributeError, TypeError) as exc:
                    parent_sock.close()
                    child_sock.close()
                    raise ValueError(
                        f"workers > 1 needs an importable flow and evaluator (module-level, not a "
                        f"lambda or a local function): {exc}"
                    ) from None
                child_sock.close()
                reader, writer = await asyncio.open_connection(sock=parent_sock)
                self.workers.append(_Worker(i, proc, reader, writer))
            for w in self.workers:
                try:
                    frame = await asyncio.wait_for(_read_frame(w.reader), self.start_timeout_s)
                except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
                    raise RuntimeError(
                        f"rollout worker {w.index} did not start (exit code {w.process.exitcode}); "
                        "is the flow importable (defined at module level)?"
                    ) from None
                w.gateway_url = from_msgpack(frame, _Ready).gateway_url
                w.listener = asyncio.create_task(w.listen())
        except BaseException:
            await self.close()
            raise
        return self

    async def run_one(self, task: Task, rollout_index: int, is_validation: bool, model: str) -> Episode:
        """Run one rollout on the least-loaded live worker; raises WorkerDied if it exits first."""
        live = [w for w in self.workers if w.alive]
        if not live:
            raise WorkerDied("every rollout worker has exited")
        w = min(live, key=lambda w: len(w.pending))
        self._ids += 1
        fut: asyncio.Future[Episode] = asyncio.get_running_loop().create_future()
        w.pending[self._ids] = fut
        _write_frame(w.writer, to_msgpack(_Job(self._ids, task, rollout_index, is_validation, model)))
        return await fut

    async def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):
                w.writer.close()
        for w in self.workers:
            await asyncio.to_thread(w.process.join, 10)
            if w.process.is_alive():
                w.process.kill()
            if w.listener is not None:
                await asyncio.gather(w.listener, return_exceptions=True)
        self.workers = []


def _per_worker(config: Any, index: int) -> Any:
    """A worker's own gateway config: any port, and its own SQLite file."""
    if config is None:
        return None
    changes: dict[str, Any] = {"port": 0}
    if config.store.startswith("sqlite:"):
        changes["store"] = f"{config.store}.worker{index}"
    return msgspec.structs.replace(config, **changes)


class GatewayGroup:
    """The admin calls a trainer makes (weights, admission, upstream workers), sent to every
    worker's own gateway, so N embedded gateways act as one."""

    def __init__(self, urls: list[str], admin_key: str | None = None) -> None:
        from rllm.gateway import GatewayClient

        self.clients = [GatewayClient(url, admin_key=admin_key) for url in urls]

    async def _all(self, method: str, *args: Any) -> list[Any]:
        return await asyncio.gather(*(getattr(c, method)(*args) for c in self.clients))

    async def set_weight_version(self, version: int) -> None:
        await self._all("set_weight_version", version)

    async def get_weight_version(self) -> int:
        return min(await self._all("get_weight_version"))

    async def pause(self, timeout_s: float = 600.0) -> None:
        await self._all("pause", timeout_s)

    async def resume(self) -> None:
        await self._all("resume")

    async def flush(self) -> None:
        await self._all("flush")

    async def add_worker(self, url: str) -> dict[str, Any]:
        return (await self._all("add_worker", url))[0]

    async def remove_worker(self, url: str) -> None:
        await self._all("remove_worker", url)

    async def list_workers(self) -> list[dict[str, Any]]:
        return await self.clients[0].list_workers()

    async def health(self) -> dict[str, Any]:
        return {"gateways": await self._all("health")}

    async def close(self) -> None:
        await self._all("close")
