"""Trace stores: where captured TraceRecords live until the engine collects them.

Both stores implement :class:`TraceStore`. ``put`` is synchronous and cheap because it runs on
the request hot path: the memory store appends to a list, the SQLite store appends to a queue
that a background thread writes in batches (one transaction per batch, WAL journal), so a
request never waits on the disk. ``flush`` waits until everything put so far is committed;
a committed trace survives a crash of the gateway process.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

import msgspec

from rllm.gateway.trace_query import ALL_TRACES, TraceQuery
from rllm.types import TraceRecord, from_msgpack, to_msgpack
from rllm.types.errors import InputError, StateError

log = logging.getLogger("rllm.gateway.store")
_INT64 = (-(2**63), 2**63 - 1)


class SessionRow(msgspec.Struct, omit_defaults=True):
    """What a store keeps of a session so it survives a restart (tokens, sampling, metadata)."""

    session_id: str
    token: str | None = None
    sampling: dict[str, Any] | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    created_at: float = 0.0


class TraceStore(Protocol):
    def put(self, record: TraceRecord) -> None: ...
    async def get(self, session_id: str) -> list[TraceRecord]: ...
    async def query(self, query: TraceQuery = ALL_TRACES) -> list[TraceRecord]: ...
    async def delete_session(self, session_id: str) -> int: ...
    async def flush(self) -> None: ...
    def trace_count(self) -> int: ...
    def put_session(self, row: SessionRow) -> None: ...
    def load_sessions(self) -> list[SessionRow]: ...
    def max_seq(self, session_id: str) -> int: ...
    async def close(self) -> None: ...


def stand_in(record: TraceRecord, exc: BaseException) -> TraceRecord:
    """An ``error`` record in place of one that cannot be encoded: the call keeps its one trace
    (same id, session, role, seq), and saying why costs no other record anything."""
    wv = record.weight_version
    return TraceRecord(
        session_id=record.session_id,
        id=record.id,
        role=record.role,
        seq=record.seq,
        created_at=record.created_at,
        latency_s=record.latency_s,
        weight_version=wv if isinstance(wv, int) and _INT64[0] <= wv <= _INT64[1] else None,
        status="error",
        metadata={"error": f"the trace could not be encoded ({type(exc).__name__}: {exc})"},
    )


def encode_trace(record: TraceRecord) -> bytes:
    """msgpack of one record, or of its stand_in when the record cannot be encoded."""
    try:
        return to_msgpack(record)
    except (OverflowError, RecursionError, TypeError, ValueError) as exc:
        log.error("trace %s of session %s cannot be encoded: %s", record.id, record.session_id, exc)
        return to_msgpack(stand_in(record, exc))


def encodable(records: list[TraceRecord]) -> list[TraceRecord]:
    """``records`` with each one that cannot be encoded replaced by its stand_in; for a reader
    whose batch encoding failed, so that one bad record never hides the others."""
    out = []
    for r in records:
        try:
            to_msgpack(r)
            out.append(r)
        except (OverflowError, RecursionError, TypeError, ValueError) as exc:
            out.append(stand_in(r, exc))
    return out


def _filter(records: Iterable[TraceRecord], role: str | None, since: float | None) -> list[TraceRecord]:
    return [
        r for r in records if (role is None or r.role == role) and (since is None or r.created_at >= since)
    ]


class MemoryTraceStore:
    """Traces in a dict of lists; lost when the process ends. The default, and the fastest."""

    def __init__(self) -> None:
        self._by_session: dict[str, list[TraceRecord]] = {}
        self._count = 0

    def put(self, record: TraceRecord) -> None:
        lst = self._by_session.get(record.session_id)
        if lst is None:
            lst = self._by_session[record.session_id] = []
        lst.append(record)
        self._count += 1

    async def get(self, session_id: str) -> list[TraceRecord]:
        return sorted(self._by_session.get(session_id, ()), key=_seq_key)

    async def query(self, query: TraceQuery = ALL_TRACES) -> list[TraceRecord]:
        if query.session_id is not None:
            pool: Iterable[TraceRecord] = self._by_session.get(query.session_id, ())
        else:
            pool = (r for lst in self._by_session.values() for r in lst)
        out = sorted(_filter(pool, query.role, query.since), key=lambda r: (r.created_at, r.seq))
        return out[: query.limit] if query.limit is not None else out

    async def delete_session(self, session_id: str) -> int:
        lst = self._by_session.pop(session_id, [])
        self._count -= len(lst)
        return len(lst)

    async def flush(self) -> None:
        return None

    def trace_count(self) -> int:
        return self._count

    def put_session(self, row: SessionRow) -> None:
        return None  # sessions live in the registry; nothing outlives the process

    def load_sessions(self) -> list[SessionRow]:
        return []

    def max_seq(self, session_id: str) -> int:
        return -1

    async def close(self) -> None:
        return None


def _seq_key(r: TraceRecord) -> int:
    return r.seq


_SCHEMA = """
CREATE TABLE IF NOT EXISTS traces (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    role TEXT NOT NULL,
    seq INTEGER NOT NULL,
    created_at REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS traces_by_session ON traces(session_id, seq);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS images (
    session_id TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (session_id, sha256)
);
"""


class SqliteTraceStore:
    """Traces in one SQLite file (WAL). Writes are batched on a background thread.

    Reads first ``flush`` so a reader always sees every trace put before it asked. A trace's
    images (``TraceRecord.images``, sha256 -> data URI) go to the ``images`` table, once per
    session and hash; the trace's own row keeps only the hashes, filled in again on reading.
    """

    def __init__(self, path: str, *, batch_ms: float = 5.0) -> None:
        self.path = path
        self._batch_s = batch_ms / 1000.0
        self._pending: list[tuple[str, Any]] = []
        self._cond = threading.Condition()
        self._put_seq = 0  # items handed to the writer
        self._done_seq = 0  # items committed
        self._closed = False
        self._error: BaseException | None = None
        self._count = 0
        self._write_conn = self._connect()
        self._write_conn.executescript(_SCHEMA)
        self._write_conn.commit()
        self._count = self._write_conn.execute("SELECT COUNT(*) FROM traces").fetchone()[0]
        self._read_conn = self._connect()
        self._read_lock = threading.Lock()
        self._thread = threading.Thread(target=self._writer, name="rllm-trace-writer", daemon=True)
        self._thread.start()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode is durable against a crash of the process (kill -9); only an OS
        # crash or power loss can lose the last transactions.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    # --------------------------------------------------------------- writes
    def put(self, record: TraceRecord) -> None:
        with self._cond:
            self._pending.append(("trace", record))
            self._put_seq += 1
            self._count += 1
            self._cond.notify()

    def put_session(self, row: SessionRow) -> None:
        with self._cond:
            self._pending.append(("session", row))
            self._put_seq += 1
            self._cond.notify()

    def _writer(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending and self._closed:
                    return
            if self._batch_s:
                time.sleep(self._batch_s)  # let a burst accumulate into one transaction
            with self._cond:
                batch, self._pending = self._pending, []
            try:
                self._write_batch(batch)
            except BaseException as exc:  # keep serving; flush() reports it
                self._error = exc
            with self._cond:
                self._done_seq += len(batch)
                self._cond.notify_all()

    def _write_batch(self, batch: list[tuple[str, Any]]) -> None:
        traces = []
        sessions = []
        deletes = []
        images = []
        for kind, item in batch:
            # Each record is encoded on its own: one that cannot be (it should have been refused
            # at the door) must never cost the rest of the batch, i.e. other sessions' traces.
            if kind == "trace":
                if item.images:
                    images.extend((item.session_id, h, uri) for h, uri in item.images.items())
                    item = msgspec.structs.replace(item, images=dict.fromkeys(item.images, ""))
                traces.append(
                    (item.id, item.session_id, item.role, item.seq, item.created_at, encode_trace(item))
                )
            elif kind == "session":
                try:
                    sessions.append((item.session_id, msgspec.msgpack.encode(item)))
                except (OverflowError, RecursionError, TypeError, ValueError) as exc:
                    log.error("session %s cannot be stored: %s", item.session_id, exc)
            else:
                deletes.append((item,))
        conn = self._write_conn
        conn.execute("BEGIN")
        try:
            if sessions:
                conn.executemany("INSERT OR REPLACE INTO sessions(session_id, data) VALUES (?, ?)", sessions)
            if images:
                conn.executemany(
                    "INSERT OR IGNORE INTO images(session_id, sha256, data) VALUES (?,?,?)", images
                )
            if traces:
                conn.executemany(
                    "INSERT OR REPLACE INTO traces(id, session_id, role, seq, created_at, data) VALUES (?,?,?,?,?,?)",
                    traces,
                )
            if deletes:
                conn.executemany("DELETE FROM traces WHERE session_id = ?", deletes)
                conn.executemany("DELETE FROM images WHERE session_id = ?", deletes)
                conn.executemany("DELETE FROM sessions WHERE session_id = ?", deletes)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _wait_committed(self, target: int) -> None:
        with self._cond:
            while self._done_seq < target:
                self._cond.wait(timeout=1.0)
        if self._error is not None:
            err, self._error = self._error, None
            raise StateError(f"trace store {self.path}: write failed: {err}") from err

    async def flush(self) -> None:
        with self._cond:
            target = self._put_seq
            if self._done_seq >= target and self._error is None:
                return
        await asyncio.get_running_loop().run_in_executor(None, self._wait_committed, target)

    # --------------------------------------------------------------- reads
    def _read(self, sql: str, args: tuple[Any, ...]) -> list[TraceRecord]:
        with self._read_lock:
            rows = self._read_conn.execute(sql, args).fetchall()
            records = [from_msgpack(row[0], TraceRecord) for row in rows]
            for r in records:
                if r.images:
                    r.images = self._images_of(r)
        return records

    def _images_of(self, record: TraceRecord) -> dict[str, str]:
        out = {}
        for digest in record.images:
            row = self._read_conn.execute(
                "SELECT data FROM images WHERE session_id = ? AND sha256 = ?", (record.session_id, digest)
            ).fetchone()
            out[digest] = row[0] if row is not None else ""
        return out

    async def _read_async(self, sql: str, args: tuple[Any, ...]) -> list[TraceRecord]:
        await self.flush()
        return await asyncio.get_running_loop().run_in_executor(None, self._read, sql, args)

    async def get(self, session_id: str) -> list[TraceRecord]:
        return await self._read_async(
            "SELECT data FROM traces WHERE session_id = ? ORDER BY seq", (session_id,)
        )

    async def query(self, query: TraceQuery = ALL_TRACES) -> list[TraceRecord]:
        where, args = [], []
        if query.session_id is not None:
            where.append("session_id = ?")
            args.append(query.session_id)
        if query.role is not None:
            where.append("role = ?")
            args.append(query.role)
        if query.since is not None:
            where.append("created_at >= ?")
            args.append(query.since)
        sql = "SELECT data FROM traces"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at, seq"
        if query.limit is not None:
            sql += " LIMIT ?"
            args.append(query.limit)
        return await self._read_async(sql, tuple(args))

    async def delete_session(self, session_id: str) -> int:
        await self.flush()
        with self._read_lock:
            n = self._read_conn.execute(
                "SELECT COUNT(*) FROM traces WHERE session_id = ?", (session_id,)
            ).fetchone()[0]
        with self._cond:
            self._pending.append(("delete", session_id))
            self._put_seq += 1
            self._count -= n
            self._cond.notify()
        await self.flush()
        return n

    def trace_count(self) -> int:
        return self._count

    def load_sessions(self) -> list[SessionRow]:
        with self._read_lock:
            rows = self._read_conn.execute("SELECT data FROM sessions").fetchall()
        return [msgspec.msgpack.decode(r[0], type=SessionRow) for r in rows]

    def max_seq(self, session_id: str) -> int:
        with self._read_lock:
            row = self._read_conn.execute(
                "SELECT MAX(seq) FROM traces WHERE session_id = ?", (session_id,)
            ).fetchone()
        return -1 if row[0] is None else int(row[0])

    async def close(self) -> None:
        await self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10)
        self._write_conn.close()
        self._read_conn.close()


def open_store(spec: str, *, batch_ms: float = 5.0) -> MemoryTraceStore | SqliteTraceStore:
    """``"memory"`` or ``"sqlite:/path/file.db"`` -> a store."""
    if spec == "memory":
        return MemoryTraceStore()
    if spec.startswith("sqlite:"):
        return SqliteTraceStore(spec[len("sqlite:") :], batch_ms=batch_ms)
    raise InputError(f"unknown store {spec!r}: use 'memory' or 'sqlite:/path/file.db'")
