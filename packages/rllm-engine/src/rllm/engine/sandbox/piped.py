"""A long-running process inside a local sandbox with its stdin and stdout piped to the host
(``BubblewrapSandbox.start_process``: an MCP stdio server, say).

It runs in a bwrap of its own over the sandbox's files, under the sandbox's command line (its
cgroup, uid, rlimits, namespaces), like an exec; unlike an exec it is not waited for: the host
writes its stdin and reads its stdout for as long as it needs, then closes it (or the sandbox's
close kills it with everything else). Its stderr is drained at once into a bounded tail, so a
process that writes without end never blocks on a full pipe nor grows the host's memory; its
stdout is the caller's to read in bounded pieces (the host treats it as hostile).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import stat
import tempfile
from collections import deque
from pathlib import Path

from rllm.engine.sandbox.bwrap_exec import BwrapExecs
from rllm.sdk.sandbox import SandboxAgentError, SandboxError

STDERR_KEPT = 8 * 1024  # bytes of a piped process's stderr kept (the last ones)


class SandboxProcess:
    """One piped process of a local sandbox (the SDK's ``PipedProcess``)."""

    def __init__(
        self, execs: BwrapExecs, proc: asyncio.subprocess.Process, socket_dir: Path | None = None
    ) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._execs, self._proc = execs, proc
        self._socket_dir = socket_dir
        self._socket_fds: list[int] = []  # O_PATH descriptors behind the socket paths handed out
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._drain = asyncio.ensure_future(self._drain_stderr(proc.stderr))

    @property
    def stdin(self) -> asyncio.StreamWriter:
        assert self._proc.stdin is not None
        return self._proc.stdin

    @property
    def stdout(self) -> asyncio.StreamReader:
        assert self._proc.stdout is not None
        return self._proc.stdout

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def stderr_tail(self) -> str:
        return b"".join(self._tail)[-STDERR_KEPT:].decode("utf-8", "replace")

    async def wait(self) -> int:
        return await self._proc.wait()

    def socket_path(self, name: str) -> str:
        """A path the host can connect to for the unix socket ``name`` the process made in its
        ``socket_dir``. The folder is the sandbox's to fill, so the entry is hostile: it is opened
        without following a link (``O_PATH | O_NOFOLLOW``, relative to the folder) and must be a
        socket; the path returned names that very inode (``/proc/self/fd/N``), so swapping the
        entry afterwards (for a link to a host socket, say) changes nothing. Valid until close."""
        if self._socket_dir is None:
            raise SandboxError("this process was started without a socket_dir")
        if not name or "/" in name or name in (".", ".."):
            raise SandboxError(f"a socket name is one path component, got {name!r}")
        folder = os.open(self._socket_dir, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=folder)
        except FileNotFoundError:
            raise SandboxAgentError(f"the sandboxed process made no socket {name!r}") from None
        except OSError as exc:
            raise SandboxAgentError(
                f"the sandboxed process's socket {name!r} cannot be opened: {exc}"
            ) from None
        finally:
            os.close(folder)
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.close(fd)
            raise SandboxAgentError(f"{name!r} in the sandboxed process's socket folder is not a socket")
        self._socket_fds.append(fd)
        return f"/proc/self/fd/{fd}"

    async def close(self) -> None:
        """Kill the process (its whole PID namespace) and wait for it; idempotent."""
        self._execs.forget(self._proc)
        if self._proc.stdin is not None:
            with contextlib.suppress(Exception):
                self._proc.stdin.close()
        # asyncio's wait() returns only once every pipe has closed, and a stdout nobody reads
        # any more (a reader that stopped at a flood) stays paused with data in it: what is left
        # is discarded (bounded: the writer is dead). RuntimeError: another coroutine is
        # reading it, which drains it itself.
        with contextlib.suppress(RuntimeError):
            while await self.stdout.read(65536):
                pass
        await self._proc.wait()
        while self._socket_fds:
            os.close(self._socket_fds.pop())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._drain), 10.0)

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self._tail.append(chunk)
            self._tail_bytes += len(chunk)
            while self._tail_bytes - len(self._tail[0]) >= STDERR_KEPT:
                self._tail_bytes -= len(self._tail.popleft())


async def start(
    execs: BwrapExecs,
    argv: list[str],
    env: dict[str, str],
    cwd: str | None,
    socket_dir: str | None = None,
    uid: int | None = None,
) -> SandboxProcess:
    """``argv`` started in a fresh bwrap of the sandbox whose bwraps ``execs`` runs (in ``cwd``,
    default the workdir), its stdio piped to the host. ``socket_dir``: a folder inside the
    sandbox, only this process's, where it may make unix sockets the host connects to (a fresh
    host folder of the sandbox's, ``uid``'s, bound there; see :meth:`SandboxProcess.socket_path`)."""
    if not argv:
        raise SandboxError("start_process needs a non-empty argv")
    extra, host_dir = [], None
    if socket_dir is not None:
        if (
            not socket_dir.startswith("/")
            or ".." in socket_dir.split("/")
            or socket_dir.rstrip("/") in ("", "/proc")
        ):
            raise SandboxError(f"socket_dir must be an absolute folder of its own, got {socket_dir!r}")
        host_dir = Path(tempfile.mkdtemp(prefix="sockets-", dir=execs.root))
        if uid is not None:
            os.chown(host_dir, uid, uid)
        extra = ["--bind", str(host_dir), socket_dir]
    command = f"exec {shlex.join(argv)}"
    if cwd is not None:
        command = f"cd {shlex.quote(cwd)} && {command}"
    proc = await execs.start_piped(command, env, extra)
    return SandboxProcess(execs, proc, host_dir)
