"""Long-running processes inside a real bubblewrap sandbox with their stdio piped to the host
(``BubblewrapSandbox.start_process``, the SDK's ``ProcessHost``): what they write lands in the
sandbox, not on the host; a stderr flood neither blocks them nor grows the host's memory; the
sandbox's close kills them. Runs as root and in the non-root sandbox suite alike."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sandbox_helpers import needs_bwrap, within

from rllm.engine.sandbox import BubblewrapBackend, BubblewrapSandbox
from rllm.engine.sandbox.piped import STDERR_KEPT
from rllm.sdk.sandbox import ProcessHost, SandboxError, SandboxSpec

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
    async with within(60, "the process's start"):
        assert await proc.stdout.readline() == b"up\n"
    assert proc.returncode is None
    await sandbox.close()
    async with within(30, "the process's end after the close"):
        await proc.wait()
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
