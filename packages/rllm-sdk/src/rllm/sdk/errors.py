"""Exceptions a flow can raise to say *why* it failed, so the engine classifies it correctly."""

from __future__ import annotations

from rllm.types.errors import RLLMError


class InfraError(RLLMError, RuntimeError):
    """The model endpoint, a sandbox or another service the flow depends on failed.

    The engine treats it like a gateway/upstream failure: the rollout is retried on a fresh
    session (up to the retry policy) and, if it keeps failing, ends as ``infra_error`` instead of
    blaming the agent.
    """


class FlowReturnError(RLLMError, TypeError):
    """A flow returned something that is not an Episode, Trajectory, dict, str or None."""
