"""The gateway bridge: a command harness inside a sandbox reaches its own session, and only it.

A sandbox has no network by default (its own network namespace, loopback only), so a harness in
it cannot reach the gateway. The bridge has two ends:

- **Inside** (``FORWARDER``, run with the sandbox's ``python3`` in the harness's own exec): a
  byte pump listening on ``127.0.0.1:BRIDGE_PORT`` in the sandbox's loopback that copies each
  connection to a unix socket bound into the sandbox read-only. It knows nothing of HTTP and
  is trusted with nothing: the harness may kill or replace it and reaches only that socket.
- **Outside** (:class:`SessionBridge`, in the engine): the unix socket's server. It treats all
  input as hostile: it parses one bounded HTTP/1.1 request per connection (head, header count,
  body size, read timeouts), accepts only ``GET``/``POST`` on ``/v1/...`` (and
  ``/roles/NAME/v1/...``), maps that path under the one session's URL it was made for, and
  sends the gateway a request it builds itself (its own Host, the session's token, a short
  list of content headers, ``Connection: close``), so no other session, the admin API or any
  other host can be named. Answers come back byte for byte (streams included), bounded in size
  and time; a connection cap bounds how many are open at once.

Why this design: a unix socket is a file, so bubblewrap binds it like any file and no network
namespace, NAT or veth needs setting up (a networked sandbox would reach much more than its
session); the in-sandbox end is a dumb pump, so every check lives on the host where the
sandbox cannot touch it; and the harness never sees the session's token (its
``OPENAI_API_KEY`` is a placeholder the bridge replaces).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import ssl
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

from rllm.sdk.sandbox import HarnessHookup, SandboxError

BRIDGE_PORT = 47611  # in the sandbox's own network namespace: nothing else listens there
PLACEHOLDER_KEY = "rllm-sandboxed"  # the harness's OPENAI_API_KEY; the bridge sends the real token
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# /v1[/segment...] or /roles/NAME/v1[/segment...], each segment of unreserved characters only
# (no %-escapes to decode, no "." or ".." segments, no empty ones), and an optional plain query.
_TARGET = re.compile(
    r"(?P<role>/roles/[A-Za-z0-9_\-]{1,64})?/v1(?P<rest>(?:/[A-Za-z0-9_.~\-]+)*/?)(?P<query>\?[A-Za-z0-9_.~=&\-]*)?"
)
_FORWARDED = ("content-type", "accept", "user-agent")  # everything else is dropped


class BridgeLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds on what a sandbox may send through the bridge and how long it may take."""

    max_head_bytes: int = 32 * 1024
    max_headers: int = 64
    max_body_bytes: int = 32 * 1024 * 1024
    max_response_bytes: int = 256 * 1024 * 1024
    head_timeout_s: float = 30.0  # to send the request head (a slow-loris client is cut off)
    body_timeout_s: float = 60.0
    response_idle_s: float = 900.0  # between two reads of the gateway's answer
    max_connections: int = 32


