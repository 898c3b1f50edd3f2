"""An MCP server for the adapter's example tasks and tests (the real ``mcp`` library's FastMCP).

``python -m rllm_adapter_mcp.examples.notes_server`` serves over stdio; ``--http PORT`` over
streamable HTTP on 127.0.0.1 (it prints ``ready http://127.0.0.1:PORT/mcp`` once listening).
Tools: ``lookup(key)`` (a word stored under a key), ``crash()`` (writes to stderr and exits: a
server dying mid-rollout, for tests).
"""

from __future__ import annotations

import os
import sys

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError

NOTES = {f"k{i}": word for i, word in enumerate(("apple", "river", "stone", "cloud", "tiger", "lemon"))}

server = FastMCP("notes")


@server.tool()
def lookup(key: str) -> str:
    """The word stored under ``key`` (k0 to k5)."""
    if key not in NOTES:
        raise ToolError(f"no note under {key!r}; keys: {', '.join(sorted(NOTES))}")
    return NOTES[key]


@server.tool()
def crash() -> str:
    """Ends the server at once (for tests of a server dying mid-rollout)."""
    print("notes server: crash() called, exiting", file=sys.stderr, flush=True)
    os._exit(3)


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "--http":
        import asyncio
        import socket

        import uvicorn

        # Bound and listening before "ready" is printed: a client connecting at once waits in the
        # backlog until uvicorn accepts, so nothing has to poll for the port.
        sock = socket.socket()
        sock.bind(("127.0.0.1", int(argv[1])))
        sock.listen(64)
        config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
        print(f"ready http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
        asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
        return
    server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
