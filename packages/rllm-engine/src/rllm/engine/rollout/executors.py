"""Where a RolloutEngine's flows run: ``rollout.executor``, looked up in one registry.

The built-in executors, registered below through :func:`register_executor` as a plugin's are:

- ``local``: in the engine's own process, as asyncio tasks (sync flows in a thread pool).
- ``remote``: agent services over HTTP run it (:mod:`rllm.engine.rollout.remote_executor`,
  ``rollout.remote.urls``); the cookbook's own flow is not run, its evaluator and data are used.
  The engine runs a :class:`~rllm.engine.rollout.remote_executor.RemoteFlow` in its own process instead.
- ``processes``: in ``rollout.workers`` spawned local processes (:mod:`rllm.engine.rollout.flow_processes`).
- ``ray``: in Ray actors placed across a Ray cluster's nodes (:mod:`rllm.engine.rollout.ray_executor`,
  the ``rllm-engine[ray]`` extra), ``rollout.ray`` saying which cluster and how many.

Unset, it is ``processes`` when ``workers`` > 1 and ``local`` otherwise (the behaviour from before
the key existed). An executor (:class:`ExecutorSpec`) is one of two kinds:

- a *worker pool* (``pool``): each worker runs its own RolloutEngine (built by the engine's
  factory) with its own embedded gateway (or attached to the engine's gateway URL); the engine
  hands each rollout to the worker with the most room and gets the Episode back, and a worker
  that dies fails its rollouts with :class:`~rllm.engine.rollout.worker_pool.FlowProcessDied`,
  which the engine retries on another worker. What pools share: :mod:`rllm.engine.rollout.worker_pool`.
- *in-process* (no ``pool``): every rollout runs from the engine's own process (``workers``
  must be 1); ``flow`` may stand in for the cookbook's flow (``remote``), started before the
  first rollout and closed with the engine.

Every executor keeps the engine's sessions, deadlines, retries and scoring. Adding one (docs/
architecture.md, "How to add an executor"): ``register_executor(ExecutorSpec(...))`` in-process,
or an installed package's entry point, so ``rllm train`` finds it without code: in its
``pyproject.toml``, ``[project.entry-points."rllm.executors"] mine = "my_pkg.executor:EXECUTOR"``
(an ExecutorSpec, or a module whose import registers the name itself). Entry points are read
once per process (``refresh_plugins()`` reads them again), a target imported when first looked up.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol

import msgspec

from rllm.engine.rollout.episode_builder import failed_episode
from rllm.engine.rollout.remote_executor import RemoteFlow, RemoteSettings
from rllm.engine.rollout.scoring import apply_eval_output
from rllm.engine.rollout.worker_pool import EngineFactory, FlowProcessDied
from rllm.types import Episode, ErrorInfo, EvalOutput, InvariantError, SamplingParams, Task, TerminationReason
from rllm.types.errors import InputError, LookupFailed, UsageError

EXECUTORS_GROUP = "rllm.executors"


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
    ``uv_runtime_env`` lets Ray's own ``uv run`` hook rebuild the driver's uv project on every
    worker (off by default: it builds a virtualenv per node, several GB, in Ray's session folder;
    workers then run in the driver's own interpreter, which a local cluster and nodes sharing the
    driver's environment have). ``connect_timeout_s`` bounds the wait for ``address`` to answer
    (Ray alone would retry an address nobody answers at without end).
    """

    address: str | None = None
    num_workers: int | None = None
    resources_per_worker: dict[str, float] = msgspec.field(default_factory=lambda: {"CPU": 1.0})
    runtime_env: dict[str, Any] | None = None
    uv_runtime_env: bool = False
    connect_timeout_s: float = 30.0
    start_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.num_workers is not None and self.num_workers < 1:
            raise InvariantError(f"num_workers must be >= 1, got {self.num_workers}", "num_workers")
        for name, amount in self.resources_per_worker.items():
            if amount < 0:
                raise InvariantError(
                    f"resources_per_worker[{name!r}] must be >= 0, got {amount}", "resources_per_worker"
                )
        if self.connect_timeout_s <= 0:
            raise InvariantError(
                f"connect_timeout_s must be > 0, got {self.connect_timeout_s}", "connect_timeout_s"
            )
        if self.start_timeout_s <= 0:
            raise InvariantError(
                f"start_timeout_s must be > 0, got {self.start_timeout_s}", "start_timeout_s"
            )


