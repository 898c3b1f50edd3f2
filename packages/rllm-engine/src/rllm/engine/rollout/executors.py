"""Where a RolloutEngine's flows run: ``rollout.executor``.

- ``local``: in the engine's own process, as asyncio tasks (sync flows in a thread pool).
- ``processes``: in ``rollout.workers`` spawned local processes (:mod:`rllm.engine.rollout.flow_processes`).
- ``ray``: in Ray actors placed across a Ray cluster's nodes (:mod:`rllm.engine.rollout.ray_executor`,
  the ``rllm-engine[ray]`` extra), ``rollout.ray`` saying which cluster and how many.
- ``remote``: agent services over HTTP run it (:mod:`rllm.engine.rollout.remote_executor`,
  ``rollout.remote.urls``); the cookbook's own flow is not run, its evaluator and data are used.
  The engine runs a :class:`~rllm.engine.rollout.remote_executor.RemoteFlow` in its own process instead.

Unset, it is ``processes`` when ``workers`` > 1 and ``local`` otherwise (the behaviour from before
the key existed). Every non-local executor is a *worker pool*: each worker runs its own
RolloutEngine with its own embedded gateway (or attached to the engine's gateway URL), the
engine hands each rollout to the worker with the most room and gets the Episode back msgpack
encoded, and a worker that dies fails its rollouts with :class:`FlowProcessDied`, which the
engine retries on another worker. A further executor is one more branch of :func:`start_pool`.
Every executor keeps the engine's sessions, deadlines, retries and scoring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from rllm.engine.rollout.remote_executor import RemoteFlow
from rllm.types import Episode, InvariantError, Task

if TYPE_CHECKING:
    from rllm.engine.rollout.rollout_config import RolloutSettings

EXECUTORS = ("local", "processes", "ray", "remote")
# Executors that run every rollout from the engine's own process (no worker pool).
IN_PROCESS_EXECUTORS = ("local", "remote")


class RaySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``rollout.ray``: the cluster the ``ray`` executor runs its workers on.

    ``address`` is a Ray cluster's address (``ray://…`` or ``HOST:PORT``; None: the one Ray is
    already connected to in this process, e.g. the verl backend's, else a local instance started
    for the run; set while Ray is connected to another cluster, it is refused, naming both).
    ``num_workers`` actors (None: ``rollout.workers``), each holding
    ``resources_per_worker``: ``CPU``, ``GPU``, ``memory`` (bytes) and any custom resource of the
    cluster (e.g. ``sandbox``). Workers are spread over the nodes (Ray's SPREAD strategy).
    ``runtime_env`` is the workers' Ray runtime environment (``env_vars``, ``pip``,
    ``working_dir``, ...), for a flow the cluster's Python does not have installed.
    """

    address: str | None = None
    num_workers: int | None = None
    resources_per_worker: dict[str, float] = msgspec.field(default_factory=lambda: {"CPU": 1.0})
    runtime_env: dict[str, Any] | None = None
    start_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.num_workers is not None and self.num_workers < 1:
            raise InvariantError(f"num_workers must be >= 1, got {self.num_workers}", "num_workers")
        for name, amount in self.resources_per_worker.items():
            if amount < 0:
                raise InvariantError(
                    f"resources_per_worker[{name!r}] must be >= 0, got {amount}", "resources_per_worker"
                )
        if self.start_timeout_s <= 0:
            raise InvariantError(
                f"start_timeout_s must be > 0, got {self.start_timeout_s}", "start_timeout_s"
            )


def resolve_executor(executor: str | None, workers: int) -> str:
    """The executor a config means (see the module docstring for the default)."""
    if executor is not None:
        return executor
    return "processes" if workers > 1 else "local"


class WorkerPool(Protocol):
    """What the engine needs of a non-local executor."""

    @property
    def capacity(self) -> int:
        """How many rollouts the engine keeps in flight (running plus queued in workers)."""
        ...

    @property
    def gateway_urls(self) -> list[str]:
        """Every worker's embedded gateway (for the engine's GatewayGroup admin)."""
        ...

    async def run_one(self, task: Task, rollout_index: int, is_validation: bool, model: str) -> Episode: ...

    async def close(self) -> None: ...


async def start_pool(config: Any, engine_kwargs: dict[str, Any], early: Any = None) -> WorkerPool | None:
    """The started worker pool of a RolloutConfig ``config`` (None for ``local``); each worker
    builds a RolloutEngine from ``engine_kwargs``. ``early``: flow processes already started
    (an EarlyFlowProcesses), which a ``processes`` pool adopts."""
    kind = resolve_executor(config.executor, config.workers)
    if kind in IN_PROCESS_EXECUTORS:
        return None
    if kind == "processes":
        from rllm.engine.rollout.flow_processes import FlowProcessPool

        return await FlowProcessPool(
            config.workers,
            engine_kwargs,
            concurrency=config.concurrency,
            prefetch=config.worker_prefetch,
            early=early,
        ).start()
    from rllm.engine.rollout.ray_executor import RayFlowPool  # only here: ray is an optional extra

    return await RayFlowPool(
        config.ray.num_workers or config.workers,
        engine_kwargs,
        concurrency=config.concurrency,
        prefetch=config.worker_prefetch,
        settings=config.ray,
    ).start()


def executor_flow(settings: RolloutSettings, flow: Any) -> Any:
    """The flow object the engine runs for ``settings.executor`` (the remote services' stand-in
    for ``remote``, the cookbook's own flow otherwise)."""
    if settings.executor == "remote":
        return RemoteFlow(settings.remote, deadline_s=settings.deadline_s)
    return flow


async def start_executor(flow: Any) -> None:
    """Before any rollout: check the executor can run one (fails loud, naming what is missing)."""
    if isinstance(flow, RemoteFlow):
        await flow.start()


def close_executor(flow: Any) -> None:
    if isinstance(flow, RemoteFlow):
        flow.close()
