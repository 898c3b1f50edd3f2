"""The remote executor (``rollout.executor = "remote"``): rollouts run by agent services.

The engine keeps everything it does for a local flow (a gateway session per attempt, the
deadline, retries of infrastructure errors on a fresh session, episodes from the traces, the
evaluator); only the flow is replaced by :class:`RemoteFlow`, which hands the rollout to one of
``rollout.remote.urls`` over the protocol of :mod:`rllm.engine.rollout.agent_protocol`.

Balancing, by the capacity each service reports (``GET /health``'s ``capacity``, read at start and
at every probe): each attempt goes to the healthy service with a free slot whose load after taking
it, rollouts in flight from this engine divided by its capacity, is lowest (ties: the one used
longest ago), so a service of capacity 6 gets three times the rollouts of one of capacity 2. A
service that reports no capacity has no cap and weighs as the mean of the reported ones (1 when
none reports one: plain least-loaded). When every healthy service is at its capacity the attempt
waits for a slot instead of being sent to bounce off a 503. A service that refuses the connection, drops it, answers
a 5xx (but 503, busy) or answers garbage is marked down and the attempt fails as ``infra_error``, so the engine's
retry lands on another service; a down service is probed (``GET /health``) again after
``health_interval_s`` and used again once it answers. :meth:`RemoteFlow.start` checks every
service before any work starts and refuses to start when none answers.

A service is the agent: it gets the agent's view of the task (``rllm.types.agent_view``, never
the ground truth or grader-only metadata) and its answer is held to the protocol. An answer for
another task id, or one that claims a reward (a trajectory's or a step's reward or advantage,
``is_correct``, a ``reward`` metric: rewards come from the trainer's evaluator only), is refused
as not the protocol. Its size is bounded (``max_answer_bytes``) and so is its time once it has
started to arrive (``answer_timeout_s``); the wait for it to start is the rollout itself, bounded
by the engine's deadline (``rollout.deadline_s``). Past either bound the attempt is an
``infra_error`` that names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import msgspec

from rllm.engine.rollout.agent_protocol import (
    Health,
    RemoteAgentError,
    RemoteProtocolError,
    RolloutRequest,
    decode_answer,
    decode_failure,
    to_wire,
)
from rllm.runtime.http_client import FastHttpPool, UpstreamBadResponse, UpstreamTooLarge, UpstreamTooSlow
from rllm.sdk.errors import InfraError
from rllm.sdk.flow import RolloutFlow
from rllm.types import AgentConfig, Episode, Task, agent_view
from rllm.types.errors import ConfigError, InvariantError, StateError


class RemoteSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``rollout.remote``: the agent services (``http://`` base URLs, e.g. ``http://host:8700``), how long a
    connection may take, how soon a service marked down is probed again, the largest answer
    accepted (``max_answer_bytes``, 64 MiB) and how long an answer may take from its first byte
    to its last (``answer_timeout_s``)."""

    urls: list[str] = msgspec.field(default_factory=list)
    connect_timeout_s: float = 5.0
    health_interval_s: float = 5.0
    max_answer_bytes: int = 64 << 20
    answer_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for url in self.urls:
            if not url.startswith("http://"):
                raise InvariantError(
                    f"remote.urls: {url!r} is not an http:// URL (https is not supported yet)", "urls"
                )
        if not self.connect_timeout_s > 0:
            raise InvariantError(
                f"connect_timeout_s must be > 0, got {self.connect_timeout_s}", "connect_timeout_s"
            )
        if not self.health_interval_s > 0:
            raise InvariantError(
                f"health_interval_s must be > 0, got {self.health_interval_s}", "health_interval_s"
            )
        if self.max_answer_bytes < 1024:
            raise InvariantError(
                f"max_answer_bytes must be >= 1024, got {self.max_answer_bytes}", "max_answer_bytes"
            )
        if not self.answer_timeout_s > 0:
            raise InvariantError(
                f"answer_timeout_s must be > 0, got {self.answer_timeout_s}", "answer_timeout_s"
            )


# The pool's own read timeout: a backstop only (see RemoteFlow.pool).
_BACKSTOP_S = 7 * 24 * 3600.0


def _bound_named(exc: BaseException) -> str:
    """The config key of the bound an answer ran past, for the error's message."""
    if isinstance(exc, UpstreamTooLarge):
        return " (rollout.remote.max_answer_bytes)"
    if isinstance(exc, UpstreamTooSlow):
        return " (rollout.remote.answer_timeout_s)"
    return ""


class _Service:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.active = 0
        self.last_used = 0.0
        self.down_since: float | None = None
        self.served = 0
        self.failed = 0
        self.capacity: int | None = None  # as its last health answer reported it
        self.peak = 0  # most rollouts in flight at once (for tests and logs)


