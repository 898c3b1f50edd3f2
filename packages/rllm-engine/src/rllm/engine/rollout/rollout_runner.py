"""One rollout in this process, from gateway session to scored Episode (the RolloutEngine's
in-process part; a worker pool's workers each run one too, in their own engine).

Each attempt gets a fresh gateway session; the flow runs on the agent's view of its task
(``rllm.types.agent_view``) under the deadline, in the rollout's sandbox when the flow declares
one; the session is finished (its traces taken and the session deleted, one admin call); the
Episode is built from the traces and scored by the evaluator, which gets the full task, in the
same sandbox. An attempt that failed for the infrastructure's sake is retried on a fresh session
after a backoff, its traces discarded with its session. Never raises (but on cancellation):
every rollout ends as an Episode whose ``termination_reason`` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from rllm.engine.rollout.episode_builder import build_episode, failed_episode
from rllm.engine.rollout.eval_dispatch import EvalDispatch
from rllm.engine.rollout.failures import RETRYABLE, classify_exception, sandbox_start_failure
from rllm.engine.rollout.flow_runner import DeadlineClock, DeadlineExceeded, call_with_deadline
from rllm.engine.rollout.loop_lag import LoopLagMonitor
from rllm.engine.rollout.rollout_config import RolloutConfig, rollout_sampling
from rllm.engine.rollout.scoring import apply_eval_output, score_episode
from rllm.sdk.evaluator import EvaluatorFn
from rllm.sdk.flow import RolloutFlow
from rllm.sdk.sandbox import declares_sandbox
from rllm.types import (
    AgentConfig,
    Episode,
    ErrorInfo,
    EvalOutput,
    SamplingParams,
    Task,
    TerminationReason,
    TraceRecord,
    agent_view,
)

if TYPE_CHECKING:
    from rllm.engine.sandbox.provider import SandboxProvider
    from rllm.gateway import GatewayAdmin


class RolloutRunner:
    """Runs single rollouts of ``flow`` (scored by ``evaluator``) in this process.

    ``admin`` and ``sandboxes`` give the engine's gateway admin client and sandbox provider when
    a rollout needs them (the engine makes them when it starts, or on first need). ``threads``
    runs sync flows (the engine opens it, :meth:`open_threads`); ``deadlines`` stands still while
    the engine's own gateway holds calls at its door; ``lag`` watches the loop the flows run on
    while any rollout runs here."""

    def __init__(
        self,
        config: RolloutConfig,
        flow: RolloutFlow,
        evaluator: EvaluatorFn | None,
        *,
        admin: Callable[[], GatewayAdmin],
        sandboxes: Callable[[], SandboxProvider],
    ) -> None:
        self.config = config
        self.flow = flow
        self.evaluator = evaluator
        # Sync evaluators: in a thread pool until proven cheap, then inline (eval_dispatch.py).
        self._eval_dispatch = None if evaluator is None else EvalDispatch(evaluator)
        self._admin = admin
        self._sandboxes = sandboxes
        self.threads: ThreadPoolExecutor | None = None
        self.deadlines = DeadlineClock()
        self.running = 0  # rollouts in progress in this process
        self.lag = LoopLagMonitor(busy=lambda: self.running > 0)
        self._deletions: set[asyncio.Task[None]] = set()

    def open_threads(self) -> None:
        """The thread pool sync flows run in (``flow_threads``, default ``concurrency``)."""
        if not self.flow.is_async and self.threads is None:
            workers = self.config.flow_threads or self.config.concurrency
            self.threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rllm-flow")

    def close_threads(self) -> None:
        if self.threads is not None:
            # Do not wait: a sync flow past its deadline may still hold a thread.
            self.threads.shutdown(wait=False, cancel_futures=True)
            self.threads = None

    async def run(
        self,
        task: Task,
        rollout_index: int,
        is_validation: bool,
        model: str,
        sampling: SamplingParams | None = None,
    ) -> Episode:
        """One rollout with retries and scoring."""
        self.running += 1
        try:
            return await self._run(task, rollout_index, is_validation, model, sampling)
        finally:
            self.running -= 1

    async def _run(
        self, task: Task, rollout_index: int, is_validation: bool, model: str, sampling: SamplingParams | None
    ) -> Episode:
        started = time.monotonic()
        retried: list[dict[str, Any]] = []
        attempt = 0
        while True:
            try:
                # Scored within the attempt: a verifier may use the rollout's sandbox, and one
                # that fails for a host reason makes the attempt an infra error, retried.
                episode = await self._attempt(task, rollout_index, is_validation, attempt, model, sampling)
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
        episode.metrics["loop_lag_s"] = self.lag.check()
        return episode

    async def _attempt(
        self,
        task: Task,
        rollout_index: int,
        is_validation: bool,
        attempt: int,
        model: str,
        chosen: SamplingParams | None = None,
    ) -> Episode:
        base = chosen if chosen is not None else self.config.sampling_for(is_validation)
        sampling = rollout_sampling(base, task.id, rollout_index)
        meta = {"task_id": task.id, "rollout_index": rollout_index, "attempt": attempt}
        try:
            session = await self._admin().create_session(sampling=sampling, metadata=meta)
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
            return await self._admin().get_traces(session_id)
        traces = await self._admin().finish_session(session_id)
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
                await stack.enter_async_context(self._sandboxes().lease(self.flow, task, sandbox_metrics))
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
            executor=self.threads,
            clock=self.deadlines,
            session_id=config.session_id,
        )

    async def drain_deletions(self) -> None:
        """Wait for the sessions being deleted in the background."""
        while self._deletions:
            await asyncio.gather(*list(self._deletions), return_exceptions=True)

    async def _delete_session(self, session_id: str) -> None:
        try:
            await self._admin().delete_session(session_id)
        except Exception:  # best effort: the gateway may be gone; nothing left to release then
            pass

    async def _score(self, task: Task, episode: Episode) -> None:
        await score_episode(task, episode, self.evaluator, self.config.eval_timeout_s, self._eval_dispatch)


def _last_call_failed(traces: list[TraceRecord]) -> bool:
    return bool(traces) and max(traces, key=lambda t: t.seq).status == "error"
