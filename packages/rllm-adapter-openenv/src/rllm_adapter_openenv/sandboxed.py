"""An OpenEnv environment served inside the rollout's sandbox (option ``sandbox``).

For each rollout the environment's app runs in the rollout's sandbox (``python -m
rllm_adapter_openenv.serving APP --uds SOCKET``: this interpreter, which the sandbox must see,
e.g. through the local backend's ``ro_binds``): its code sees the sandbox's files, not the
host's, and runs under the sandbox's limits. The host reaches it over a unix socket in a folder
the host made for that one process and bound into its bwrap only (``ProcessHost.start_process``
with a ``socket_dir``), never over a network: the sandbox has none by default, and a networked
one has its own namespace, which the host does not share. The socket is the sandbox's to make,
so the host connects to the inode it checked (a socket, no link followed), never to a name.

Whose failure: the server not coming up (the process could not be started, it exits or stays
silent before its ``ready`` line, its schema cannot be read) is infrastructure (``SandboxError``,
retried: the agent has not acted yet). Once the episode runs, the server lives in the agent's
own sandbox, so a server that stops answering, floods or dies is the agent's outcome
(``SandboxAgentError``, scored, the reason recorded; ``rllm_adapter_openenv.client``).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

from rllm.sdk.sandbox import (
    PipedProcess,
    ProcessHost,
    SandboxError,
    SandboxUnavailable,
    current_sandbox,
)
from rllm_adapter_openenv.environments import EnvAddress, schema_fields

SOCKET_DIR = "/tmp/.rllm-openenv"  # inside the sandbox: the server's socket folder (only its own)
SOCKET = "env.sock"
START_TIMEOUT_S = 180.0  # openenv-core's first import (gradio) takes seconds, more on a busy host
SCHEMA_MAX_BYTES = 1024 * 1024  # the most of a /schema answer the host reads
READY_MAX_BYTES = 4096


@contextlib.asynccontextmanager
async def served_in_sandbox(address: EnvAddress) -> AsyncIterator[tuple[EnvAddress, str]]:
    """``address``'s app served in the rollout's sandbox for the block: the address with its
    action schema, and the host path of the server's socket."""
    assert address.app is not None
    sandbox = current_sandbox()
    if not isinstance(sandbox, ProcessHost):
        raise SandboxUnavailable(
            f"the {type(sandbox).__name__} cannot start a server process for the OpenEnv environment "
            "(the local bubblewrap sandbox can)"
        )
    argv = [
        sys.executable,
        "-m",
        "rllm_adapter_openenv.serving",
        address.app,
        "--uds",
        f"{SOCKET_DIR}/{SOCKET}",
    ]
    try:
        process = await sandbox.start_process(argv, socket_dir=SOCKET_DIR)
    except SandboxError:
        raise
    except Exception as exc:
        raise SandboxError(f"the OpenEnv server could not be started in the sandbox: {exc}") from exc
    try:
        path = await _ready(process, address)
        schema = await asyncio.to_thread(_schema, path)
        yield schema_fields(address, schema, f"the sandbox's {address.app}"), path
    finally:
        await asyncio.shield(process.close())


async def _ready(process: PipedProcess, address: EnvAddress) -> str:
    """The server's socket path once it prints ``ready`` (its first line, bounded in size and time)."""
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            line = await process.stdout.readline()
    except TimeoutError:
        line, why = b"", f"printed no ready line within {START_TIMEOUT_S:g} s"
    except ValueError:  # a line over the reader's limit
        line, why = b"", "printed an endless first line"
    else:
        why = f"exited before it was ready (status {process.returncode})" if not line else ""
    text = line[:READY_MAX_BYTES].decode("utf-8", "replace").strip()
    if not why and text != f"ready unix:{SOCKET_DIR}/{SOCKET}":
        why = f"printed {text[:200]!r}, not its ready line"
    if why:
        tail = process.stderr_tail().strip()[-1500:]
        raise SandboxError(
            f"the OpenEnv server of {address.app} in the sandbox {why}"
            + (f"; its stderr ends: {tail!r}" if tail else "")
        )
    return process.socket_path(SOCKET)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def _schema(path: str) -> Any:
    """The server's ``GET /schema`` over its socket (bounded; an error is infrastructure: the
    agent has not acted yet)."""
    connection = _UnixHTTPConnection(path, timeout=30.0)
    try:
        connection.request("GET", "/schema")
        response = connection.getresponse()
        body = response.read(SCHEMA_MAX_BYTES + 1)
        if response.status != 200 or len(body) > SCHEMA_MAX_BYTES:
            raise SandboxError(
                f"the OpenEnv server in the sandbox answered GET /schema with HTTP {response.status}"
                f" and {len(body)} bytes (at most {SCHEMA_MAX_BYTES})"
            )
        return json.loads(body)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise SandboxError(
            f"the OpenEnv server in the sandbox failed GET /schema: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        connection.close()
