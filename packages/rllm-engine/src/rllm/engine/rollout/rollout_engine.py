"""RolloutEngine: run a flow on many tasks in parallel through the gateway and return Episodes.

For every rollout the engine creates a gateway session, hands the flow that session's URL and
the agent's view of its task (``rllm.types.agent_view``), runs it under a deadline, finishes the
session (takes its traces and deletes it, one admin call), builds the Episode (trajectories by
role, Steps with the sampler's token ids and logprobs) and scores it with the evaluator, which
gets the full task, in the rollout's sandbox when the flow has one. An engine that starts its own gateway makes those admin calls in
process (``GatewayServer.local_client()``); one attached to a gateway makes them over HTTP. The batch always completes: every rollout ends as an Episode whose
``termination_reason`` says why (done, agent_error, timeout, infra_error, ...). Infrastructure
failures are retried on a fresh session; the failed attempt's traces are discarded with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from rllm.engine.rollout.batch import stream_groups
from rllm.engine.rollout.executors import PoolRequest, WorkerPool, executor_for, run_on_pool, start_pool
from rllm.engine.rollout.own_gateway import owned_gateway_config
from rllm.engine.rollout.rollout_config import RolloutConfig, drawings_sampling
from rllm.engine.rollout.rollout_progress import RolloutProgress
from rllm.engine.rollout.rollout_runner import RolloutRunner
from rllm.engine.sandbox.provider import SandboxProvider, make_backend
from rllm.runtime.gc_threshold import raise_gc_threshold, restore_gc_threshold
from rllm.sdk.evaluator import EvaluatorFn, as_evaluator
from rllm.sdk.flow import RolloutFlow, as_flow
from rllm.sdk.sandbox import declares_sandbox
from rllm.types import Episode, SamplingParams, Task, convert
from rllm.types.errors import ConfigError, InputError, StateError

if TYPE_CHECKING:
    from rllm.engine.rollout.early_flow_processes import EarlyFlowProcesses
    from rllm.gateway import GatewayAdmin, GatewayServer


def as_tasks(tasks: Iterable[Task | dict[str, Any]]) -> list[Task]:
    """Tasks from Task objects or plain dicts; a bad row raises SchemaError naming its index."""
    out: list[Task] = []
    for i, row in enumerate(tasks):
        if isinstance(row, Task):
            out.append(row)
            continue
        try:
            out.append(convert(row, Task))
        except Exception as exc:
            raise type(exc)(f"task #{i}: {exc}") from None
    return out


class RolloutEngine:
    """Runs ``flow`` on tasks, ``n`` rollouts each, at most ``config.concurrency`` at a time.

    Give ``gateway_url`` to attach to a running gateway, or ``upstreams`` (OpenAI-compatible base
    URLs) / ``gateway_config`` to have the engine start its own on loopback. Use as an async
    context manager, or call ``start()`` / ``close()``.

    A gateway the engine starts has an admin key (``gateway_config.admin_key``, else
    ``admin_key``, else a fresh random one) that only the engine holds: a flow gets its session's
    URL and token, never the key, so it cannot list sessions, read another session's traces or
    set the weight version.
    """

    def __init__(
        self,
        flow: Any,
        evaluator: Any = None,
        config: RolloutConfig | None = None,
        *,
        gateway_url: str | None = None,
        admin_key: str | None = None,
        upstreams: list[str] | None = None,
        gateway_config: Any = None,
        sandboxes: SandboxProvider | None = None,
        early_workers: EarlyFlowProcesses | None = None,
    ) -> None:
        if gateway_url is None and not upstreams and gateway_config is None:
            raise InputError(
                "RolloutEngine needs gateway_url (attach), upstreams or gateway_config (own gateway)"
            )
        if gateway_url is not None and (upstreams or gateway_config is not None):
            raise InputError(
                "give either gateway_url (attach) or upstreams/gateway_config (own gateway), not both"
            )
        self._flow_arg, self._evaluator_arg = flow, evaluator  # what worker processes rebuild from
        # Flow processes started before this engine (rllm.engine.rollout.early_flow_processes): its
        # worker pool adopts them; close() ends any left.
        self._early_workers = early_workers
        self.config = config or RolloutConfig()
        # rollout.executor: where flows run, and the flow object that runs a rollout here (the
        # cookbook's, or one the executor brings: a remote one).
        self._where = executor_for(self.config)
        self._executor_flow = None if self._where.flow is None else self._where.flow(self.config, flow)
        self.flow: RolloutFlow = as_flow(flow if self._executor_flow is None else self._executor_flow)
        self.evaluator: EvaluatorFn | None = None if evaluator is None else as_evaluator(evaluator)
        self._gateway_url = gateway_url
        self._upstreams = list(upstreams or [])
        if gateway_url is None:  # our own gateway (one per worker process): keyed, always
            gateway_config = owned_gateway_config(gateway_config, self._upstreams, admin_key)
            admin_key = gateway_config.admin_key
        self._admin_key = admin_key
        self._gateway_config = gateway_config
        self._server: GatewayServer | None = None
        self._client: GatewayAdmin | None = None
        self._unserve: Callable[[], None] | None = None  # ends the in-process path to our gateway
        self._gc_restore: tuple[int, int, int] | None = None
        self._pool: WorkerPool | None = None
        self.last_stats: dict[str, float] = {}
        # Per-rollout sandboxes for flows marked @needs_sandbox (built on first need if not given).
        self._sandboxes = sandboxes
        # Rollouts run in this process (with no worker pool): attempts, retries, scoring.
        self._runner = RolloutRunner(
            self.config,
            self.flow,
            self.evaluator,
            admin=lambda: self.client,
            sandboxes=lambda: self.sandboxes,
        )

    # ------------------------------------------------------------------ lifecycle
    @property
    def gateway_url(self) -> str:
        if self._gateway_url is None:
            raise StateError("the engine's gateway is not started; call `await engine.start()` first")
        return self._gateway_url

    @property
    def client(self) -> GatewayAdmin:
        """The gateway admin client (sessions, weight version, pause/resume, workers): a
        GatewayClient over HTTP when attached, the server's in-process LocalGatewayClient when the
        engine owns it, a GatewayGroup over every worker process's own gateway."""
        if self._client is None:
            raise StateError("the engine is not started; call `await engine.start()` first")
        return self._client

    async def start(self) -> RolloutEngine:
        if self._client is not None:
            return self
        # The parent of worker processes too: it decodes every Episode they send back.
        self._gc_restore = raise_gc_threshold(self.config.gc_gen0_threshold)
        try:
            if not self._where.in_process:
                return await self._start_workers()
            return await self._start_here()
        except BaseException:
            restore_gc_threshold(self._gc_restore)
            self._gc_restore = None
            raise

    async def _start_here(self) -> RolloutEngine:
        from rllm.gateway import GatewayClient

        if self._executor_flow is not None:  # first: a run whose agents are unreachable stops here
            await self._executor_flow.start()
        if self._gateway_url is None:
            from rllm.gateway import GatewayServer, inprocess
            from rllm.sdk.clients import serve_in_process

            self._server = GatewayServer(self._gateway_config)
            await self._server.start()
            self._gateway_url = self._server.url
            # Same process, same event loop: admin calls need no HTTP round trip to ourselves,
            # and neither do the flows' LLM calls (same routes, checks and traces, no socket).
            self._client = self._server.local_client()
            # A call held at the door (a weight sync; the train step a prefetched rollout waits
            # for) is the trainer's time, not the flow's: its deadline waits too.
            self._server.ledger.hold_listeners.append(self._runner.deadlines.hold)
            # A call waiting behind others the sampler answers is queued, not stalled: the time
            # it waited does not count against its rollout's deadline (flow_runner.py).
            self._server.ledger.call_listeners.append(self._runner.deadlines.call)
            self._unserve = serve_in_process(
                self._server.url, functools.partial(inprocess.answer, self._server)
            )
        else:
            self._client = GatewayClient(self._gateway_url, admin_key=self._admin_key)
        self._runner.open_threads()
        self._runner.lag.start()
        return self

    async def _start_workers(self) -> RolloutEngine:
        from rllm.gateway import GatewayClient, GatewayGroup

        kwargs = {
            "flow": self._flow_arg,
            "evaluator": self._evaluator_arg,
            "config": msgspec.structs.replace(self.config, workers=1, executor="local", progress=False),
            "gateway_url": self._gateway_url,
            "admin_key": self._admin_key,
            "upstreams": self._upstreams or None,
            "gateway_config": self._gateway_config,
        }
        # Each worker builds a RolloutEngine of its own (the class travels by reference).
        request = PoolRequest(self.config, RolloutEngine, kwargs, self._early_workers)
        self._pool = await start_pool(self._where, request)
        if self._gateway_url is not None:  # attached: every worker uses the same gateway
            self._client = GatewayClient(self._gateway_url, admin_key=self._admin_key)
        else:  # each worker's own gateway, started with our config and so with our admin key
            self._client = GatewayGroup(self._pool.gateway_urls, self._admin_key)
            self._gateway_url = self._pool.gateway_urls[0]
        return self

    async def close(self) -> None:
        self._runner.lag.stop()
        if self._early_workers is not None:
            self._early_workers.close()
        if self._executor_flow is not None:
            self._executor_flow.close()
        if self._sandboxes is not None:
            await self._sandboxes.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
            if self._gateway_config is not None or self._upstreams:
                self._gateway_url = None
        restore_gc_threshold(self._gc_restore)
        self._gc_restore = None
        await self._runner.drain_deletions()
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._unserve is not None:
            self._unserve()
            self._unserve = None
        if self._server is not None:
            await self._server.stop()
            self._server = None
            self._gateway_url = None
        self._runner.close_threads()

    async def __aenter__(self) -> RolloutEngine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def sandboxes(self) -> SandboxProvider:
        if self._sandboxes is None:
            backend = make_backend(self.config.sandbox_backend)
            self._sandboxes = SandboxProvider(
                backend,
                warm=self.config.sandbox_warm,
                allow_task_network=self.config.sandbox_allow_task_network,
            )
        return self._sandboxes

    # ------------------------------------------------------------------ batch API
    async def run(
        self,
        tasks: Iterable[Task | dict[str, Any]],
        n: int | None = None,
        is_validation: bool = False,
        *,
        slots: asyncio.Semaphore | None = None,
        sampling: SamplingParams | None = None,
        drawings: Sequence[int] | None = None,
    ) -> list[Episode]:
        """All episodes, ordered by task then ``rollout_index`` (0..n-1).

        ``slots``: a limit shared with other ``run`` calls, taken by each rollout while it runs
        (the asynchronous trainer runs one call per group and shares ``concurrency`` this way).
        ``sampling``: these rollouts' sampling instead of the configured one (a training step's
        own seed; ``drawings``: each task's drawing number in its step, ``drawings_sampling``); it
        travels with each rollout, so calls with different ones may overlap."""
        task_list = as_tasks(tasks)
        by_task: dict[int, list[Episode]] = {}
        async for index, episodes in self.stream_indexed(
            task_list, n=n, is_validation=is_validation, slots=slots, sampling=sampling, drawings=drawings
        ):
            by_task[index] = episodes
        return [ep for i in range(len(task_list)) for ep in by_task[i]]

    async def stream(
        self, tasks: Iterable[Task | dict[str, Any]], n: int | None = None, is_validation: bool = False
    ) -> AsyncIterator[list[Episode]]:
        """Yield each task's ``n`` episodes as soon as all of them are finished."""
        async for _, episodes in self.stream_indexed(as_tasks(tasks), n=n, is_validation=is_validation):
            yield episodes

    async def stream_indexed(
        self,
        tasks: list[Task],
        n: int | None = None,
        is_validation: bool = False,
        *,
        slots: asyncio.Semaphore | None = None,
        sampling: SamplingParams | None = None,
        drawings: Sequence[int] | None = None,
    ) -> AsyncIterator[tuple[int, list[Episode]]]:
        """:meth:`stream` with each group's position in ``tasks`` (other arguments: :meth:`run`)."""
        await self.start()
        n = self.config.n if n is None else n
        if n < 1:
            raise InputError(f"n (rollouts per task) must be >= 1, got {n}")
        if not tasks:
            return
        if self._pool is None and declares_sandbox(self.flow):
            self.sandboxes.schedule(self.flow, (task for task in tasks for _ in range(n)))
        progress = RolloutProgress(
            len(tasks) * n, "validation" if is_validation else "rollouts", enabled=self.config.progress
        )
        # With worker processes, each enforces its share of the concurrency and queues a few
        # jobs more (see WorkerSlots): keep that many in flight from here.
        width = self._pool.capacity if self._pool is not None else self.config.concurrency
        chosen = drawings_sampling(tasks, sampling, self.config.sampling_for(is_validation), drawings)
        groups = stream_groups(
            lambda ti, ri: self.run_one(tasks[ti], ri, is_validation=is_validation, sampling=chosen[ti]),
            tasks,
            n,
            width=width,
            slots=slots,
            progress=progress,
        )
        try:
            async with contextlib.aclosing(groups):  # its rollouts cancelled when we stop early
                async for group in groups:
                    yield group
        finally:
            await self._runner.drain_deletions()
            progress.close()
            self.last_stats = progress.summary()

    # ------------------------------------------------------------------ one rollout
    async def run_one(
        self,
        task: Task,
        rollout_index: int = 0,
        is_validation: bool = False,
        *,
        model: str | None = None,
        sampling: SamplingParams | None = None,
    ) -> Episode:
        """One rollout with retries and scoring. Never raises (except on cancellation).

        ``model`` (default ``config.model``) is the name the flow is given for this rollout;
        ``sampling`` (default the configured one) its sampling."""
        model = self.config.model if model is None else model
        if self._pool is not None:
            return await run_on_pool(
                self._pool, task, rollout_index, is_validation, model, self.config.max_retries, sampling
            )
        return await self._runner.run(task, rollout_index, is_validation, model, sampling)

    def prepare_sandboxes(self, tasks: Iterable[Task]) -> None:
        """Start preparing the sandboxes of rollouts about to run here (a flow worker calls this as
        each job arrives, so sandboxes are warm by the time the job gets a slot)."""
        if declares_sandbox(self.flow):
            # A task refused for network consent is refused by its rollout's own lease.
            with contextlib.suppress(ConfigError):
                self.sandboxes.schedule(self.flow, tasks)
