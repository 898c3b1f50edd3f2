"""MCP stdio servers started inside the rollout's sandbox (a server spec with ``"sandbox": true``).

The server is a long-running process of the sandbox (``rllm.sdk.sandbox.ProcessHost``; the local
bubblewrap sandbox is one): it sees the sandbox's files, not the host's, and runs under its limits
and namespaces. The host speaks MCP's stdio framing to it (one JSON-RPC message a line) through
this transport, and treats all it writes as hostile: a line longer than ``max_message_bytes``
(or that much without a newline), or a line that is not a JSON-RPC message, cuts the server off
at once (killed, the reason kept); its stderr is kept only as a bounded tail by the sandbox.

Whose failure it is follows rLLM's rule (docs/architecture.md, "Who caused a failure"): a server
that cannot be started (the sandbox cannot start processes, the process could not be spawned)
or that does not come up before the agent has acted is infrastructure (``SandboxError``,
retried); once the rollout runs, a server in the agent's own sandbox that floods, breaks the
protocol, stops answering or dies is the agent's outcome (``SandboxAgentError``: scored, the
reason recorded, never retried): the agent drives it and shares its files and limits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from mcp import types
from mcp.shared.message import SessionMessage

from rllm.sdk.sandbox import PipedProcess, ProcessHost, SandboxError, SandboxUnavailable, current_sandbox

READ_CHUNK = 65536


class Oversized(Exception):
    """A server's message past the bound (the reason is the message)."""


class LineFramer:
    """MCP's stdio framing (one message a line) over chunks read from an untrusted stream:
    ``feed`` returns the complete lines so far, and raises ``Oversized`` as soon as one line is
    longer than ``limit`` bytes, or more than that came without a newline (it never holds more)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        lines: list[bytes] = []
        while (end := self._buffer.find(b"\n")) >= 0:
            if end > self.limit:
                raise Oversized(f"sent a message of {end} bytes, over max_message_bytes={self.limit}")
            lines.append(bytes(self._buffer[:end]))
            del self._buffer[: end + 1]
        if len(self._buffer) > self.limit:
            raise Oversized(f"sent over max_message_bytes={self.limit} bytes without ending a message")
        return lines


class SandboxedServer:
    """The host's view of one server process in the sandbox: the process, and why it was cut off."""

    def __init__(self, name: str, max_message_bytes: int) -> None:
        self.name = name
        self.max_message_bytes = max_message_bytes
        self.process: PipedProcess | None = None
        self.cut_off: str | None = None  # why the host cut the server off, when it did

    def stderr_tail(self) -> str:
        return self.process.stderr_tail() if self.process is not None else ""

    def ended(self) -> str | None:
        """Why the server is gone, when it is: cut off by the host, or exited by itself."""
        if self.cut_off is not None:
            return self.cut_off
        if self.process is not None and self.process.returncode is not None:
            return f"exited with status {self.process.returncode}"
        return None


async def start(
    server: SandboxedServer, argv: list[str], env: dict[str, str], cwd: str | None
) -> PipedProcess:
    """The server's process started in the rollout's sandbox (a ``SandboxError`` when it cannot be)."""
    sandbox = current_sandbox()
    if not isinstance(sandbox, ProcessHost):
        raise SandboxUnavailable(
            f"MCP server {server.name!r} is to run inside the sandbox, but the {type(sandbox).__name__} "
            "cannot start a process with piped stdio (the local bubblewrap sandbox can)"
        )
    try:
        server.process = await sandbox.start_process(argv, env=env, cwd=cwd)
    except SandboxError:
        raise
    except Exception as exc:  # the host could not spawn it: nothing the agent did
        raise SandboxError(
            f"MCP server {server.name!r} could not be started in the sandbox: {type(exc).__name__}: {exc}"
        ) from exc
    return server.process


@contextlib.asynccontextmanager
async def sandbox_stdio(
    server: SandboxedServer, argv: list[str], env: dict[str, str], cwd: str | None
) -> AsyncIterator[tuple[Any, Any]]:
    """An MCP client transport (read stream, write stream) to ``argv`` run in the sandbox."""
    process = await start(server, argv, env, cwd)
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)

    async def cut(reason: str) -> None:
        server.cut_off = reason
        await process.close()

    async def read_messages() -> None:
        framer = LineFramer(server.max_message_bytes)
        async with read_send:
            while chunk := await process.stdout.read(READ_CHUNK):
                try:
                    lines = framer.feed(chunk)
                except Oversized as exc:
                    return await cut(str(exc))
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        message = types.JSONRPCMessage.model_validate_json(line)
                    except Exception:
                        return await cut(f"wrote a line that is not a JSON-RPC message: {line[:200]!r}")
                    await read_send.send(SessionMessage(message))

    async def write_messages() -> None:
        async with write_recv:
            async for session_message in write_recv:
                data = session_message.message.model_dump_json(by_alias=True, exclude_none=True)
                try:
                    process.stdin.write(data.encode() + b"\n")
                    await process.stdin.drain()
                except (ConnectionError, RuntimeError):  # the server is gone: the reader ends too
                    return

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(read_messages)
            group.start_soon(write_messages)
            try:
                yield read_recv, write_send
            finally:
                group.cancel_scope.cancel()
    finally:
        await asyncio.shield(process.close())