class RemoteFlow(RolloutFlow):
    """A flow that runs each rollout on one of ``settings.urls`` (see the module docstring)."""

    def __init__(self, settings: RemoteSettings, deadline_s: float | None = None) -> None:
        if not settings.urls:
            raise ConfigError.for_key(
                "rollout.remote.urls", 'rollout.executor = "remote" needs rollout.remote.urls'
            )
        self.settings = settings
        self.deadline_s = deadline_s
        self.services = [_Service(u) for u in settings.urls]
        self._pool: FastHttpPool | None = None
        self._freed: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None  # a slot was freed

        async def remote(task: Task, config: AgentConfig) -> Episode:
            return await self.run_remote(task, config)

        super().__init__(remote, name="remote")

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteFlow, (self.settings, self.deadline_s))

    @property
    def pool(self) -> FastHttpPool:
        if self._pool is None:
            # The wait for an answer to start is the rollout itself: the engine's deadline bounds it
            # (standing still while the gateway holds the agent's calls, which a timer here could
            # not), so the pool's own read timeout is only a backstop. Once the answer starts it has
            # answer_timeout_s and max_answer_bytes. No kept-alive connections: the pool re-sends a
            # request whose reused connection dropped, and a rollout must never be sent twice (its
            # first run may have called the model already).
            self._pool = FastHttpPool(
                connect_timeout_s=self.settings.connect_timeout_s,
                read_timeout_s=_BACKSTOP_S,
                max_idle=0,
                max_body_bytes=self.settings.max_answer_bytes,
                answer_timeout_s=self.settings.answer_timeout_s,
            )
        return self._pool

    async def start(self) -> None:
        """Probe every service; refuse to start (StateError naming them) when none answers."""
        results = await asyncio.gather(*(self._probe(s) for s in self.services))
        if not any(results):
            listed = ", ".join(s.url for s in self.services)
            raise StateError(f"no agent service answers GET /health: {listed}")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    async def _probe(self, service: _Service) -> bool:
        try:
            status, body = await asyncio.wait_for(
                self.pool.request("GET", service.url + "/health"), self.settings.connect_timeout_s
            )
            health = msgspec.json.decode(body, type=Health) if status == 200 else None
            healthy = health is not None and health.status == "ok"
        except Exception:  # unreachable, slow or garbage: down, whatever the way
            health, healthy = None, False
        if health is not None and healthy:
            # A capacity below 1 would never be picked: taken as not reported.
            service.capacity = (
                health.capacity if health.capacity is not None and health.capacity >= 1 else None
            )
        service.down_since = None if healthy else time.monotonic()
        if healthy:
            self._freed_event().set()  # a service back up is room for waiting attempts
        return healthy

    def _freed_event(self) -> asyncio.Event:
        # One per event loop (an Event binds to the loop it is first awaited in).
        loop = asyncio.get_running_loop()
        if self._freed is None or self._freed[0] is not loop:
            self._freed = (loop, asyncio.Event())
        return self._freed[1]

    async def _pick(self) -> _Service:
        while True:
            now = time.monotonic()
            due = [
                s
                for s in self.services
                if s.down_since is not None and now - s.down_since >= self.settings.health_interval_s
            ]
            if due:
                await asyncio.gather(*(self._probe(s) for s in due))
            up = [s for s in self.services if s.down_since is None]
            if not up:
                raise InfraError("every agent service is down: " + ", ".join(s.url for s in self.services))
            free = [s for s in up if s.capacity is None or s.active < s.capacity]
            if free:
                return min(free, key=self._load_after_one_more)
            # Every service is full: wait for a slot (or, at the latest, the next probe of one down).
            freed = self._freed_event()
            freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(freed.wait(), self.settings.health_interval_s)

    def _load_after_one_more(self, service: _Service) -> tuple[float, float]:
        reported = [s.capacity for s in self.services if s.capacity is not None]
        weight = service.capacity or (sum(reported) / len(reported) if reported else 1.0)
        return ((service.active + 1) / weight, service.last_used)

    async def run_remote(self, task: Task, config: AgentConfig) -> Episode:
        service = await self._pick()
        service.active += 1  # at once, no await since the pick: the next pick sees this slot taken
        service.peak = max(service.peak, service.active)
        service.last_used = time.monotonic()
        request = RolloutRequest(
            task=agent_view(task),  # the engine passes the view already; a service never gets more
            config=to_wire(config),
            deadline_s=self.deadline_s,
        )
        try:
            status, body = await self.pool.post(service.url + "/rollouts", msgspec.json.encode(request))
            if status == 200:
                episode = decode_answer(body, task.id)
            elif status == 422:
                failure = decode_failure(body)
                raise RemoteAgentError(
                    f"{failure.error.type}: {failure.error.message}",
                    termination_reason=failure.termination_reason,
                    details={"url": service.url, "error_type": failure.error.type},
                )
            elif status == 503:  # full (its capacity): retried elsewhere, not marked down
                raise InfraError(f"agent service {service.url} is busy (HTTP 503): {body[:200]!r}")
            else:
                raise RemoteProtocolError(
                    f"the agent service {service.url} answered HTTP {status}: {body[:200]!r}"
                )
        except RemoteAgentError:
            service.served += 1
            raise
        except InfraError:
            service.failed += 1
            raise
        except (ConnectionError, OSError, TimeoutError, RemoteProtocolError, UpstreamBadResponse) as exc:
            service.failed += 1
            service.down_since = time.monotonic()
            raise InfraError(f"agent service {service.url}: {exc}{_bound_named(exc)}") from exc
        finally:
            service.active -= 1
            self._freed_event().set()
        service.served += 1
        episode.metadata["remote"] = {"url": service.url}
        # Token truth: only the gateway's traces train. Steps a service built itself (token ids
        # it claims) are dropped, counted; its trajectories keep their role, reward and metadata.
        for trajectory in episode.trajectories:
            if trajectory.steps:
                trajectory.metadata["remote_steps_dropped"] = len(trajectory.steps)
                trajectory.steps = []
        return episode

    def stats(self) -> dict[str, dict[str, int]]:
        """Rollouts served and failed, in flight now and at most, per service URL (for tests and logs)."""
        return {
            s.url: {"served": s.served, "failed": s.failed, "active": s.active, "peak": s.peak}
            for s in self.services
        }
