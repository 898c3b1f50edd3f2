"""Long-running processes inside a real bubblewrap sandbox with their stdio piped to the host
(``BubblewrapSandbox.start_process``, the SDK's ``ProcessHost``): what they write lands in the
sandbox, not on the host; a stderr flood neither blocks them nor grows the host's memory; the
sandbox's close kills them. Runs as root and in the non-root sandbox suite alike."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator

import pytest
from sandbox_helpers import needs_bwrap, within

from rllm.engine.sandbox import BubblewrapBackend, BubblewrapSandbox
from rllm.engine.sandbox.piped import STDERR_KEPT
from rllm.sdk.sandbox import ProcessHost, SandboxAgentError, SandboxError, SandboxSpec

pytestmark = [needs_bwrap, pytest.mark.timeout(120)]

# Echoes each line back and appends it to seen.txt in the workdir.
ECHO = 'while IFS= read -r line; do printf "%s\\n" "$line" >> seen.txt; printf "got %s\\n" "$line"; done'


@pytest.fixture
async def sandbox() -> AsyncIterator[BubblewrapSandbox]:
    sb = await BubblewrapBackend().create(SandboxSpec())
    try:
        yield sb
    finally:
        await sb.close()


async def test_a_piped_process_talks_over_stdio_and_writes_inside_the_sandbox(sandbox, tmp_path):
    assert isinstance(sandbox, ProcessHost)
    proc = await sandbox.start_process(["/bin/sh", "-c", ECHO], env={"GREETING": "hi"})
    async with within(60, "the echo round trips"):
        for word in ("one", "two"):
            proc.stdin.write(f"{word}\n".encode())
            await proc.stdin.drain()
            assert await proc.stdout.readline() == f"got {word}\n".encode()
    assert await sandbox.read_file("seen.txt") == b"one\ntwo\n"
    assert not (tmp_path / "seen.txt").exists()
    await proc.close()
    assert proc.returncode is not None
    await proc.close()  # idempotent


async def test_a_stderr_flood_is_drained_into_a_bounded_tail(sandbox):
    # 4 MiB on stderr before the answer: undrained, the 64 KiB pipe would block it forever.
    script = "head -c 4194304 /dev/zero | tr '\\0' x >&2; echo done; echo last-words >&2; read _"
    proc = await sandbox.start_process(["/bin/sh", "-c", script])
    async with within(60, "the answer after the flood"):
        assert await proc.stdout.readline() == b"done\n"
    proc.stdin.write(b"\n")
    await proc.stdin.drain()
    async with within(60, "the process's end"):
        assert await proc.wait() == 0
    await proc.close()  # waits for stderr's end
    tail = proc.stderr_tail()
    assert tail.endswith("last-words\n")
    assert len(tail) <= STDERR_KEPT


async def test_closing_the_sandbox_kills_its_piped_processes():
    sandbox = await BubblewrapBackend().create(SandboxSpec())
    proc = await sandbox.start_process(["/bin/sh", "-c", "echo up; exec sleep 100000"])
    # One whose stdout nobody reads: 1 MiB fills the pipe and the host's buffer, and it blocks.
    flooding = await sandbox.start_process(
        ["/bin/sh", "-c", "echo up; head -c 1048576 /dev/zero; exec sleep 100000"]
    )
    async with within(60, "the processes' start"):
        assert await proc.stdout.readline() == b"up\n"
        assert await flooding.stdout.readline() == b"up\n"
    assert proc.returncode is None
    async with within(60, "the sandbox's close"):
        await sandbox.close()
    async with within(30, "the processes' end after the close"):
        await proc.wait()
        await flooding.wait()
    with pytest.raises(SandboxError, match="closed"):
        await sandbox.start_process(["true"])


async def test_a_process_in_a_cwd_and_a_refused_empty_argv(sandbox):
    await sandbox.exec("mkdir -p sub")
    proc = await sandbox.start_process(["/bin/sh", "-c", "pwd"], cwd="sub")
    async with within(60, "pwd"):
        assert (await proc.stdout.readline()).strip() == f"{sandbox.spec.workdir}/sub".encode()
    await proc.close()
    with pytest.raises(SandboxError, match="non-empty argv"):
        await sandbox.start_process([])


# A unix-socket server: answers each connection with "inside", prints "ready" once listening,
# then (on a line from the host) swaps its socket's name for a link to the host's socket.
SOCKET_SERVER = r"""
import os, socket, sys, threading
srv = socket.socket(socket.AF_UNIX)
srv.bind("/tmp/.rllm-sockets/s")
srv.listen(8)
open("/tmp/.rllm-sockets/plain", "w").close()
os.symlink(sys.argv[1], "/tmp/.rllm-sockets/link")
def serve():
    while True:
        conn, _ = srv.accept()
        conn.sendall(b"inside\n")
        conn.close()
threading.Thread(target=serve, daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
os.rename("/tmp/.rllm-sockets/s", "/tmp/.rllm-sockets/old")
os.symlink(sys.argv[1], "/tmp/.rllm-sockets/s")
print("swapped", flush=True)
sys.stdin.readline()
"""

needs_python3 = pytest.mark.skipif(
    not os.path.exists("/usr/bin/python3"), reason="the sandbox's system has no /usr/bin/python3"
)


@needs_python3
async def test_the_host_reaches_a_sandboxed_socket_and_never_follows_what_the_sandbox_swaps_in(
    sandbox, tmp_path
):
    # A host socket the sandbox names in its links: connecting there would reach the host.
    host_socket = socket.socket(socket.AF_UNIX)
    host_socket.bind(str(tmp_path / "host.sock"))
    host_socket.listen(8)
    host_socket.setblocking(False)
    await sandbox.write_file("server.py", SOCKET_SERVER)
    proc = await sandbox.start_process(
        ["/usr/bin/python3", "server.py", str(tmp_path / "host.sock")], socket_dir="/tmp/.rllm-sockets"
    )
    async with within(60, "the socket server's start"):
        assert await proc.stdout.readline() == b"ready\n", proc.stderr_tail()
    path = proc.socket_path("s")

    async def hello() -> bytes:
        reader, writer = await asyncio.open_unix_connection(path)
        line = await reader.readline()
        writer.close()
        return line

    async with within(60, "the socket round trips"):
        assert await hello() == b"inside\n"
        proc.stdin.write(b"swap\n")
        await proc.stdin.drain()
        assert await proc.stdout.readline() == b"swapped\n"
        assert await hello() == b"inside\n"  # the inode opened before the swap, not the link
    # (O_PATH | O_NOFOLLOW opens a link itself, which is no socket.)
    for name, why in (
        ("s", "not a socket"),
        ("link", "not a socket"),
        ("plain", "not a socket"),
        ("none", "no socket"),
    ):
        with pytest.raises(SandboxAgentError, match=why):
            proc.socket_path(name)
    with pytest.raises(SandboxError, match="one path component"):
        proc.socket_path("../x")
    with pytest.raises(BlockingIOError):
        host_socket.accept()  # nothing reached the host's socket
    host_socket.close()
    await proc.close()
