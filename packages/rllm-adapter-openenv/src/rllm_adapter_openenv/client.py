"""openenv-core's own session client (``GenericEnvClient``: reset/step over the server's ``/ws``
session) with its failures classified as the rest of rLLM does.

A server that cannot be reached, closes the session, stops answering within the timeout, or
reports that the environment itself failed (``EXECUTION_ERROR``, ``SESSION_ERROR``,
``FACTORY_ERROR``, ``CAPACITY_REACHED``) is an ``InfraError`` with the reason: retried, never
scored as the agent's. An action the environment's schema refuses (``VALIDATION_ERROR``) is the
model's: ``InvalidAction``, whose message goes back to the model.
"""

from __future__ import annotations

from typing import Any

from openenv.core.generic_client import GenericEnvClient

from rllm.sdk import InfraError
from rllm_adapter_openenv.environments import InvalidAction

MODEL_ERRORS = frozenset({"VALIDATION_ERROR"})


class OpenEnvClient(GenericEnvClient):
    """One environment session on the server at ``base_url``."""

    def __init__(self, base_url: str, *, connect_timeout_s: float = 30.0, message_timeout_s: float = 120.0):
        super().__init__(base_url, connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s)
        self.base_url = base_url

    async def connect(self) -> OpenEnvClient:
        try:
            await super().connect()
        except Exception as exc:  # openenv-core's ConnectionError, naming the socket and the cause
            raise InfraError(f"OpenEnv server {self.base_url} failed during connect: {exc}") from exc
        return self

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        what = message.get("type", "message")
        try:
            await self._send(message)
            response = await self._receive()
        except Exception as exc:  # refused, closed, timed out: the server's, not the model's
            reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
            raise InfraError(f"OpenEnv server {self.base_url} failed during {what}: {reason}") from exc
        if response.get("type") != "error":
            return response
        data = response.get("data") or {}
        code = str(data.get("code", "UNKNOWN"))
        detail = str(data.get("message", "unknown error"))
        if code in MODEL_ERRORS:
            errors = data.get("errors") or []
            reasons = "; ".join(
                f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg', '')}"
                for e in errors
                if isinstance(e, dict)
            )
            raise InvalidAction(f"invalid action: {reasons or detail}")
        raise InfraError(f"OpenEnv server {self.base_url} failed during {what}: {code}: {detail}")
