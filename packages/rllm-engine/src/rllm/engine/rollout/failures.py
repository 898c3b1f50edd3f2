"""Classify why a flow failed: the agent's fault, the infrastructure's, or the context limit.

The rule (docs/architecture.md, "Who caused a failure"): an infrastructure error is only what the
agent cannot cause — a sandbox that failed to start, a host-side fault, the gateway or the model
upstream down, an agent service that answers garbage. It is retried on a fresh session. A failure
the agent caused, inside its own sandbox included (its disk filled, a link or a special file
where a file was expected), is the agent's outcome: scored (reward 0, the reason on the
episode), never retried and never dropped from its group.

An error that knows whose it is says so: a ``termination_reason`` attribute (e.g.
``rllm.sdk.sandbox.SandboxAgentError``, ``rllm.sdk.command.CommandError``) wins over its class.
Otherwise, since a flow talks to the gateway with whatever client it likes (openai, httpx,
aiohttp, litellm), errors are recognised by duck typing along the exception chain
(``__cause__``/``__context__``) instead of importing every client library: connection failures,
timeouts of the HTTP client, HTTP 5xx/429 answers and ``InfraError`` (a host-side
``SandboxError`` among them) are infrastructure; everything else is the agent's.
"""

from __future__ import annotations

import re

from rllm.sdk.errors import InfraError
from rllm.types import TerminationReason
from rllm.types.errors import ConfigError, UsageError

_INFRA_TYPE_NAMES = frozenset(
    {
        "APIConnectionError",  # openai, litellm
        "APITimeoutError",
        "InternalServerError",
        "ServiceUnavailableError",
        "RateLimitError",
        "ConnectError",  # httpx
        "ConnectTimeout",
        "ReadTimeout",
        "ReadError",
        "RemoteProtocolError",
        "ServerDisconnectedError",  # aiohttp
        "ClientConnectionError",
        "ClientConnectorError",
        "ClientPayloadError",
    }
)
_CONTEXT_LIMIT = re.compile(
    r"context length|maximum context|context window|too many tokens|prompt is too long", re.I
)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _status_code(exc: BaseException) -> int | None:
    for attr in ("status_code", "status"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    response = getattr(exc, "response", None)
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) else None


def classify_exception(exc: BaseException) -> TerminationReason:
    """INFRA_ERROR, CONTEXT_LIMIT or AGENT_ERROR for an exception that escaped a flow (or the
    ``termination_reason`` an exception in its chain declares)."""
    for err in _chain(exc):
        # An error that knows its termination (e.g. rllm.sdk.command.CommandError) says so.
        declared = getattr(err, "termination_reason", None)
        if isinstance(declared, TerminationReason):
            return declared
        if isinstance(err, InfraError | ConnectionError):
            return TerminationReason.INFRA_ERROR
        if any(cls.__name__ in _INFRA_TYPE_NAMES for cls in type(err).__mro__):
            return TerminationReason.INFRA_ERROR
        status = _status_code(err)
        if status is not None and (status >= 500 or status == 429):
            return TerminationReason.INFRA_ERROR
        if status == 400 and _CONTEXT_LIMIT.search(str(err)):
            return TerminationReason.CONTEXT_LIMIT
    return TerminationReason.AGENT_ERROR


def sandbox_start_failure(exc: BaseException) -> TerminationReason:
    """The termination of a rollout whose sandbox did not start. The agent has not run yet, so
    it cannot have caused it: an infrastructure error, whatever the exception (a setup script
    that fails, a host folder or cgroup that cannot be made, a backend that is gone). A run the
    operator misconfigured (a task asking for network without consent, a spec function returning
    something else) keeps its own classification: retrying cannot fix it."""
    if any(isinstance(err, ConfigError | UsageError) for err in _chain(exc)):
        return classify_exception(exc)
    return TerminationReason.INFRA_ERROR


RETRYABLE = frozenset({TerminationReason.INFRA_ERROR})
FAILED = frozenset({TerminationReason.AGENT_ERROR, TerminationReason.INFRA_ERROR, TerminationReason.TIMEOUT})
