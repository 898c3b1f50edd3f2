"""Per-sandbox caps of the bubblewrap sandbox: memory across all of a sandbox's processes, and
every writable mount sized (the root and /dev read-only, /tmp, /dev/shm and the workdir capped).
Caps that need root or writable cgroups are skipped, naming why, where the backend runs in its
documented weaker mode."""

from __future__ import annotations

import textwrap

import pytest
from sandbox_helpers import needs_bwrap

from rllm.engine.sandbox import BubblewrapBackend
from rllm.sdk.sandbox import SandboxLimits, SandboxSpec
from rllm.testing import wait_until

pytestmark = [needs_bwrap, pytest.mark.timeout(180)]


@pytest.mark.parametrize("first_bwrap", ["parked", "joined"])
async def test_memory_is_capped_across_all_processes_of_a_sandbox(first_bwrap: str) -> None:
    backend = BubblewrapBackend()
    await backend.check()
    if backend.cgroups.version == "none" or backend.lot is None:
        pytest.skip(f"weaker mode, no per-sandbox memory cap here: {backend.cgroups.reason}")
    # Both ways a sandbox's first bwrap gets into its cgroup: exec'd by a shell parked there
    # ahead of time, or joining by itself (later execs always join by themselves).
    if first_bwrap == "parked":
        lot = backend.lot
        lot.fill()
        await wait_until(lambda: lot.ready > 0, 60, "a parked shell")
    else:
        backend.lot = None
    # Four processes of 100 MiB each, all held at once, against a 256 MiB sandbox: each is under
    # the per-process limit, so only a per-sandbox cap stops them.
    driver = textwrap.dedent("""
        import subprocess, sys
        hold = "import sys; b = b'x' * (100 * 2**20); print('held', flush=True); sys.stdin.read()"
        kids = [subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                for _ in range(4)]
        lines = [k.stdout.readline() for k in kids]
        for k in kids:
            k.stdin.close()
        # Only a child still alive when every line was read exits 0: these held at the same time.
        print(sum(1 for k, line in zip(kids, lines) if line == b"held\\n" and k.wait() == 0))
    """)
    sandbox = await backend.create(SandboxSpec(limits=SandboxLimits(memory_mb=256)))
    assert sandbox.started_parked == (first_bwrap == "parked")
    try:
        result = await sandbox.exec(["python3", "-c", driver], timeout=120)
        held = int(result.stdout.strip().splitlines()[-1])
        assert held <= 2, f"{held} x 100 MiB held at once in a 256 MiB sandbox"
        # Control: within the cap, memory is there.
        control = await sandbox.exec("python3 -c \"b = b'x' * (100 * 2**20); print('ok')\"")
        assert control.stdout == "ok\n", control
    finally:
        await sandbox.close()


async def test_every_writable_mount_is_sized() -> None:
    limits = SandboxLimits(tmp_mb=8, shm_mb=8, disk_mb=16, memory_mb=1024)
    sandbox = await BubblewrapBackend().create(SandboxSpec(limits=limits))
    try:
        for where in ("/", "/dev", "/usr", "/etc"):
            wrote = await sandbox.exec(f"echo x > {where.rstrip('/')}/probe && echo wrote")
            assert "wrote" not in wrote.stdout, f"{where} is writable"
        for where, cap_mb in (("/tmp", 8), ("/dev/shm", 8)):
            fill = await sandbox.exec(f"head -c {(cap_mb + 4) * 2**20} /dev/zero > {where}/fill; echo $?")
            assert fill.stdout.strip() != "0" and "No space left" in fill.stderr, (where, fill)
            small = await sandbox.exec(f"rm -f {where}/fill; echo x > {where}/small && cat {where}/small")
            assert small.stdout == "x\n", (where, small)  # control: it is writable, up to its cap
    finally:
        await sandbox.close()


async def test_the_workdir_has_a_disk_cap() -> None:
    backend = BubblewrapBackend()
    await backend.check()
    if not backend.disk_capped:
        pytest.skip("weaker mode: the workdir is an uncapped host folder (a sized tmpfs needs root)")
    sandbox = await backend.create(SandboxSpec(limits=SandboxLimits(disk_mb=16, memory_mb=1024)))
    try:
        # Many files, each far below file_size_mb: only a cap on the whole workdir stops them.
        fill = await sandbox.exec(
            "for i in $(seq 1 12); do head -c 2097152 /dev/zero > f$i || exit 7; done; echo filled"
        )
        assert fill.exit_code == 7 and "No space left" in fill.stderr, fill
        assert (await sandbox.exec("rm -f f*; echo ok > small && cat small")).stdout == "ok\n"
    finally:
        await sandbox.close()