class BridgeRefused(SandboxError):
    """A request the bridge refused (the sandbox gets the HTTP status; the engine only counts it)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_REASONS = {400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed", 408: "Request Timeout",
            411: "Length Required", 413: "Content Too Large", 431: "Request Header Fields Too Large",
            502: "Bad Gateway", 503: "Service Unavailable"}  # fmt: skip


class SessionBridge:
    """The host end of one sandbox's bridge to the one session ``base_url`` (see the module)."""

    def __init__(self, base_url: str, api_key: str, limits: BridgeLimits | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.path.endswith("/v1"):
            raise SandboxError(
                f"the gateway bridge needs an http(s) session URL ending in /v1, got {base_url!r}"
            )
        self.base_url = base_url
        self.api_key = api_key
        self.limits = limits or BridgeLimits()
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._netloc = parts.netloc
        self._tls = parts.scheme == "https"
        self._session_path = parts.path[: -len("/v1")]  # /sessions/ID
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.Task[None]] = set()
        self.stats = {"requests": 0, "refused": 0}

    @property
    def open_connections(self) -> int:
        """How many sandbox connections are being served now."""
        return len(self._open)

    def upstream_path(self, target: str) -> str:
        """The gateway path a sandbox's request target maps to; BridgeRefused when it names
        anything but this session's OpenAI API."""
        match = _TARGET.fullmatch(target)
        if match is None:
            raise BridgeRefused(
                403,
                f"the sandbox reaches only its own session's OpenAI API under /v1/ (got {target[:200]!r})",
            )
        rest = match.group("rest")
        if any(seg in (".", "..") for seg in rest.split("/")):
            raise BridgeRefused(400, "'.' and '..' path segments are refused")
        return f"{self._session_path}{match.group('role') or ''}/v1{rest}{match.group('query') or ''}"

    async def start(self, path: Path, uid: int | None) -> None:
        """Listen on the unix socket ``path`` (owned by the sandbox's ``uid`` when it has one,
        mode 0600: only the sandbox may connect)."""
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(path), limit=self.limits.max_head_bytes
        )
        os.chmod(path, 0o600)
        if uid is not None:
            os.chown(path, uid, uid)

    async def close(self) -> None:
        """Stop listening and cut every connection still open."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._open):
            task.cancel()
        for task in list(self._open):
            with contextlib.suppress(BaseException):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            if len(self._open) >= self.limits.max_connections:
                raise BridgeRefused(503, f"more than {self.limits.max_connections} connections at once")
            self._open.add(task)
            self.stats["requests"] += 1
            await self._forward(reader, writer)
        except BridgeRefused as exc:
            self.stats["refused"] += 1
            with contextlib.suppress(OSError, RuntimeError, TimeoutError):
                writer.write(_error_answer(exc.status, str(exc)))
                await writer.drain()
                # Closing with the client's unread request in our buffer would reset the
                # connection before it reads the refusal: end our side, discard a bounded rest.
                writer.write_eof()
                async with asyncio.timeout(1.0):
                    for _ in range(16):
                        if not await reader.read(65536):
                            break
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the sandbox or the gateway went away or stalled: nothing more to say
        except asyncio.CancelledError:
            # Only close() cancels these (the server's own task per connection); ending quietly
            # keeps Python 3.11's stream callback from logging the cancellation as an error.
            pass
        finally:
            self._open.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lim = self.limits
        try:
            async with asyncio.timeout(lim.head_timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise BridgeRefused(431, f"the request head is over {lim.max_head_bytes} bytes") from None
        except TimeoutError:
            raise BridgeRefused(408, f"no complete request head within {lim.head_timeout_s:g} s") from None
        method, target, headers = parse_head(head, lim.max_headers)
        path = self.upstream_path(target)
        if "transfer-encoding" in headers:
            raise BridgeRefused(411, "chunked request bodies are refused: send Content-Length")
        length = content_length(headers.get("content-length"))
        if length > lim.max_body_bytes:
            raise BridgeRefused(413, f"the request body is over {lim.max_body_bytes} bytes")
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        lines = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self._netloc}",
            f"Authorization: Bearer {self.api_key}",
        ]
        lines += [f"{name.title()}: {headers[name]}" for name in _FORWARDED if name in headers]
        if length or method == "POST":
            lines.append(f"Content-Length: {length}")
        head_out = ("\r\n".join([*lines, "Connection: close"]) + "\r\n\r\n").encode("latin-1")
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(
                    self._host, self._port, ssl=ssl.create_default_context() if self._tls else None
                ),
                lim.body_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise BridgeRefused(502, f"the gateway is not reachable: {exc}") from None
        try:
            # The body is streamed through in slices, never held whole: 32 connections of
            # max_body_bytes each must not become the engine's memory. One cut short leaves the
            # gateway a truncated request, which it drops without calling the model.
            up_writer.write(head_out)
            left = length
            try:
                async with asyncio.timeout(lim.body_timeout_s):
                    while left:
                        chunk = await reader.read(min(left, 65536))
                        if not chunk:
                            return  # the sandbox hung up mid-body
                        left -= len(chunk)
                        up_writer.write(chunk)
                        await up_writer.drain()
            except TimeoutError:
                raise BridgeRefused(
                    408, f"the request body did not arrive within {lim.body_timeout_s:g} s"
                ) from None
            sent = 0
            while True:
                async with asyncio.timeout(lim.response_idle_s):
                    chunk = await up_reader.read(65536)
                if not chunk:
                    return
                sent += len(chunk)
                if sent > lim.max_response_bytes:
                    return  # cut: the sandbox sees a truncated answer, never an unbounded one
                writer.write(chunk)
                await writer.drain()
        finally:
            up_writer.close()
            with contextlib.suppress(Exception):
                await up_writer.wait_closed()


def parse_head(head: bytes, max_headers: int) -> tuple[str, str, dict[str, str]]:
    """``METHOD TARGET HTTP/1.x`` and its headers (lower-cased names; a repeated one refused).
    Refuses anything but a plain, well-formed GET or POST head."""
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BridgeRefused(400, "the request line is not 'METHOD TARGET HTTP/1.1'")
    if parts[0] not in (b"GET", b"POST"):
        raise BridgeRefused(405, "only GET and POST reach the session")
    if len(lines) - 1 > max_headers:
        raise BridgeRefused(431, f"more than {max_headers} headers")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name) or b"\n" in value or b"\r" in value or b"\0" in value:
            raise BridgeRefused(400, "a header line is malformed")
        key = name.decode("ascii").lower()
        if key in headers and key in ("content-length", "transfer-encoding", "host"):
            raise BridgeRefused(400, f"{key} is given twice")
        headers[key] = value.strip().decode("latin-1")
    try:
        target = parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise BridgeRefused(400, "the request target is not ASCII") from None
    return parts[0].decode(), target, headers


def content_length(value: str | None) -> int:
    """The body's length from its header (0 without one); refuses anything but plain digits."""
    if value is None:
        return 0
    if not value.isascii() or not value.isdigit() or len(value) > 12:
        raise BridgeRefused(400, "Content-Length is not a plain number")
    return int(value)


