"""The host's end of a sandbox desktop's helper (``rllm.sdk.desktop_helper``): requests out, replies
in, one at a time, and nothing the helper sends trusted.

The sandbox backend listens on a unix socket that only the desktop session can reach; the helper
connects to it once (the first connection is the helper's; any later one is closed). Being a
socket the helper opened itself, no other process holds it: when the helper dies, the host reads
end-of-file.

The helper runs beside the task's own apps (same user, same namespaces), so whatever comes over
the socket may be forged: every reply is read with a bounded size (the header says a length,
checked against the most that request can need before anything is read), under a deadline, and
must carry the id of the request in flight. Any breach, an end of the connection, or a call
cancelled in mid-reply breaks the channel: that call raises ``SandboxError`` (what it asked may
or may not have happened), the connection is closed, and later calls get ``None`` so the caller
goes back to one exec per action. A call made once the helper is known to be gone gets ``None``
straight away (nothing ran). A helper that never said hello (no python3 or libxdo in the
sandbox) is "unavailable": calls get ``None`` and nothing ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any, Literal

from rllm.sdk.desktop_helper import HEADER, MAGIC, SHOT_HEADER
from rllm.sdk.sandbox import DesktopSpec, SandboxError

CALL_TIMEOUT_S = 30.0  # one request's reply, a full-screen screenshot included
HELLO_TIMEOUT_S = 30.0  # the helper's start (python and libraries) under load
MAX_SMALL_REPLY = 64 * 1024  # any reply but a screenshot (error messages, the cursor)
MAX_UNSENT = 1024 * 1024  # requests the helper has not taken yet; past this it is not reading
log = logging.getLogger(__name__)
State = Literal["new", "ready", "unavailable", "broken"]
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class HelperChannel:
    """Requests to one desktop helper, once it connected (``connected`` is the socket server's
    callback); ``spec`` bounds what a screenshot may be."""

    def __init__(self, spec: DesktopSpec) -> None:
        self.spec = spec
        self.state: State = "new"
        self.why = ""
        self._connection: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._on_close: list[Callable[[], object]] = []
        self._lock = asyncio.Lock()
        self._ids = iter(range(1, 2**32))

    @property
    def max_shot(self) -> int:
        """The most bytes a screenshot reply may hold: 32-bit pixels, rows padded by 64 at most."""
        return SHOT_HEADER.size + (self.spec.width * 4 + 64) * self.spec.height

    def connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The socket server's callback: the first connection is the helper, others are closed."""
        if self._connection.done():
            writer.close()
            return
        self._connection.set_result((reader, writer))
        self._stop_listening()

    def on_close(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` (e.g. the socket server's close) once no connection is awaited any more."""
        self._on_close.append(fn)

    def unavailable(self, why: str) -> None:
        """No helper will come (the sandbox said so): calls get None from now on."""
        if self.state == "new":
            self.state, self.why = "unavailable", why
            self.close()

    async def ready(self) -> bool:
        """Wait for the helper's hello if none came yet; True when the helper is usable. (A
        backend whose every process can reach the socket waits for it before handing the sandbox
        out, so the first connection is the helper's.)"""
        async with self._lock:
            if self.state == "new":
                await self._hello()
            return self.state == "ready"

    async def call(self, op: str, **args: Any) -> bytes | None:
        """The reply's payload; None when the helper is not usable (use one exec instead).
        SandboxError when the helper said it failed, or the channel broke on this call."""
        async with self._lock:
            if self.state == "new":
                await self._hello()
            if self.state != "ready":
                return None
            reader, writer = self._connection.result()
            if reader.at_eof() or writer.is_closing():
                self.drop("its connection ended")  # nothing of this request was sent
                return None
            number = next(self._ids)
            writer.write(json.dumps({"id": number, "op": op, **args}, ensure_ascii=True).encode() + b"\n")
            done = False
            try:
                if writer.transport.get_write_buffer_size() > MAX_UNSENT:
                    raise SandboxError("the desktop helper stopped reading its requests")
                ok, payload = await self._reply(
                    reader, number, self.max_shot if op == "shot" else MAX_SMALL_REPLY
                )
                done = True
            except SandboxError as exc:
                self.drop(str(exc))
                raise
            finally:
                if not done and self.state == "ready":  # cancelled in mid-reply
                    self.drop("a call was cancelled before its reply was read")
            if not ok:
                raise SandboxError(f"desktop {op} failed: {_text(payload)}")
            return payload

    def drop(self, why: str) -> None:
        """Stop using the helper (close its connection): later calls get None."""
        self.state, self.why = "broken", why
        self.close()
        log.warning("sandbox desktop: helper dropped, one exec per action from now on (%s)", why)

    def close(self) -> None:
        """Close the connection and stop listening for one; idempotent."""
        if not self._connection.done():
            # A call waiting for the helper gets SandboxError, not a cancellation of its own.
            self._connection.set_exception(SandboxError("the sandbox desktop is closed"))
            self._connection.exception()  # (retrieved: asyncio logs none)
        elif self._connection.exception() is None:
            self._connection.result()[1].close()
        self._stop_listening()

    def _stop_listening(self) -> None:
        fns, self._on_close = self._on_close, []
        for fn in fns:
            with contextlib.suppress(Exception):
                fn()

    async def _hello(self) -> None:
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                reader, _ = await asyncio.shield(self._connection)
                number, ok, payload = await _frame(reader, MAX_SMALL_REPLY)
        except TimeoutError:
            number, ok, payload = 0, False, f"no hello within {HELLO_TIMEOUT_S:g} s".encode()
        except (asyncio.IncompleteReadError, ConnectionError):
            number, ok, payload = 0, False, b"its connection ended before its hello"
        except SandboxError as exc:
            number, ok, payload = 0, False, str(exc).encode()
        if number == 0 and ok:
            self.state = "ready"
            return
        self.state, self.why = "unavailable", _text(payload)
        self.close()
        log.warning("sandbox desktop: one exec per action (its helper is unavailable: %s)", self.why)

    async def _reply(self, reader: asyncio.StreamReader, number: int, limit: int) -> tuple[bool, bytes]:
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                got, ok, payload = await _frame(reader, limit)
        except TimeoutError:
            raise SandboxError(f"the desktop helper did not reply within {CALL_TIMEOUT_S:g} s") from None
        except (asyncio.IncompleteReadError, ConnectionError):
            raise SandboxError("the desktop helper ended (its connection closed) before replying") from None
        if got != number:
            raise SandboxError(f"the desktop helper replied to request {got}, not {number}")
        return ok, payload


async def _frame(reader: asyncio.StreamReader, limit: int) -> tuple[int, bool, bytes]:
    magic, number, status, length = HEADER.unpack(await reader.readexactly(HEADER.size))
    if magic != MAGIC or status not in (0, 1):
        raise SandboxError("the desktop helper sent a malformed reply header")
    if length > limit:
        raise SandboxError(f"the desktop helper announced a {length}-byte reply (at most {limit})")
    return number, status == 0, await reader.readexactly(length)


def _text(payload: bytes) -> str:
    return payload[:300].decode("utf-8", "replace")


__all__ = ["CALL_TIMEOUT_S", "HelperChannel"]
