"""The ``ray`` executor: flow workers as Ray actors across a cluster's nodes.

Each worker is an async Ray actor running what a flow process runs
(:mod:`rllm.engine.flow_processes`): its own RolloutEngine with an embedded gateway routing to
the backend's inference URLs, bound to its node's IP so the engine's ``GatewayGroup`` admin
(pause/resume, weight version, upstreams, traces) and the worker's flows reach it. The driver
sends a job (msgpack) to the worker with the most room and gets the Episode back msgpack-encoded;
each worker runs at most its share of ``rollout.concurrency`` and queues up to ``prefetch`` more.
A worker whose process or node dies fails its in-flight rollouts with :class:`RayWorkerDied`
(a ``FlowProcessDied``: the engine retries them on another worker, as ``infra_error`` when none
is left) and takes no more work. A rollout cancelled in the driver (its step cancelled, a
Ctrl-C, a dropped group) is cancelled in its actor too (``ray.cancel``): its flow, sandbox and
gateway session end there, not only the driver's wait for it.

Ray is the ``rllm-engine[ray]`` extra; this is the one engine module that imports it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import time
from typing import Any

import msgspec

from rllm.engine.executors import RaySettings
from rllm.engine.flow_processes import (
    QUIET_LOGGERS_ENV,
    FlowProcessDied,
    _Done,
    _encode_done,
    _Job,
    _per_worker,
    quiet_loggers_from_env,
)
from rllm.engine.worker_metrics import WORKER_KEY
from rllm.types import Episode, Task, from_msgpack, to_msgpack
from rllm.types.errors import ConfigError, MissingExtraError, StateError

try:
    import ray
    from ray.exceptions import ActorUnavailableError, RayActorError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError("rollout.executor = 'ray' needs Ray: pip install 'rllm-engine[ray]'") from exc

log = logging.getLogger(__name__)

# Ray waits a fixed 30 s for a new node's raylet to register; on a loaded machine a local start
# misses that window now and then although nothing is wrong, so a local start is tried again (a
# cluster at an address is never retried: its failure is the user's to see).
RAY_START_TRIES = 3
RAY_START_TIMEOUT_TEXT = "timed out during startup"


class RayWorkerDied(FlowProcessDied):
    """The Ray actor (or its node) running a rollout died before answering."""


ADDRESS_KEY = "rollout.ray.address"


def connect_ray(address: str | None) -> bool:
    """Connect this process to Ray: the instance it already has, the cluster at ``address``, or
    a new local instance. True when this call connected (the caller then shuts it down).

    When Ray is already initialised here (e.g. by the verl backend), it is reused if ``address``
    is unset, ``auto`` or names the same cluster; another address is refused (ConfigError naming
    both) rather than silently running the rollouts on the cluster Ray is connected to."""
    if ray.is_initialized():
        current = current_ray_address()
        if address not in (None, "auto") and not same_ray_address(address, current):
            raise ConfigError.for_key(
                ADDRESS_KEY,
                f"{address!r}, but Ray is already initialised in this process with {current!r} (by "
                f"the backend or an earlier ray.init); set {ADDRESS_KEY} to {current!r} or leave it "
                "unset to share that cluster",
            )
        return False
    for attempt in range(1, RAY_START_TRIES + 1):
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=True)
            return True
        except Exception as exc:
            if address is not None or RAY_START_TIMEOUT_TEXT not in str(exc) or attempt == RAY_START_TRIES:
                raise
            ray.shutdown()
    return False  # not reached: the last attempt returns or raises


def current_ray_address() -> str:
    """The cluster this process's Ray is connected to: ``ray://HOST:PORT`` (Ray client) or the
    GCS's ``HOST:PORT``."""
    from ray.util.client import ray as client

    if client.is_connected():
        worker = getattr(client.get_context(), "client_worker", None)
        return f"ray://{getattr(worker, '_conn_str', '') or '?'}"
    return str(ray.get_runtime_context().gcs_address)


