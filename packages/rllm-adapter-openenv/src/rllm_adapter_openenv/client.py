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
from rllm.sdk.sandbox import SandboxAgentError
from rllm_adapter_openenv.environments import InvalidAction

MODEL_ERRORS = frozenset({"VALIDATION_ERROR"})


class OpenEnvClient(GenericEnvClient):
    """One environment session on the server at ``base_url``; with ``unix_path``, a server
    inside the rollout's sandbox reached over that unix socket, whose failures once the episode
    runs are the agent's (``SandboxAgentError``: the server lives in the agent's sandbox)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = 30.0,
        message_timeout_s: float = 120.0,
        unix_path: str | None = None,
    ):
        super().__init__(base_url, connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s)
        self.base_url = base_url
        self.unix_path = unix_path

    def _failure(self, message: str) -> InfraError:
        return SandboxAgentError(message) if self.unix_path is not None else InfraError(message)

    async def connect(self) -> OpenEnvClient:
        try:
            if self.unix_path is not None and self._ws is None:
                from websockets.asyncio.client import unix_connect

                # openenv-core's own connect, over the sandbox's socket (bounded the same way).
                self._ws = await unix_connect(
                    self.unix_path,
                    uri=self._ws_url,
                    open_timeout=self._connect_timeout,
                    max_size=self._max_message_size,
                )
            else:
                await super().connect()
        except Exception as exc:  # openenv-core's ConnectionError, naming the socket and the cause
            raise self._failure(f"OpenEnv server {self.base_url} failed during connect: {exc}") from exc
        return self

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        what = message.get("type", "message")
        try:
            await self._send(message)
            response = await self._receive()
        except Exception as exc:  # refused, closed, timed out: the server's, not the model's
            reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
            raise self._failure(f"OpenEnv server {self.base_url} failed during {what}: {reason}") from exc
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
        raise self._failure(f"OpenEnv server {self.base_url} failed during {what}: {code}: {detail}")
