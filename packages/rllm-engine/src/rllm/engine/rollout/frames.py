"""Length-prefixed frames over a stream socket: how the ``processes`` executor's driver and its
flow processes talk (:mod:`rllm.engine.rollout.flow_processes`), and how a flow process started
early gets its engine arguments (:mod:`rllm.engine.rollout.early_flow_processes`).

A frame is a little-endian u32 length, then that many bytes (a msgpack job or Episode, or one
pickle). :class:`Frames` is the asyncio side (whole frames to a callback as they arrive, the
frames of one loop pass written together); :func:`read_frame` the blocking one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable

import msgspec

from rllm.engine.rollout.worker_pool import error_line
from rllm.types import to_msgpack

HEADER = struct.Struct("<I")
log = logging.getLogger(__name__)


class Ready(msgspec.Struct, array_like=True):
    """A flow process's first frame: its gateway's URL once its engine is up, or (``gateway_url``
    "") the one line of the error that stopped it starting."""

    gateway_url: str
    error: str = ""


def send_start_failure(sock: socket.socket, exc: BaseException) -> None:
    """Tell the driver (blocking, before any other frame) why this worker could not start: from
    the process itself (rllm.engine.rollout.flow_processes) or before it had its arguments
    (rllm.engine.rollout.early_flow_processes)."""
    payload = to_msgpack(Ready("", error_line(exc)))
    with contextlib.suppress(OSError):  # the driver is gone: nobody to tell
        sock.sendall(HEADER.pack(len(payload)) + payload)


class Frames(asyncio.Protocol):
    """Length-prefixed frames over a stream socket. Each whole frame goes to ``on_frame`` as it
    arrives (no coroutine per frame: the parent reads an Episode per rollout); ``on_lost`` runs
    once when the other side goes away. A frame ``on_frame`` cannot handle ends the connection."""

    def __init__(self, on_frame: Callable[[memoryview], None], on_lost: Callable[[], None]) -> None:
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._buf = bytearray()
        self._need = HEADER.size  # bytes the buffer must hold before a frame can be complete
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []  # frames sent during this loop pass, written together after it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._on_lost()

    def data_received(self, data: bytes) -> None:
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:
                return  # most of a large frame is still on its way: no re-parsing meanwhile
            data = bytes(self._buf)
            self._buf.clear()
        view, pos, end = memoryview(data), 0, len(data)
        try:
            while end - pos >= HEADER.size:
                (size,) = HEADER.unpack_from(data, pos)
                if end - pos - HEADER.size < size:
                    break
                pos += HEADER.size
                self._on_frame(view[pos : pos + size])
                pos += size
        except Exception:
            log.exception("bad frame from a rollout worker pipe; closing it")
            if self.transport is not None:
                self.transport.close()
            return
        self._buf += view[pos:]
        self._need = HEADER.size
        if end - pos >= HEADER.size:
            self._need += HEADER.unpack_from(data, pos)[0]

    def send(self, payload: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the other end of the rollout worker pipe is gone")
        if not self._out:
            # One write per loop pass, not per frame: each write to the pipe wakes the process at
            # the other end, and the parent sends a burst of jobs whenever a batch of rollouts ends.
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(HEADER.pack(len(payload)))
        self._out.append(payload)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out))


def read_frame(sock: socket.socket) -> bytes | None:
    """One frame from a blocking socket; None when the other end closed it first."""
    header = _recv_exact(sock, HEADER.size)
    if header is None:
        return None
    return _recv_exact(sock, HEADER.unpack(header)[0])


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(min(size - got, 1 << 20))
        if not chunk:
            return None  # the other end closed the socket
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
