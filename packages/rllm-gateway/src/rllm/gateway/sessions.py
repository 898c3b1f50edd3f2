"""Sessions: one per rollout. A session owns a token, sampling overrides, a sequence counter
for its traces, its sticky upstream worker and, in cumulative mode, the token state per role."""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from typing import Any

from rllm.gateway.store import SessionRow
from rllm.types import SamplingParams, convert


class Session:
    __slots__ = (
        "bridges",
        "created_at",
        "images",
        "metadata",
        "next_seq",
        "sampling",
        "session_id",
        "token",
        "worker",
    )

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
        # sha256 -> data URI: the session's traces share one string per distinct image.
        self.images: dict[str, str] = {}

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


class EndedSessions:
    """Ids of sessions that were finished or deleted, so that a call arriving late (a flow past
    its deadline) is refused instead of silently re-creating the session and leaking its traces.

    Bounded in both count and age: the oldest entries go first once ``max_entries`` is reached,
    and an entry older than ``ttl_s`` no longer counts (by then no late call is expected).
    """

    __slots__ = ("_ids", "max_entries", "ttl_s")

    def __init__(self, *, ttl_s: float, max_entries: int) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._ids: OrderedDict[str, tuple[float, str]] = OrderedDict()  # id -> (ended at, token)

    def add(self, session_id: str, token: str) -> None:
        if self.max_entries <= 0:
            return
        self._ids.pop(session_id, None)
        self._ids[session_id] = (time.monotonic(), token)
        while len(self._ids) > self.max_entries:
            self._ids.popitem(last=False)

    def token_of(self, session_id: str) -> str | None:
        """The ended session's token if it ended within ``ttl_s``, else None."""
        entry = self._ids.get(session_id)
        if entry is None:
            return None
        if time.monotonic() - entry[0] > self.ttl_s:
            self._expire()
            return None
        return entry[1]

    def discard(self, session_id: str) -> None:
        self._ids.pop(session_id, None)

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.ttl_s
        ids = self._ids
        while ids and next(iter(ids.values()))[0] < cutoff:
            ids.popitem(last=False)

    def __len__(self) -> int:
        return len(self._ids)