def _error_answer(status: int, message: str) -> bytes:
    body = json.dumps(
        {"error": {"message": f"rllm sandbox bridge: {message}", "type": "rllm_bridge"}}
    ).encode()
    return (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


# The in-sandbox end: listen, then fork so the harness starts only once the port is open (no
# polling), and pump bytes between each TCP connection and the bridge's unix socket. One
# thread (threads would count against the sandbox's process limit); stdio closed so it never
# holds the exec's output open.
FORWARDER = r"""
import os, selectors, socket, sys
port, target = int(sys.argv[1]), sys.argv[2]
try:
    srv = socket.create_server(("127.0.0.1", port), backlog=128)
except OSError as exc:
    sys.stderr.write("rllm-bridge: cannot listen on 127.0.0.1:%d: %s\n" % (port, exc))
    sys.exit(125)
if os.fork():
    os._exit(0)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
sel = selectors.DefaultSelector()
sel.register(srv, selectors.EVENT_READ, None)
def drop(a, b):
    for s in (a, b):
        try:
            sel.unregister(s)
        except (KeyError, ValueError):
            pass
        s.close()
while True:
    for key, _ in sel.select():
        if key.data is None:
            try:
                client, _ = srv.accept()
            except OSError:
                continue
            up = socket.socket(socket.AF_UNIX)
            try:
                up.connect(target)
            except OSError:
                client.close(); up.close(); continue
            sel.register(client, selectors.EVENT_READ, up)
            sel.register(up, selectors.EVENT_READ, client)
            continue
        src, dst = key.fileobj, key.data
        try:
            data = src.recv(65536)
            if data:
                dst.sendall(data)
                continue
        except OSError:
            pass
        drop(src, dst)
"""


def launch_line(script: str, socket_path: str) -> str:
    """The shell line, run first in the harness's exec, that starts the in-sandbox end and
    returns once it listens (exit 125 with a one-line reason when it cannot)."""
    return (
        "command -v python3 >/dev/null 2>&1 || "
        "{ echo 'rllm-bridge: the sandbox has no python3 for the gateway bridge' >&2; exit 125; }; "
        f"python3 -I -S {script} {BRIDGE_PORT} {socket_path} || exit 125"
    )


async def hook_up(
    ctl: Path, inside_ctl: str, uid: int | None, base_url: str, api_key: str, files: dict[str, bytes]
) -> tuple[SessionBridge, HarnessHookup]:
    """Start the bridge on a socket in the sandbox's control folder ``ctl`` (mounted read-only at
    ``inside_ctl``), place the forwarder and ``files`` there, and say how a harness uses them."""
    bridge = SessionBridge(base_url, api_key)
    await bridge.start(ctl / "bridge.sock", uid)
    (ctl / "bridge.py").write_text(FORWARDER)
    paths = {}
    for name, data in files.items():
        if not re.fullmatch(r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9]+)?", name):
            await bridge.close()
            raise SandboxError(f"harness file name {name!r} is not a plain file name")
        (ctl / f"harness-{name}").write_bytes(data)
        paths[name] = f"{inside_ctl}/harness-{name}"
    hookup = HarnessHookup(
        base_url=f"http://127.0.0.1:{BRIDGE_PORT}/v1",
        api_key=PLACEHOLDER_KEY,
        launch=launch_line(f"{inside_ctl}/bridge.py", f"{inside_ctl}/bridge.sock"),
        files=paths,
    )
    return bridge, hookup
