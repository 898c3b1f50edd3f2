"""Sandbox uids (rllm.engine.sandbox.uids): two live sandboxes on one host never share one,
whichever harness processes made them; a closed sandbox's uid, or a killed harness's, is free
again. Real harness processes, real lock files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sandbox_helpers import needs_bwrap

from rllm.engine.sandbox.uids import UidLeases
from rllm.sdk.sandbox import SandboxUnavailable

pytestmark = [pytest.mark.timeout(120)]

# A harness holding three sandboxes: prints its pid, then each sandbox's uid as the harness
# sees it and as the sandbox's own command does, and keeps them until its stdin closes.
HARNESS = textwrap.dedent("""
    import asyncio, os, sys
    from rllm.engine.sandbox import BubblewrapBackend
    from rllm.sdk.sandbox import SandboxSpec

    async def main():
        backend = BubblewrapBackend()
        sandboxes = [await backend.create(SandboxSpec()) for _ in range(3)]
        seen = [f"{sb.uid}:{(await sb.exec('id -u')).stdout.strip()}" for sb in sandboxes]
        print(os.getpid(), *seen, flush=True)
        await asyncio.to_thread(sys.stdin.read)
        for sb in sandboxes:
            await sb.close()

    asyncio.run(main())
""")


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes have uids of their own only as root")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux's unshare is not installed")
def test_two_harnesses_at_once_never_share_a_uid_even_with_the_same_pid() -> None:
    # Each harness is pid 1 of a PID namespace of its own (as in two containers): equal pids,
    # which is what made their uids equal when uids came from the pid.
    harnesses = [
        subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", HARNESS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        lines = []
        for harness in harnesses:
            assert harness.stdout is not None
            line = harness.stdout.readline().split()  # printed while all three sandboxes live
            assert line, f"a harness exited with {harness.wait()} before making its sandboxes"
            lines.append(line)
        assert lines[0][0] == lines[1][0] == "1", lines  # the same pid
        uids = []
        for line in lines:
            for pair in line[1:]:
                held, inside = pair.split(":")
                assert held == inside, line  # each sandbox's command runs as its own uid
                uids.append(int(held))
        assert len(set(uids)) == 6, f"live sandboxes share uids: {lines}"
    finally:
        for harness in harnesses:
            assert harness.stdin is not None
            harness.stdin.close()
        for harness in harnesses:
            assert harness.wait(timeout=60) == 0


HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from rllm.engine.sandbox.uids import UidLeases
    leases = UidLeases(Path(sys.argv[1]), base=5000, span=4)
    print(*sorted(leases.take() for _ in range(4)), flush=True)
    sys.stdin.read()  # held until killed
""")


def test_a_uid_held_by_another_process_is_skipped_and_free_once_that_process_is_killed(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "uids"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().split() == ["5000", "5001", "5002", "5003"]
        mine = UidLeases(folder, base=5000, span=4)
        with pytest.raises(SandboxUnavailable, match="no free sandbox uid"):
            mine.take()  # every uid of the range is held by a live process
    finally:
        holder.kill()  # SIGKILL: nothing of its own cleanup runs; the kernel drops its locks
        holder.wait()
    assert sorted(os.listdir(folder)) == ["5000", "5001", "5002", "5003"]  # left, unlocked
    fresh = UidLeases(folder, base=5000, span=4)
    first = fresh.take()  # a process's first lease sweeps what dead holders left
    assert os.listdir(folder) == [str(first)]
    assert sorted([first, *(mine.take() for _ in range(3))]) == [5000, 5001, 5002, 5003]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.just(-1), st.integers(0, 7)), max_size=60))
def test_a_uid_is_never_leased_twice_while_held(
    tmp_path_factory: pytest.TempPathFactory, steps: list[int]
) -> None:
    # -1: take a uid; n: give back the n-th held one (if any). Two allocators share the folder,
    # as two harness processes do; the range is small, so it wraps again and again.
    folder = tmp_path_factory.mktemp("uids") / "leases"
    pair = (UidLeases(folder, base=100, span=6), UidLeases(folder, base=100, span=6))
    held: list[tuple[int, int]] = []  # (allocator, uid)
    for number, step in enumerate(steps):
        if step >= 0:
            if held:
                owner, uid = held.pop(step % len(held))
                pair[owner].give_back(uid)
            continue
        owner = number % 2
        if len(held) == 6:
            with pytest.raises(SandboxUnavailable):
                pair[owner].take()
            continue
        uid = pair[owner].take()
        assert uid not in {u for _, u in held}, (uid, held)
        assert 100 <= uid < 106
        held.append((owner, uid))
    assert sorted(pair[0].held | pair[1].held) == sorted(u for _, u in held)


def test_a_forked_child_does_not_give_back_its_parents_uids(tmp_path: Path) -> None:
    leases = UidLeases(tmp_path / "uids", base=7000, span=2)
    first = leases.take()
    child = os.fork()
    if child == 0:  # the child's copy knows no lease: giving one back changes nothing
        leases.give_back(first)
        os._exit(0 if not leases.held else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    other = UidLeases(tmp_path / "uids", base=7000, span=2)
    assert other.take() != first  # still the parent's