def _endpoint(address: str) -> tuple[str, str, int | None]:
    """(scheme, IP, port) of ``[ray://]HOST[:PORT]``; a loopback host stands for this machine."""
    scheme, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    host = host.strip("[]")
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        ip = host
    if ip.startswith("127.") or ip == "::1":
        ip = ray.util.get_node_ip_address()
    return scheme, ip, int(port) if port.isdigit() else None


def same_ray_address(wanted: str, current: str) -> bool:
    """Whether ``wanted`` (a ``rollout.ray.address``) names the cluster at ``current``."""
    w_scheme, w_ip, w_port = _endpoint(wanted)
    c_scheme, c_ip, c_port = _endpoint(current)
    return (w_scheme, w_ip) == (c_scheme, c_ip) and (w_port is None or w_port == c_port)


class FlowWorker:
    """A Ray actor (wrapped with ``ray.remote`` by the pool): one RolloutEngine, ``slots``
    rollouts at a time; calls beyond that wait in the actor (the prefetch)."""

    def __init__(self, engine_kwargs: dict[str, Any], slots: int) -> None:
        self._kwargs = engine_kwargs
        self._slots = slots
        self._engine: Any = None
        self._free: asyncio.Semaphore | None = None

    async def start(self) -> tuple[str, str]:
        """Start the engine and its gateway; its URL and this node's id."""
        from rllm.engine.rollout_engine import RolloutEngine, default_gateway_config

        quiet_loggers_from_env()
        kwargs = dict(self._kwargs)
        host = ray.util.get_node_ip_address()
        if kwargs.get("gateway_url") is None:
            # The gateway listens on the node's address: the driver's admin reaches it from afar.
            cfg = kwargs.pop("gateway_config", None) or default_gateway_config(
                kwargs.pop("upstreams", None) or [], kwargs.get("admin_key")
            )
            kwargs["upstreams"] = None
            kwargs["gateway_config"] = msgspec.structs.replace(cfg, host=host, port=0)
        self._engine = await RolloutEngine(**kwargs).start()
        self._free = asyncio.Semaphore(self._slots)
        return self._engine.gateway_url, ray.get_runtime_context().get_node_id()

    async def run(self, job_bytes: bytes) -> bytes:
        """One rollout: a msgpack ``_Job`` in, a msgpack ``_Done`` out."""
        assert self._engine is not None and self._free is not None, "start() first"
        job = from_msgpack(job_bytes, _Job)
        # Its sandbox (if the flow has one) is prepared while the job waits for a slot.
        self._engine.prepare_sandboxes([job.task])
        t0 = time.monotonic()
        async with self._free:
            waited = time.monotonic() - t0
            episode = await self._engine.run_one(
                job.task, job.rollout_index, job.is_validation, model=job.model
            )
        episode.metrics["slot_wait_s"] = waited
        return _encode_done(job, episode)

    async def stop(self) -> None:
        if self._engine is not None:
            await self._engine.close()
            self._engine = None


class _Handle:
    def __init__(self, index: int, actor: Any, slots: int, capacity: int) -> None:
        self.index = index
        self.actor = actor
        self.slots = slots
        self.capacity = capacity
        self.in_flight = 0
        self.alive = True
        self.gateway_url = ""
        self.node_id = ""


