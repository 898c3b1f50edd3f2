"""MCP servers a task declares, connected for one rollout, their tools as an ``rllm.sdk.tool_loop``
``Toolbox``.

A task lists its servers in ``metadata["mcp_servers"]``: each ``{"name", "command": [argv...],
"env", "cwd"}`` (stdio: started for the rollout, its process tree ended with it; ``"{python}"`` in
the argv is this interpreter; with ``"sandbox": true`` started inside the rollout's sandbox
instead, :mod:`rllm_adapter_mcp.sandboxed`) or ``{"name", "url"}`` (streamable HTTP: a server
already running).
Their tools are offered to the model as native tool calls under their own names (two servers
offering one name is refused); a call runs ``tools/call`` on the server that offers it.

What goes wrong is classified as the rest of rLLM does: a tool result flagged ``isError`` is the
model's to read (a ``ToolError``); a server that fails to start, stops answering or dies
mid-rollout is an ``InfraError`` naming the server, with the tail of its stderr (stdio) —
retried as infrastructure, never scored as the agent's mistake. A server inside the agent's own
sandbox is the exception once the rollout runs: what it does then is the agent's outcome
(``SandboxAgentError``, scored), see :mod:`rllm_adapter_mcp.sandboxed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import timedelta
from typing import IO, Any, TextIO, cast

import msgspec

from rllm.sdk import InfraError
from rllm.sdk.sandbox import SandboxAgentError, SandboxError
from rllm.sdk.tool_loop import Toolbox, ToolError
from rllm.types.errors import InputError
from rllm_adapter_mcp.sandboxed import SandboxedServer, sandbox_stdio

STDERR_TAIL = 2000  # characters of a server's stderr quoted in an error
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # the longest message a sandboxed server may send


class McpServerSpec(msgspec.Struct, forbid_unknown_fields=True):
    """One MCP server of a task: ``command`` (stdio) or ``url`` (streamable HTTP), not both.
    ``sandbox``: start the command inside the rollout's sandbox (the flow must have one), whose
    messages are bounded by ``max_message_bytes``."""

    name: str
    command: list[str] | None = None
    url: str | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    startup_timeout_s: float = 30.0
    call_timeout_s: float = 60.0
    sandbox: bool = False
    max_message_bytes: int = MAX_MESSAGE_BYTES

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise InputError(f"MCP server {self.name!r} needs exactly one of command (stdio) or url (HTTP)")
        if self.command is not None and not self.command:
            raise InputError(f"MCP server {self.name!r} has an empty command")
        if self.sandbox and self.url is not None:
            raise InputError(
                f"MCP server {self.name!r}: a server inside the sandbox is started by rLLM, so it needs a "
                "command, not a url"
            )
        if self.max_message_bytes < 1024:
            raise InputError(f"MCP server {self.name!r}: max_message_bytes must be >= 1024")


def server_specs(metadata: dict[str, Any]) -> list[McpServerSpec]:
    """The servers a task's metadata declares, checked (an InputError names the bad entry)."""
    raw = metadata.get("mcp_servers")
    if not isinstance(raw, list) or not raw:
        raise InputError("an MCP task declares its servers in metadata.mcp_servers (a non-empty list)")
    try:
        specs = [msgspec.convert(entry, McpServerSpec) for entry in raw]
    except msgspec.ValidationError as exc:
        raise InputError(f"metadata.mcp_servers: {exc}") from None
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise InputError(f"metadata.mcp_servers names a server twice: {names}")
    return specs


class McpConnection:
    """A live session with one server, and (stdio) the file its stderr goes to, or (in the
    sandbox) the host's view of its process."""

    def __init__(
        self, spec: McpServerSpec, session: Any, stderr: IO[str] | None, inside: SandboxedServer | None = None
    ) -> None:
        self.spec = spec
        self.session = session
        self.stderr = stderr
        self.inside = inside

    def stderr_tail(self) -> str:
        if self.inside is not None:
            return self.inside.stderr_tail()[-STDERR_TAIL:]
        if self.stderr is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            self.stderr.flush()
            self.stderr.seek(0)
            return self.stderr.read()[-STDERR_TAIL:]
        return ""

    def failure(self, what: str, exc: BaseException, started: bool = False) -> InfraError:
        """The error for ``exc`` during ``what``. ``started``: the rollout runs (the agent has
        acted), which makes a sandboxed server's failure the agent's."""
        tail = self.stderr_tail().strip()
        where = f"; its stderr ends: {tail!r}" if tail else ""
        if self.inside is None:
            return InfraError(f"MCP server {self.spec.name!r} {what}: {type(exc).__name__}: {exc}{where}")
        if isinstance(exc, SandboxError):  # the sandbox said whose it is
            return exc
        ended = self.inside.ended()
        why = f"{type(exc).__name__}: {exc}" + (f" (the server {ended})" if ended else "")
        message = f"MCP server {self.spec.name!r} in the sandbox {what}: {why}{where}"
        return SandboxAgentError(message) if started else SandboxError(message)

    async def call(self, tool: str, arguments: dict[str, Any]) -> str:
        try:
            # asyncio.timeout, not wait_for: anyio's cancel scopes must stay in this task.
            async with asyncio.timeout(self.spec.call_timeout_s + 5.0):
                result = await self.session.call_tool(
                    tool, arguments, read_timeout_seconds=timedelta(seconds=self.spec.call_timeout_s)
                )
        except Exception as exc:  # closed streams, a timeout, a dead process: the server's, not the model's
            raise self.failure(f"failed during tools/call {tool}", exc, started=True) from exc
        text = "\n".join(getattr(block, "text", None) or str(block) for block in result.content)
        if result.isError:
            raise ToolError(text or f"{tool} failed")
        return text


