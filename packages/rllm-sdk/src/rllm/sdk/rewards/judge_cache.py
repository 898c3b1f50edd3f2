"""The judges' reply cache: one parsed-and-accepted reply per request, keyed by a content hash.

The key is the SHA-256 of the request's canonical JSON (endpoint model, messages, sampling), so
the same question to the same judge is asked once: a group judged again after a retry, the same
answer in many groups of a small dataset, a resumed run with a cache file. Only replies that
parsed are stored (an unparseable reply is an infrastructure failure, asked again next time).

In memory always; with ``path``, also in a SQLite file that outlives the process and is shared
by every process that opens it (WAL journal, a busy timeout for concurrent writers).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import msgspec


class CachedReply(msgspec.Struct, frozen=True):
    """A judge's reply as it was first received, with the tokens that call spent."""

    reply: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


def cache_key(request: dict[str, Any]) -> str:
    """The SHA-256 hex digest of ``request`` as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class JudgeCache:
    """Replies by key: a dict, backed by the SQLite file ``path`` when given.

    Thread-safe (sync evaluators run in a thread pool); a copy sent to a worker process opens
    the same file again there.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = None if path is None else Path(path)
        self._memory: dict[str, CachedReply] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}  # a worker process starts with an empty memory and its own connection

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS judge_replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL, "
                "prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL)"
            )
            self._db = db
        return self._db

    def get(self, key: str) -> CachedReply | None:
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None or self.path is None:
                return hit
            row = (
                self._conn()
                .execute(
                    "SELECT reply, prompt_tokens, completion_tokens FROM judge_replies WHERE key = ?", (key,)
                )
                .fetchone()
            )
            if row is None:
                return None
            hit = CachedReply(reply=row[0], prompt_tokens=row[1], completion_tokens=row[2])
            self._memory[key] = hit
            return hit

    def put(self, key: str, value: CachedReply) -> None:
        with self._lock:
            self._memory[key] = value
            if self.path is not None:
                self._conn().execute(
                    "INSERT OR REPLACE INTO judge_replies VALUES (?, ?, ?, ?)",
                    (key, value.reply, value.prompt_tokens, value.completion_tokens),
                )

    def __len__(self) -> int:
        with self._lock:
            if self.path is None:
                return len(self._memory)
            return int(self._conn().execute("SELECT COUNT(*) FROM judge_replies").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