class RayFlowPool:
    """``n`` FlowWorker actors on the Ray cluster of ``settings``; the interface of
    :class:`~rllm.engine.flow_processes.FlowProcessPool` (see :mod:`rllm.engine.executors`).

    ``completed_by_node`` counts the rollouts each node's workers finished; ``workers_lost`` the
    workers that died; ``sandbox_acquire_s`` each worker's sandbox acquire latencies (by worker
    index). Each episode names its worker in ``metadata["rollout_worker"]``."""

    def __init__(
        self,
        n: int,
        engine_kwargs: dict[str, Any],
        *,
        concurrency: int,
        prefetch: int | None = None,
        settings: RaySettings | None = None,
    ) -> None:
        self.n = n
        self.engine_kwargs = engine_kwargs
        self.settings = settings or RaySettings()
        self.slots = [concurrency // n + (i < concurrency % n) for i in range(n)]
        self.prefetch = max(1, concurrency // (2 * n)) if prefetch is None else prefetch
        self.workers: list[_Handle] = []
        self.completed_by_node: collections.Counter[str] = collections.Counter()
        self.workers_lost = 0
        self.sandbox_acquire_s: dict[int, list[float]] = {}
        self._ids = 0
        self._connected = False

    def _capacity(self, index: int) -> int:
        return self.slots[index] + self.prefetch if self.slots[index] else 0

    @property
    def capacity(self) -> int:
        return sum(self._capacity(i) for i in range(self.n))

    @property
    def gateway_urls(self) -> list[str]:
        return [w.gateway_url for w in self.workers]

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
        self._connected = await asyncio.to_thread(connect_ray, self.settings.address)
        try:
            actor_cls = ray.remote(FlowWorker).options(**self._actor_options())
            for i in range(self.n):
                kwargs = dict(self.engine_kwargs)
                kwargs["gateway_config"] = _per_worker(kwargs.get("gateway_config"), i)
                kwargs["config"] = msgspec.structs.replace(
                    kwargs["config"], concurrency=max(1, self.slots[i])
                )
                actor = actor_cls.remote(kwargs, max(1, self.slots[i]))
                self.workers.append(_Handle(i, actor, self.slots[i], self._capacity(i)))
            starts = [w.actor.start.remote() for w in self.workers]
            try:
                ready = await asyncio.wait_for(asyncio.gather(*starts), self.settings.start_timeout_s)
            except TimeoutError:
                raise StateError(
                    f"{self.n} Ray rollout workers did not all start within {self.settings.start_timeout_s:g} s: "
                    f"does the cluster have {self.settings.resources_per_worker} free per worker "
                    "(rollout.ray.resources_per_worker)?"
                ) from None
            for w, (url, node) in zip(self.workers, ready, strict=True):
                w.gateway_url, w.node_id = url, node
        except BaseException:
            await self.close()
            raise
        return self

    async def run_one(self, task: Task, rollout_index: int, is_validation: bool, model: str) -> Episode:
        live = [w for w in self.workers if w.alive]
        if not live:
            raise RayWorkerDied("every Ray rollout worker has died")
        w = max(live, key=lambda w: w.capacity - w.in_flight)
        self._ids += 1
        job = to_msgpack(_Job(self._ids, task, rollout_index, is_validation, model))
        w.in_flight += 1
        try:
            ref = w.actor.run.remote(job)
            try:
                answer = await ref
            except asyncio.CancelledError:
                # The rollout ends in its actor too (its flow task gets CancelledError there, so
                # its sandbox and session are released), not only this wait for it.
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
                raise
        except (RayActorError, ActorUnavailableError) as exc:
            if w.alive:
                w.alive = False
                self.workers_lost += 1
                log.warning("Ray rollout worker %d on node %s died: %s", w.index, w.node_id[:12], exc)
            raise RayWorkerDied(f"Ray rollout worker {w.index} (node {w.node_id[:12]}) died") from None
        finally:
            w.in_flight -= 1
        self.completed_by_node[w.node_id] += 1
        episode = from_msgpack(answer, _Done).episode
        episode.metadata[WORKER_KEY] = f"ray-{w.index}@{w.node_id[:12]}"
        if "sandbox_acquire_s" in episode.metrics:
            self.sandbox_acquire_s.setdefault(w.index, []).append(episode.metrics["sandbox_acquire_s"])
        return episode

    async def close(self) -> None:
        live = [w for w in self.workers if w.alive]
        if live:
            stops = [w.actor.stop.remote() for w in live]
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*stops, return_exceptions=True), 30)
        for w in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(w.actor)
        self.workers = []
        if self._connected:
            self._connected = False
            await asyncio.to_thread(ray.shutdown)