class ExecutorSettings(Protocol):
    """What an executor reads of the rollout settings (a RolloutSettings / RolloutConfig)."""

    executor: str | None
    workers: int
    concurrency: int
    worker_prefetch: int | None
    deadline_s: float | None
    ray: RaySettings
    remote: RemoteSettings


class WorkerPool(Protocol):
    """What the engine needs of a worker pool (a started one)."""

    @property
    def capacity(self) -> int:
        """How many rollouts the engine keeps in flight (running plus queued in workers)."""
        ...

    @property
    def gateway_urls(self) -> list[str]:
        """Every worker's embedded gateway (for the engine's GatewayGroup admin)."""
        ...

    async def run_one(
        self,
        task: Task,
        rollout_index: int,
        is_validation: bool,
        model: str,
        sampling: SamplingParams | None = None,
    ) -> Episode: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class PoolRequest:
    """What a pool starts from: the rollout ``settings`` (a RolloutConfig), how each worker
    builds its engine (``engine(**kwargs)`` with the kwargs of
    :meth:`~rllm.engine.rollout.worker_pool.WorkerSlots.engine_kwargs`), and flow processes
    started early (``rllm train``'s EarlyFlowProcesses, which the ``processes`` pool adopts)."""

    settings: ExecutorSettings
    engine: EngineFactory
    engine_kwargs: dict[str, Any]
    early: Any = None


class ExecutorFlow(Protocol):
    """A flow an in-process executor runs instead of the cookbook's (a RolloutFlow besides)."""

    async def start(self) -> None:
        """Before any rollout: check it can run one (fails loud, naming what is missing)."""
        ...

    def close(self) -> None: ...


PoolStarter = Callable[[PoolRequest], Awaitable[WorkerPool]]
FlowMaker = Callable[[ExecutorSettings, Any], ExecutorFlow]


@dataclass(frozen=True)
class ExecutorSpec:
    """A registered executor.

    ``pool``: a worker pool's starter, ``async fn(PoolRequest) -> WorkerPool`` (the pool started),
    or its ``"module:function"`` path, imported when a pool is first started (so naming an
    executor never imports its dependencies: Ray for ``ray``). None: an in-process executor.
    ``flow``: ``fn(settings, cookbook_flow) -> ExecutorFlow``, the flow an in-process executor
    runs instead of the cookbook's (None: the cookbook's own). ``check``: ``fn(settings)``,
    raising ``InvariantError`` for settings this executor cannot run with, called when the
    settings are built (before anything starts)."""

    name: str
    pool: str | PoolStarter | None = None
    flow: FlowMaker | None = None
    check: Callable[[ExecutorSettings], None] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InputError(f"executor name must be a non-empty string, got {self.name!r}")
        if self.pool is not None and self.flow is not None:
            raise InputError(
                f"executor {self.name!r}: a worker pool's workers run the cookbook's flow; give pool or flow, not both"
            )

    @property
    def in_process(self) -> bool:
        """Every rollout runs from the engine's own process (no worker pool)."""
        return self.pool is None

    def load_pool(self) -> PoolStarter:
        """The pool starter (imported from its path the first time)."""
        if self.pool is None:
            raise UsageError(f"executor {self.name!r} runs rollouts in-process: it has no worker pool")
        if not isinstance(self.pool, str):
            return self.pool
        module, _, attr = self.pool.partition(":")
        return getattr(importlib.import_module(module), attr)


_EXECUTORS: dict[str, ExecutorSpec] = {}
_PLUGINS: dict[str, EntryPoint] | None = None


def register_executor(spec: ExecutorSpec, *, replace: bool = False) -> ExecutorSpec:
    """Make ``spec`` available as ``rollout.executor = spec.name``. Registering an existing name
    is an error unless ``replace=True``, so two plugins cannot silently shadow each other."""
    if not isinstance(spec, ExecutorSpec):
        raise UsageError(f"register_executor takes an ExecutorSpec, got {type(spec).__name__}")
    if spec.name in _EXECUTORS and not replace:
        raise InputError(f"executor {spec.name!r} is already registered (pass replace=True to override it)")
    _EXECUTORS[spec.name] = spec
    return spec


def unregister_executor(name: str) -> None:
    """Remove a registered executor (mainly for tests and plugins that clean up)."""
    _EXECUTORS.pop(name, None)


