"""A proxied call from acceptance to its one trace, and admission (pause / resume).

The promise of the gateway (README: "one honest trace per accepted call") is kept here: every
call that got past routing, auth and validation is opened here (its trace takes the session's
next ``seq`` and the current weight version, and the call counts as in flight) and finished
here exactly once, as ``ok``, ``error`` or ``abort``. A finished trace is stored only while its
session is still open: a session finished or deleted while the call was in flight has nobody
left to read it. Pausing stops admitting calls and waits until the ones in flight have ended,
or, for partial rollouts (``GatewayConfig.partial_rollouts``), aborts them: an aborted call keeps
its tokens, parks (``park``) until the gateway resumes and is then continued (``partial``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from rllm.gateway.capture import Captured, ClientWants, apply_sampling
from rllm.gateway.errors import GatewayError
from rllm.gateway.sessions import Session
from rllm.gateway.traces import fill_trace, start_trace
from rllm.runtime.http_messages import Request
from rllm.types import Message, SamplingParams, TraceRecord

if TYPE_CHECKING:
    from rllm.gateway.metrics import GatewayMetrics
    from rllm.gateway.store import TraceStore


class ParsedCall(NamedTuple):
    """A proxy call's request, decoded and validated: nothing sent, no trace yet."""

    session: Session
    role: str
    body: dict[str, Any]
    messages: list[Message]
    policy: str | None = None  # the policy that answers it (rllm.gateway.policy_routes)


@dataclass(slots=True)
class ProxyCall:
    """One proxied call once its trace is open: what forwarding it and answering it need."""

    request: Request
    session: Session
    path: str  # on the upstream
    body: dict[str, Any]  # as sent upstream (sampling applied, capture fields injected)
    wants: ClientWants
    trace: TraceRecord
    t0: float
    chat: bool
    bridge: Any  # the cumulative token bridge's plan, or None


