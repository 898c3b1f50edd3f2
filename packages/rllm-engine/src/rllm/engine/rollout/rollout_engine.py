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
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import msgspec

from rllm.engine.rollout.episode_builder import build_episode, failed_episode
from rllm.engine.rollout.eval_dispatch import EvalDispatch
from rllm.engine.rollout.executors import (
    IN_PROCESS_EXECUTORS,
    WorkerPool,
    close_executor,
    executor_flow,
    resolve_executor,
    start_executor,
    start_pool,
)
from rllm.engine.rollout.failures import RETRYABLE, classify_exception, sandbox_start_failure
from rllm.engine.rollout.flow_processes import FlowProcessDied
from rllm.engine.rollout.flow_runner import DeadlineClock, DeadlineExceeded, call_with_deadline
from rllm.engine.rollout.loop_lag import LoopLagMonitor
from rllm.engine.rollout.own_gateway import owned_gateway_config
from rllm.engine.rollout.rollout_config import RolloutConfig, rollout_sampling
from rllm.engine.rollout.rollout_progress import RolloutProgress
from rllm.engine.rollout.scoring import apply_eval_output, score_episode
from rllm.engine.sandbox.provider import SandboxProvider, make_backend
from rllm.runtime.gc_threshold import raise_gc_threshold, restore_gc_threshold
from rllm.sdk.evaluator import EvaluatorFn, as_evaluator
from rllm.sdk.flow import RolloutFlow, as_flow
from rllm.sdk.sandbox import declares_sandbox
from rllm.types import (
    AgentConfig,
    Episode,
    ErrorInfo,
    EvalOutput,
    Task,
    TerminationReason,
    TraceRecord,
    agent_view,
    convert,
)
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
        # rollout.executor: the flow object that runs a rollout (the cookbook's, or a remote one).
        self.flow: RolloutFlow = as_flow(executor_flow(self.config, flow))
        self.evaluator: EvaluatorFn | None = None if evaluator is None else as_evaluator(evaluator)
        # Sync evaluators: in a thread pool until proven cheap, then inline (eval_dispatch.py).
        self._eval_dispatch = None if self.evaluator is None else EvalDispatch(self.evaluator)
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
        self._executor: ThreadPoolExecutor | None = None
        self._deletions: set[asyncio.Task[None]] = set()
        self._gc_restore: tuple[int, int, int] | None = None
        self._pool: WorkerPool | None = None
        self._running = 0  # rollouts in progress in this process
        # The loop the flows run on (each worker process has its own), while they run.
        self._lag = LoopLagMonitor(busy=lambda: self._running > 0)
        # Rollout deadlines stand still while our own gateway holds calls at the door.
        self._deadlines = DeadlineClock()
        self.last_stats: dict[str, float] = {}
        # Per-rollout sandboxes for flows marked @needs_sandbox (built on first need if not given).
        self._sandboxes = sandboxes

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
            if resolve_executor(self.config.executor, self.config.workers) not in IN_PROCESS_EXECUTORS:
                return await self._start_workers()
            return await self._start_here()
        except BaseException:
            restore_gc_threshold(self._gc_restore)
            self._gc_restore = None
            raise

    async def _start_here(self) -> RolloutEngine:
        from rllm.gateway import GatewayClient

        await start_executor(self.flow)  # first: a run whose agents are unreachable stops here
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
            self._server.ledger.hold_listeners.append(self._deadlines.hold)
            self._unserve = serve_in_process(
                self._server.url, functools.partial(inprocess.answer, self._server)
            )
        else:
            self._client = GatewayClient(self._gateway_url, admin_key=self._admin_key)
        if not self.flow.is_async:
            workers = self.config.flow_threads or self.config.concurrency
            self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rllm-flow")
        self._lag.start()
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
        self._pool = await start_pool(self.config, kwargs, self._early_workers)
        assert self._pool is not None  # start() comes here only for a non-local executor
        if self._gateway_url is not None:  # attached: every worker uses the same gateway
            self._client = GatewayClient(self._gateway_url, admin_key=self._admin_key)
        else:  # each worker's own gateway, started with our config and so with our admin key
            self._client = GatewayGroup(self._pool.gateway_urls, self._admin_key)
            self._gateway_url = self._pool.gateway_urls[0]
        return self

    async def close(self) -> None:
        self._lag.stop()
        if self._early_workers is not None:
            self._early_workers.close()
        close_executor(self.flow)
        if self._sandboxes is not None:
            await self._sandboxes.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
            if self._gateway_config is not None or self._upstreams:
                self._gateway_url = None
        restore_gc_threshold(self._gc_restore)
        self._gc_restore = None
        await self._drain_deletions()
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
        if self._executor is not None:
            # Do not wait: a sync flow past its deadline may still hold a thread.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

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
    ) -> list[Episode]:
        """All episodes, ordered by task then ``rollout_index`` (0..n-1).

        ``slots``: a limit shared with other ``run`` calls, taken by each rollout while it runs
        (the asynchronous trainer runs one call per group and shares ``concurrency`` this way)."""
        task_list = as_tasks(tasks)
        by_task: dict[int, list[Episode]] = {}
        async for index, episodes in self.stream_indexed(
            task_list, n=n, is_validation=is_validation, slots=slots
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
    ) -> AsyncIterator[tuple[int, list[Episode]]]:
        """Like :meth:`stream`, with each group's position in ``tasks`` (``slots``: see :meth:`run`)."""
        await self.start()
        n = self.config.n if n is None else n
        if n < 1:
            raise InputError(f"n (rollouts per task) must be >= 1, got {n}")
        total = len(tasks) * n
        if total == 0:
            return
        # Task-major order, so early tasks complete early (streamed eval results, resumability).
        pending: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
        for ti in range(len(tasks)):
            for ri in range(n):
                pending.put_nowait((ti, ri))
        if self._pool is None and declares_sandbox(self.flow):
            self.sandboxes.schedule(self.flow, (tasks[ti] for ti in range(len(tasks)) for _ in range(n)))
        results: list[list[Episode | None]] = [[None] * n for _ in tasks]
        remaining = [n] * len(tasks)
        finished: asyncio.Queue[int] = asyncio.Queue()
        progress = RolloutProgress(
            total, "validation" if is_validation else "rollouts", enabled=self.config.progress
        )

        async def worker() -> None:
            while True:
                try:
                    ti, ri = pending.get_nowait()
                except asyncio.QueueEmpty:
                    return
                if slots is None:
                    episode = await self.run_one(tasks[ti], ri, is_validation=is_validation)
                else:
                    async with slots:
                        episode = await self.run_one(tasks[ti], ri, is_validation=is_validation)
                results[ti][ri] = episode
                progress.update(episode)
                remaining[ti] -= 1
                if remaining[ti] == 0:
                    finished.put_nowait(ti)

        # With worker processes, each enforces its share of the concurrency and queues a few
        # jobs more (see FlowProcessPool): keep that many in flight from here.
        width = self._pool.capacity if self._pool is not None else self.config.concurrency
        workers = [asyncio.create_task(worker()) for _ in range(min(width, total))]
        try:
            for _ in range(len(tasks)):
                ti = await finished.get()
                yield ti, [ep for ep in results[ti] if ep is not None]
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            await self._drain_deletions()
            progress.close()
            self.last_stats = progress.summary()

    # ------------------------------------------------------------------ one rollout
    async def run_one(
        self, task: Task, rollout_index: int = 0, is_validation: bool = False, *, model: str | None = None
    ) -> Episode:
        """One rollout with retries and scoring. Never raises (except on cancellation).

        ``model`` (default ``config.model``) is the name the flow is given for this rollout."""
        model = self.config.model if model is None else model
        if self._pool is not None:
            return await self._run_on_worker(task, rollout_index, is_validation, model)
        self._running += 1
        try:
            return await self._run_here(task, rollout_index, is_validation, model)
        finally:
            self._running -= 1

    async def _run_here(self, task: Task, rollout_index: int, is_validation: bool, model: str) -> Episode:
        started = time.monotonic()
        retried: list[dict[str, Any]] = []
        attempt = 0
        while True:
            try:
                # Scored within the attempt: a verifier may use the rollout's sandbox, and one
                # that fails for a host reason makes the attempt an infra error, retried.
                episode = await self._attempt(task, rollout_index, is_validation, attempt, model)
            except Exception as exc:  # an engine/gateway-side bug must not sink the batch
                episode = failed_episode(
                    task.id, rollout_index, TerminationReason.INFRA_ERROR, ErrorInfo.from_exception(exc)
                )
                apply_eval_output(episode, EvalOutput(reward=0.0, is_correct=False))
            if episode.termination_reason not in RETRYABLE or attempt >= self.config.max_retries:
                break
            retried.append({"attempt": attempt, "error": episode.error.message if episode.error else ""})
            attempt += 1
            await asyncio.sleep(self.config.retry_backoff_s * (2 ** (attempt - 1)))
        episode.metrics["attempts"] = float(attempt + 1)
        if retried:
            episode.metadata["retried"] = retried
        episode.metrics["rollout_s"] = time.monotonic() - started
        episode.metrics["loop_lag_s"] = self._lag.check()
        return episode

    async def _run_on_worker(
        self, task: Task, rollout_index: int, is_validation: bool, model: str
    ) -> Episode:
        assert self._pool is not None
        died: FlowProcessDied | None = None
        for lost in range(self.config.max_retries + 1):
            try:
                episode = await self._pool.run_one(task, rollout_index, is_validation, model)
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
        episode.metrics["worker_lost"] = float(self.config.max_retries + 1)
        return episode

    async def _attempt(
        self, task: Task, rollout_index: int, is_validation: bool, attempt: int, model: str
    ) -> Episode:
        sampling = rollout_sampling(self.config.sampling_for(is_validation), task.id, rollout_index)
        meta = {"task_id": task.id, "rollout_index": rollout_index, "attempt": attempt}
        try:
            session = await self.client.create_session(sampling=sampling, metadata=meta)
        except Exception as exc:
            failed = failed_episode(
                task.id, rollout_index, TerminationReason.INFRA_ERROR, ErrorInfo.from_exception(exc)
            )
            apply_eval_output(failed, EvalOutput(reward=0.0, is_correct=False))
            return failed
        agent_config = AgentConfig(
            base_url=session.base_url,
            model=model,
            session_id=session.session_id,
            api_key=session.token or "EMPTY",
            sampling=sampling,
            is_validation=is_validation,
            metadata={**self.config.metadata, **meta},
        )
        closed: list[bool] = []
        try:
            return await self._run_flow_in_session(task, rollout_index, agent_config, closed)
        finally:
            if not closed and not self.config.keep_sessions:
                # The session was not finished (collecting failed, or cancelled): delete it in the
                # background; the batch waits for all deletions, so no session outlives the batch.
                deletion = asyncio.create_task(self._delete_session(session.session_id))
                self._deletions.add(deletion)
                deletion.add_done_callback(self._deletions.discard)

    async def _collect_traces(self, session_id: str, closed: list[bool]) -> list[TraceRecord]:
        """The session's traces; unless sessions are kept, also deletes it (appending to ``closed``)."""
        if self.config.keep_sessions:
            return await self.client.get_traces(session_id)
        traces = await self.client.finish_session(session_id)
        closed.append(True)
        return traces

    async def _run_flow_in_session(
        self, task: Task, rollout_index: int, config: AgentConfig, closed: list[bool]
    ) -> Episode:
        """The flow's scored Episode. A flow that declares a sandbox runs in one leased for this
        rollout, and its evaluator runs in the same sandbox after it (``current_sandbox()``: a
        verifier copies the hidden tests in only then). A sandbox that does not start is never the
        agent's doing: the attempt is an infra error (retried), unless the run itself is
        misconfigured (e.g. a task asking for network without the operator's consent)."""
        if not declares_sandbox(self.flow):  # no lease (an async context manager's machinery per rollout)
            episode = await self._flow_episode(task, rollout_index, config, closed)
            await self._score(task, episode)
            return episode
        sandbox_metrics: dict[str, float] = {}
        async with contextlib.AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(self.sandboxes.lease(self.flow, task, sandbox_metrics))
            except Exception as exc:
                episode = await self._flow_episode(task, rollout_index, config, closed, not_started=exc)
            else:
                episode = await self._flow_episode(task, rollout_index, config, closed)
            await self._score(task, episode)
        episode.metrics.update(sandbox_metrics)
        return episode

    async def _flow_episode(
        self,
        task: Task,
        rollout_index: int,
        config: AgentConfig,
        closed: list[bool],
        not_started: Exception | None = None,
    ) -> Episode:
        """Run the flow on the agent's view of ``task`` (not when its sandbox failed to start:
        ``not_started``), collect the session's traces and build the (unscored) Episode."""
        result: Any = None
        reason = TerminationReason.DONE
        error: ErrorInfo | None = None
        failure_metadata: Any = None
        if not_started is not None:
            reason, error = sandbox_start_failure(not_started), ErrorInfo.from_exception(not_started)
        else:
            try:
                result = await self._call_flow(task, config)
            except DeadlineExceeded as exc:
                reason, error = TerminationReason.TIMEOUT, ErrorInfo(type="Timeout", message=f"rollout {exc}")
            except Exception as exc:
                reason, error = classify_exception(exc), ErrorInfo.from_exception(exc)
                failure_metadata = getattr(exc, "episode_metadata", None)  # e.g. a command's exit, tails

        try:
            traces = await self._collect_traces(config.session_id, closed)
        except Exception as exc:
            return failed_episode(
                task.id, rollout_index, TerminationReason.INFRA_ERROR, ErrorInfo.from_exception(exc)
            )

        if reason == TerminationReason.AGENT_ERROR and _last_call_failed(traces):
            # The flow crashed right after the gateway reported an upstream failure: not its fault.
            reason = TerminationReason.INFRA_ERROR
        if reason != TerminationReason.DONE:
            failed = failed_episode(task.id, rollout_index, reason, error, traces)
            if isinstance(failure_metadata, dict):
                failed.metadata.update(failure_metadata)
            return failed
        try:
            return build_episode(task.id, rollout_index, result, traces)
        except Exception as exc:
            return failed_episode(
                task.id, rollout_index, TerminationReason.AGENT_ERROR, ErrorInfo.from_exception(exc), traces
            )

    def _call_flow(self, task: Task, config: AgentConfig) -> Coroutine[Any, Any, Any]:
        """The flow's run on the agent's view of ``task`` (never its ground truth or grader-only
        metadata: ``rllm.types.agent_view``), under the engine's deadline (a coroutine: no frame
        of its own). Every executor's rollouts pass here (flow processes and Ray workers run an
        engine of their own; the remote executor's flow is a RemoteFlow)."""
        return call_with_deadline(
            self.flow.run,
            (agent_view(task), config),
            is_async=self.flow.is_async,
            deadline_s=self.config.deadline_s,
            executor=self._executor,
            clock=self._deadlines,
        )

    def prepare_sandboxes(self, tasks: Iterable[Task]) -> None:
        """Start preparing the sandboxes of rollouts about to run here (a flow worker calls this as
        each job arrives, so sandboxes are warm by the time the job gets a slot)."""
        if declares_sandbox(self.flow):
            # A task refused for network consent is refused by its rollout's own lease.
            with contextlib.suppress(ConfigError):
                self.sandboxes.schedule(self.flow, tasks)

    async def _drain_deletions(self) -> None:
        while self._deletions:
            await asyncio.gather(*list(self._deletions), return_exceptions=True)

    async def _delete_session(self, session_id: str) -> None:
        try:
            await self.client.delete_session(session_id)
        except Exception:  # best effort: the gateway may be gone; nothing left to release then
            pass

    async def _score(self, task: Task, episode: Episode) -> None:
        await score_episode(task, episode, self.evaluator, self.config.eval_timeout_s, self._eval_dispatch)


def _last_call_failed(traces: list[TraceRecord]) -> bool:
    return bool(traces) and max(traces, key=lambda t: t.seq).status == "error"