def get_executor(name: str) -> ExecutorSpec:
    """The executor registered as ``name``; a LookupFailed (a KeyError) listing the known names otherwise."""
    spec = _EXECUTORS.get(name) or _from_plugin(name)
    if spec is None:
        raise LookupFailed(f"unknown executor {name!r}; known: {', '.join(sorted(available_executors()))}")
    return spec


def available_executors() -> frozenset[str]:
    """Names of every executor: built-in, registered, or offered by an installed entry point."""
    return frozenset(_EXECUTORS) | frozenset(_plugins())


def refresh_plugins() -> None:
    """Read the ``rllm.executors`` entry points again (after installing a package into the
    running process's path)."""
    global _PLUGINS
    _PLUGINS = None


def _plugins() -> dict[str, EntryPoint]:
    global _PLUGINS
    if _PLUGINS is None:
        _PLUGINS = {ep.name: ep for ep in entry_points(group=EXECUTORS_GROUP)}
    return _PLUGINS


def _from_plugin(name: str) -> ExecutorSpec | None:
    """Load the entry point ``name`` into the registry; None when there is none."""
    point = _plugins().get(name)
    if point is None:
        return None
    loaded = point.load()
    if name not in _EXECUTORS:  # the import may have registered the name itself
        if not isinstance(loaded, ExecutorSpec) or loaded.name != name:
            raise UsageError(
                f"entry point {EXECUTORS_GROUP}:{name} is {loaded!r}, not the ExecutorSpec of {name!r}"
            )
        _EXECUTORS[name] = loaded
    return _EXECUTORS[name]


def resolve_executor(executor: str | None, workers: int) -> str:
    """The executor a config means (see the module docstring for the default)."""
    if executor is not None:
        return executor
    return "processes" if workers > 1 else "local"


def executor_for(settings: ExecutorSettings) -> ExecutorSpec:
    """The executor ``settings`` run their rollouts on."""
    return get_executor(resolve_executor(settings.executor, settings.workers))


async def start_pool(spec: ExecutorSpec, request: PoolRequest) -> WorkerPool:
    """The started worker pool of executor ``spec``."""
    return await spec.load_pool()(request)


async def run_on_pool(
    pool: WorkerPool,
    task: Task,
    rollout_index: int,
    is_validation: bool,
    model: str,
    max_retries: int,
    sampling: SamplingParams | None = None,
) -> Episode:
    """One rollout on a worker pool. A worker that dies with it (FlowProcessDied) has it run again
    on another one, up to ``max_retries`` times (``metrics["worker_lost"]`` counts them); past
    that it is an ``infra_error``."""
    died: FlowProcessDied | None = None
    for lost in range(max_retries + 1):
        try:
            # ``sampling`` only when chosen: a pool written before it existed still runs the rest
            episode = await (
                pool.run_one(task, rollout_index, is_validation, model, sampling)
                if sampling is not None
                else pool.run_one(task, rollout_index, is_validation, model)
            )
        except FlowProcessDied as exc:  # its worker died: run it again on another one
            died = exc
            continue
        if lost:
            episode.metrics["worker_lost"] = float(lost)
        return episode
    assert died is not None  # max_retries >= 0 (RolloutConfig checks it): the loop ran and failed
    episode = failed_episode(
        task.id, rollout_index, TerminationReason.INFRA_ERROR, ErrorInfo.from_exception(died)
    )
    apply_eval_output(episode, EvalOutput(reward=0.0, is_correct=False))
    episode.metrics["worker_lost"] = float(max_retries + 1)
    return episode


def _remote_flow(settings: ExecutorSettings, flow: Any) -> RemoteFlow:
    return RemoteFlow(settings.remote, deadline_s=settings.deadline_s)


def _remote_needs_urls(settings: ExecutorSettings) -> None:
    if not settings.remote.urls:
        raise InvariantError('executor = "remote" needs remote.urls (the agent services)', "remote.urls")


# In-process first, then the pools (the capability matrix lists them in this order).
_BUILTINS = (
    ExecutorSpec("local"),
    ExecutorSpec("remote", flow=_remote_flow, check=_remote_needs_urls),
    ExecutorSpec("processes", pool="rllm.engine.rollout.flow_processes:start_process_pool"),
    ExecutorSpec("ray", pool="rllm.engine.rollout.ray_executor:start_ray_pool"),
)
for _spec in _BUILTINS:
    register_executor(_spec)
BUILTIN_EXECUTORS: tuple[str, ...] = tuple(spec.name for spec in _BUILTINS)
