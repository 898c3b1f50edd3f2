"""Shells parked in fresh cgroups (rllm.engine.sandbox.parked): tied to no event loop, and left
alone by a forked child (which, exiting normally, runs the parent's exit handlers)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from sandbox_helpers import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.timeout(120)]

PROGRAM = textwrap.dedent("""
    import asyncio, os, sys
    from rllm.engine.sandbox import BubblewrapBackend
    from rllm.sdk.sandbox import SandboxSpec

    backend = BubblewrapBackend()

    async def fill():
        await backend.check()
        if backend.lot is None:
            print("no cgroups:", backend.mode())
            sys.exit(0)
        backend.lot.fill()
        while backend.lot.ready < 2:
            await asyncio.sleep(0.01)

    asyncio.run(fill())
    parked = [p.popen.pid for p in backend.lot._ready]
    child = os.fork()
    if child == 0:
        sys.exit(0)  # a normal exit: the exit handlers inherited from the parent run here
    os.waitpid(child, 0)

    def alive(pid):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")

    print("alive", all(alive(pid) for pid in parked))

    async def use():  # another event loop than the one the shells were parked under
        sandbox = await backend.create(SandboxSpec())
        try:
            print((await sandbox.exec("echo ok")).stdout.strip(), "parked", sandbox.started_parked)
        finally:
            await sandbox.close()

    asyncio.run(use())
""")


def test_parked_shells_outlive_a_forked_childs_exit_and_serve_a_later_loop() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    if done.stdout.startswith("no cgroups:"):
        pytest.skip(done.stdout.strip())
    assert done.stdout.split("\n")[:2] == ["alive True", "ok parked True"], done