class CallLedger:
    """The calls of one gateway: opened, in flight, finished; and whether new ones are admitted."""

    __slots__ = (
        "_admit",
        "_drained",
        "_held",
        "call_listeners",
        "default_sampling",
        "hold_listeners",
        "inflight",
        "metrics",
        "parked",
        "sessions",
        "store",
        "store_raw",
        "waiting",
        "weight_version",
    )

    def __init__(
        self,
        *,
        sessions: dict[str, Session],
        store: TraceStore,
        metrics: GatewayMetrics,
        store_raw: bool,
        default_sampling: SamplingParams | None,
    ) -> None:
        self.sessions = sessions
        self.store = store
        self.metrics = metrics
        self.store_raw = store_raw
        self.default_sampling = default_sampling
        self.weight_version = 0  # stamped on every trace opened from now on
        self.inflight = 0
        self.waiting = 0  # calls held at the door while paused
        self.parked = 0  # aborted calls in flight, holding their tokens until the gateway resumes
        self._admit = asyncio.Event()  # set by admit_all() when the gateway starts
        self._drained: asyncio.Event | None = None
        # Told True once a pause has taken hold (nothing running, calls wait at the door) and False
        # when the gateway resumes: an engine in this process stops its rollouts' deadlines
        # meanwhile, since that wait is the trainer's (rllm.engine.rollout.flow_runner.DeadlineClock).
        self.hold_listeners: list[Callable[[bool], None]] = []
        # Told (session_id, None) when a call's trace opens and (session_id, status) when it is
        # finished: an engine in this process counts a rollout's deadline only while it is stalled,
        # not while its call waits behind others that the sampler is answering (DeadlineClock.call).
        self.call_listeners: list[Callable[[str, str | None], None]] = []
        self._held = False

    # ------------------------------------------------------------------ admission
    def admit_all(self) -> None:
        """Admit every call (a fresh start: nothing paused)."""
        self._admit = asyncio.Event()
        self._admit.set()
        self._set_held(False)

    @property
    def admitting(self) -> bool:
        return self._admit.is_set()

    async def wait_admitted(self, parsed: ParsedCall) -> None:
        """Hold a call at the door until the gateway resumes; 410 if its session ended meanwhile."""
        if self._admit.is_set():
            return
        self.waiting += 1
        try:
            await self._admit.wait()
        finally:
            self.waiting -= 1
        sid = parsed.session.session_id
        if self.sessions.get(sid) is not parsed.session:
            raise GatewayError(
                410,
                f"session {sid!r} ended while the call waited for the gateway to resume",
                param="session_id",
                code="session_ended",
            )

    async def pause(
        self, timeout_s: float = 600.0, abort: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Stop admitting calls (they wait) and return once none is running: each in-flight call
        has finished, or, with ``abort`` (which tells the upstreams to end their calls now), has
        parked with its tokens so far. A pause that fails re-admits calls and raises."""
        self._admit.clear()
        if self.inflight - self.parked:
            self._drained = asyncio.Event()
            try:
                deadline = time.monotonic() + timeout_s
                if abort is not None:
                    await asyncio.wait_for(abort(), timeout_s)
                await asyncio.wait_for(self._drained.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                self._admit.set()  # a failed pause must not leave the gateway paused
                raise GatewayError(
                    504,
                    f"{self.inflight - self.parked} requests still in flight after {timeout_s}s; not paused",
                ) from None
            except BaseException:
                self._admit.set()
                raise
            finally:
                self._drained = None
        self._set_held(True)

    async def park(self) -> None:
        """An aborted call waits here, holding its tokens, until the gateway admits calls again;
        it no longer counts as running, so the pause that aborted it can end."""
        self.parked += 1
        self._check_drained()
        try:
            await self._admit.wait()
        finally:
            self.parked -= 1

    def _check_drained(self) -> None:
        if self.inflight == self.parked and self._drained is not None:
            self._drained.set()

    def resume(self) -> None:
        self._admit.set()
        self._set_held(False)

    def _set_held(self, held: bool) -> None:
        if held == self._held:
            return
        self._held = held
        for listener in self.hold_listeners:
            listener(held)

    # ------------------------------------------------------------------ one call's trace
    def open_trace(self, parsed: ParsedCall, chat: bool) -> TraceRecord:
        """Apply the session's sampling and start the call's trace; the call is in flight until
        ``call_ended``."""
        session, role, body, messages = parsed.session, parsed.role, parsed.body, parsed.messages
        apply_sampling(body, session.sampling or self.default_sampling, call_index=session.next_seq)
        trace = start_trace(
            session,
            role,
            body,
            messages,
            chat=chat,
            weight_version=self.weight_version,
            store_raw=self.store_raw,
            policy=parsed.policy,
        )
        self.inflight += 1
        self._tell(trace.session_id, None)
        return trace

    def _tell(self, session_id: str, status: str | None) -> None:
        for listener in self.call_listeners:
            listener(session_id, status)

    def call_ended(self) -> None:
        self.inflight -= 1
        self._check_drained()

    def finish_trace(self, trace: TraceRecord, cap: Captured | None, status: str, t0: float) -> None:
        """Finish the trace (latency, status, what was captured) and keep it if its session is open."""
        trace.latency_s = time.perf_counter() - t0
        trace.status = status  # type: ignore[assignment]
        if cap is not None:
            fill_trace(trace, cap)
        if trace.session_id in self.sessions:
            self.store.put(trace)
        # else the session was deleted (finished) while this call was in flight: nobody can read
        # the trace any more, and storing it would leak it.
        self.metrics.observe(trace)
        self._tell(trace.session_id, status)

    def fail(self, trace: TraceRecord, t0: float, why: str) -> None:
        """Finish the trace as an ``error`` saying why."""
        trace.metadata["error"] = why
        self.finish_trace(trace, None, "error", t0)

    def fail_unfinished(self, trace: TraceRecord, t0: float, exc: BaseException) -> None:
        """Record ``trace`` as an error unless it was already finished (``latency_s`` is set
        only by finish_trace): the last line of defence keeps the one-trace-per-call rule."""
        if trace.latency_s == 0.0:
            self.fail(trace, t0, f"internal gateway error: {type(exc).__name__}: {exc}")

    def refuse_if_session_ended(self, call: ProxyCall, what: str) -> None:
        """A 410 when the call's session was finished or deleted meanwhile (a flow past its
        deadline): nobody can read a trace any more, so none is kept, and the agent is told so
        rather than handed an answer that counts for nothing."""
        sid = call.session.session_id
        if self.sessions.get(sid) is not call.session:
            self.discard(call.trace, call.t0)
            raise GatewayError(
                410, f"session {sid!r} ended while this call {what}", param="session_id", code="session_ended"
            )

    def discard(self, trace: TraceRecord, t0: float) -> None:
        """Count a call whose session ended while it was in flight; its trace is not kept."""
        trace.status = "error"
        trace.latency_s = time.perf_counter() - t0
        self.metrics.observe(trace)
        self._tell(trace.session_id, "error")


__all__ = ["CallLedger", "ParsedCall", "ProxyCall"]