def _transport(spec: McpServerSpec, stderr: IO[str] | None, inside: SandboxedServer | None) -> Any:
    if spec.command is not None:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        argv = [sys.executable if part == "{python}" else part for part in spec.command]
        if inside is not None:
            return sandbox_stdio(inside, argv, spec.env or {}, spec.cwd)
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=spec.env, cwd=spec.cwd)
        return stdio_client(params, errlog=cast(TextIO, stderr) if stderr is not None else sys.stderr)
    from mcp.client import streamable_http

    assert spec.url is not None
    if hasattr(streamable_http, "streamable_http_client"):  # mcp >= 1.24's name; the old one is deprecated
        return streamable_http.streamable_http_client(spec.url)
    return streamable_http.streamablehttp_client(spec.url, timeout=spec.startup_timeout_s)


@contextlib.asynccontextmanager
async def connect(spec: McpServerSpec) -> AsyncIterator[McpConnection]:
    """A session with ``spec``'s server for the block; a server that does not come up within its
    ``startup_timeout_s`` (or exits) is an InfraError with its stderr tail."""
    from mcp import ClientSession

    with contextlib.ExitStack() as files:
        inside = SandboxedServer(spec.name, spec.max_message_bytes) if spec.sandbox else None
        stderr = (
            files.enter_context(tempfile.TemporaryFile(mode="w+", encoding="utf-8"))
            if spec.command and inside is None
            else None
        )
        probe = McpConnection(spec, None, stderr, inside)
        started = False

        def while_starting(exc: BaseException) -> BaseException | None:
            # A server that dies during start-up can end it two ways, by timing: initialize()
            # fails (caught below), or the transport's task group cancels it and leaves only the
            # reader's error (a closed stream) in the group. Either way the agent had not acted.
            return None if started else probe.failure("failed to start", exc)

        async with _unwrapped(while_starting), contextlib.AsyncExitStack() as stack:
            try:
                # The transport's and session's anyio task groups are entered and left in this
                # task (asyncio.timeout, not wait_for, which would run them in another).
                async with asyncio.timeout(spec.startup_timeout_s):
                    streams = await stack.enter_async_context(_transport(spec, stderr, inside))
                    session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                    await session.initialize()
            except Exception as exc:
                raise probe.failure("failed to start", exc) from exc
            started = True
            yield McpConnection(spec, session, stderr, inside)


@contextlib.asynccontextmanager
async def _unwrapped(
    recast: Callable[[BaseException], BaseException | None] = lambda exc: None,
) -> AsyncIterator[None]:
    """The one error that matters out of the exception group mcp's anyio task groups raise on the
    way out: our InfraError if there is one, else the first other error itself (the rollout's own,
    classified as it would be without MCP: a bug stays the agent's) — or what ``recast`` makes of
    it (the connection's start-up: the server's failure)."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        infra = next((e for e in leaves if isinstance(e, InfraError)), None)
        if infra is not None:
            raise infra from None
        other = next((e for e in leaves if not isinstance(e, asyncio.CancelledError)), None)
        if other is None:
            raise
        recast_as = recast(other)
        if recast_as is not None:
            raise recast_as from other
        raise other from None
    except InfraError:
        raise
    except Exception as exc:  # one error, not grouped: the same rule
        recast_as = recast(exc)
        if recast_as is None:
            raise
        raise recast_as from exc


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


@contextlib.asynccontextmanager
async def mcp_toolbox(specs: Sequence[McpServerSpec]) -> AsyncIterator[Toolbox]:
    """Every server of ``specs`` connected, their tools in one Toolbox, for the block."""
    async with contextlib.AsyncExitStack() as stack:
        schemas: list[dict[str, Any]] = []
        handlers: dict[str, Any] = {}
        owners: dict[str, str] = {}
        for spec in specs:
            connection = await stack.enter_async_context(connect(spec))
            try:
                async with asyncio.timeout(spec.startup_timeout_s):
                    listed = await connection.session.list_tools()
            except Exception as exc:
                raise connection.failure("failed to list its tools", exc) from exc
            for tool in listed.tools:
                if tool.name in owners:
                    raise InputError(
                        f"MCP servers {owners[tool.name]!r} and {spec.name!r} both offer a tool {tool.name!r}"
                    )
                owners[tool.name] = spec.name
                schemas.append(
                    {
                        "type": "function",
                        "function": {
                            "name": tool.name,
                            "description": tool.description or "",
                            "parameters": tool.inputSchema or {"type": "object", "properties": {}},
                        },
                    }
                )
                handlers[tool.name] = _handler(connection, tool.name)
        yield Toolbox(schemas, handlers)


def _handler(connection: McpConnection, tool: str) -> Any:
    async def handle(arguments: dict[str, Any]) -> str:
        return await connection.call(tool, arguments)

    return handle
