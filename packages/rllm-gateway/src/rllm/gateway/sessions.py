"""Sessions: one per rollout. A session owns a token, sampling overrides, a sequence counter
for its traces, its sticky upstream worker and, in cumulative mode, the token state per role."""

from __future__ import annotations

import hmac
import secrets
import time
from typing import Any

from rllm.gateway.store import SessionRow
from rllm.types import SamplingParams, convert


class Session:
    __slots__ = ("bridges", "created_at", "metadata", "next_seq", "sampling", "session_id", "token", "worker")

    def __init__(
        self,
        session_id: str,
        *,
        token: str | None = None,
        sampling: SamplingParams | None = None,
        metadata: dict[str, Any] | None = None,
        created_at: float | None = None,
    ) -> None:
        self.session_id = session_id
        self.token = token or secrets.token_urlsafe(24)
        self.sampling = sampling
        self.metadata = metadata or {}
        self.created_at = created_at or time.time()
        self.next_seq = 0
        self.worker: str | None = None
        self.bridges: dict[str, Any] = {}  # role -> cumulative.BridgeState

    def token_matches(self, presented: str) -> bool:
        # Constant-time, so a sandboxed agent cannot learn another session's token by timing.
        return hmac.compare_digest(presented.encode(), self.token.encode())

    def row(self) -> SessionRow:
        sampling = None
        if self.sampling is not None:
            from rllm.types import to_builtins

            sampling = to_builtins(self.sampling)
        return SessionRow(self.session_id, self.token, sampling, self.metadata, self.created_at)

    @classmethod
    def from_row(cls, row: SessionRow) -> Session:
        sampling = convert(row.sampling, SamplingParams) if row.sampling is not None else None
        return cls(
            row.session_id,
            token=row.token,
            sampling=sampling,
            metadata=row.metadata,
            created_at=row.created_at,
        )

    def info(self, base_url: str, *, with_token: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "session_id": self.session_id,
            "base_url": f"{base_url}/sessions/{self.session_id}/v1",
            "created_at": self.created_at,
            "metadata": self.metadata,
            "traces": self.next_seq,
        }
        if self.sampling is not None:
            from rllm.types import to_builtins

            out["sampling"] = to_builtins(self.sampling)
        if with_token:
            out["token"] = self.token
        return out
