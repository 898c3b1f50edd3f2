"""Sessions: one per rollout. A session owns a token, sampling overrides, a sequence counter
for its traces, its sticky upstream and, in cumulative mode, the token state per role.
The registry holds the live ones (persisted in the trace store) and remembers the ended ones."""

from __future__ import annotations

import hmac
import re
import secrets
import time
from collections import OrderedDict
from typing import Any

from rllm.gateway.errors import GatewayError
from rllm.gateway.jsonguard import JsonLimitError, check_json
from rllm.gateway.store import SessionRow, TraceStore
from rllm.types import SamplingParams, TraceRecord, convert, new_id

_SESSION_ID_RE = re.compile(r"^[A-Za-z0-9._:@-]{1,200}$")


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
        "upstream",
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
        self.upstream: str | None = None
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


class SessionRegistry:
    """The live sessions of one gateway (``live``, by id) and the ended ones (``ended``).

    Every change is written through to the store, so a gateway on a SQLite store gets its
    sessions back after a restart. Bad input raises GatewayError naming the field.
    """

    __slots__ = ("ended", "live", "max_json_depth", "store")

    def __init__(self, store: TraceStore, *, ended: EndedSessions, max_json_depth: int) -> None:
        self.store = store
        self.ended = ended
        self.max_json_depth = max_json_depth
        self.live: dict[str, Session] = {}
        for row in store.load_sessions():
            s = Session.from_row(row)
            s.next_seq = store.max_seq(s.session_id) + 1
            self.live[s.session_id] = s

    def new(self, sid: str, sampling: SamplingParams | None, metadata: dict[str, Any] | None) -> Session:
        """Register a session under ``sid`` (400 unless it is a valid id)."""
        if not _SESSION_ID_RE.match(sid) or sid in (".", ".."):
            raise GatewayError(
                400, f"invalid session id {sid!r}: use 1-200 of [A-Za-z0-9._:@-]", param="session_id"
            )
        s = Session(sid, sampling=sampling, metadata=metadata)
        self.live[sid] = s
        self.store.put_session(s.row())
        return s

    def open(
        self,
        session_id: str | None = None,
        sampling: SamplingParams | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Session:
        """Create a session, or update an existing one's sampling and metadata."""
        if session_id is None:
            session_id = new_id()
        if not isinstance(session_id, str):
            raise GatewayError(400, "'session_id' must be a string", param="session_id")
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise GatewayError(400, "'sampling' must be SamplingParams", param="sampling")
        if metadata is None:
            metadata = {}
        elif not isinstance(metadata, dict):
            raise GatewayError(400, "'metadata' must be an object", param="metadata")
        try:
            check_json(metadata, self.max_json_depth, "metadata")
        except JsonLimitError as exc:
            raise GatewayError(400, f"{exc.message} at {exc.path}", param=exc.path) from None
        self.ended.discard(session_id)  # the admin may open an ended id again, on purpose
        existing = self.live.get(session_id)
        if existing is not None:
            if sampling is not None:
                existing.sampling = sampling
            existing.metadata.update(metadata)
            self.store.put_session(existing.row())
            return existing
        return self.new(session_id, sampling, dict(metadata))

    def existing(self, sid: str) -> Session:
        """The live session ``sid``, or 404."""
        s = self.live.get(sid)
        if s is None:
            raise GatewayError(404, f"unknown session {sid!r}", param="session_id", code="unknown_session")
        return s

    def end(self, session_id: str) -> bool:
        """Unregister a session and remember that it ended; whether it existed."""
        s = self.live.pop(session_id, None)
        if s is None:
            return False
        self.ended.add(session_id, s.token)
        return True

    async def close(self, session_id: str) -> int:
        """Delete a session and its traces; how many traces were freed. 404 if it never existed."""
        existed = self.end(session_id)
        n = await self.store.delete_session(session_id)
        if not existed and n == 0:
            raise GatewayError(
                404, f"unknown session {session_id!r}", param="session_id", code="unknown_session"
            )
        return n

    async def finish(self, session_id: str) -> list[TraceRecord]:
        """Delete a session and return its traces (ordered by ``seq``). The session is
        unregistered first, so a call still in flight for it leaves no trace behind. 404 if the
        session never existed."""
        existed = self.end(session_id)
        records = await self.store.get(session_id)
        n = await self.store.delete_session(session_id)
        if not existed and n == 0 and not records:
            raise GatewayError(
                404, f"unknown session {session_id!r}", param="session_id", code="unknown_session"
            )
        return records
