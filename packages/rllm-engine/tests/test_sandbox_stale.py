"""Sandboxes left by a harness killed with SIGKILL are removed at the next backend start-up, and
nothing else is: not a live process's sandbox, not what a planted link points to."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sandbox_helpers import needs_bwrap

from rllm.engine.sandbox import BubblewrapBackend
from rllm.engine.sandbox.safe_delete import remove_tree
from rllm.engine.sandbox.stale import MARKER, is_dead, owner_token, pid_namespace
from rllm.sdk.sandbox import SandboxSpec

pytestmark = [needs_bwrap, pytest.mark.timeout(120)]

HOLDER = textwrap.dedent("""
    import asyncio, sys
    from rllm.engine.sandbox import BubblewrapBackend
    from rllm.sdk.sandbox import SandboxSpec

    async def main():
        sandbox = await BubblewrapBackend(base_dir=sys.argv[1]).create(SandboxSpec())
        assert (await sandbox.exec("echo kept > kept.txt")).ok
        cgroups = [str(p) for p in sandbox.cgroup.paths] if sandbox.cgroup else []
        print(sandbox.root, *cgroups, flush=True)
        await asyncio.Event().wait()  # held until killed

    asyncio.run(main())
""")


@pytest.fixture
def base_dir() -> Iterator[Path]:
    # As root, sandboxes run as other uids, which must be able to enter the folder.
    path = Path(tempfile.mkdtemp(prefix="rllm-stale-test-", dir="/tmp"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _mounted(path: Path) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


async def test_a_killed_harness_leaves_nothing_after_the_next_start(base_dir: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(base_dir)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    line = holder.stdout.readline().split()  # printed once the sandbox exists and has run
    assert line, f"the holder exited with {holder.wait()} before making its sandbox"
    root, cgroups = Path(line[0]), [Path(p) for p in line[1:]]
    holder.kill()  # SIGKILL: nothing of the holder's own cleanup runs
    holder.wait()
    assert (root / "work" / "kept.txt").exists()
    if os.geteuid() == 0:
        assert _mounted(root / "work"), "as root the workdir is a tmpfs: the test needs it mounted"

    # What must survive the sweep: a live process's sandbox (this one's), and a host folder
    # that a planted link named like a sandbox points to.
    host = base_dir.parent / f"{base_dir.name}-host"
    host.mkdir()
    (host / "precious").write_text("host data")
    (base_dir / "sb-planted").symlink_to(host)
    # ... and a dead owner's sandbox made in another PID namespace (a container sharing the
    # folder), where this process cannot tell whether the owner is dead.
    foreign = base_dir / "sb-foreign"
    foreign.mkdir()
    (foreign / MARKER).write_text(f"{line_token(root)} {int(pid_namespace()) + 1}")
    backend = BubblewrapBackend(base_dir=str(base_dir))
    live = await backend.create(SandboxSpec())
    try:
        await BubblewrapBackend(base_dir=str(base_dir)).check()  # a new start-up sweeps
        assert not root.exists(), "the killed harness's sandbox folder is still there"
        assert not _mounted(root / "work"), "its workdir tmpfs is still mounted"
        for cgroup in cgroups:
            assert not cgroup.exists(), f"its cgroup {cgroup} is still there"
        assert live.root.exists() and await live.is_alive()
        assert (await live.exec("echo fine")).stdout == "fine\n"
        assert (host / "precious").read_text() == "host data"
        assert (base_dir / "sb-planted").is_symlink()
        assert foreign.is_dir(), "a sandbox of another PID namespace was swept"
    finally:
        await live.close()
        shutil.rmtree(host, ignore_errors=True)


def line_token(root: Path) -> str:
    """The owner token of the marker in ``root`` (read before the sweep removes it)."""
    return (root / MARKER).read_text().split()[0]


def test_only_a_provably_dead_owner_is_dead() -> None:
    assert not is_dead(owner_token())  # this process
    pid, _, started = owner_token().partition("-")
    assert is_dead(f"{pid}-{int(started) + 1}")  # same pid, another start: the pid was reused
    child = subprocess.Popen(["true"])
    token = owner_token(child.pid)
    child.wait()
    assert is_dead(token)  # exited and reaped
    assert not is_dead("not-a-token") and not is_dead("123")  # nothing proven


# A chain of 10,000 folders, the way any command can make one (one mkdir and chdir per level),
# with what else an agent leaves: links to a host folder (never followed by the deletion), a
# folder it made unreadable and one it made read-only (a normal user's harness owns them).
DEEP = textwrap.dedent("""
    import os, sys
    os.makedirs("locked/in"); os.makedirs("readonly/in")
    open("locked/in/f", "w").close(); open("readonly/f", "w").close()
    os.chmod("locked", 0); os.chmod("readonly", 0o555)
    for level in range(10_000):
        os.mkdir("d"); os.chdir("d")
        if level % 2500 == 0:
            os.symlink(sys.argv[1], "host"); os.mkfifo("fifo")
    print("deep", flush=True)
""")

DEEP_HOLDER = textwrap.dedent("""
    import asyncio, sys
    from rllm.engine.sandbox import BubblewrapBackend
    from rllm.sdk.sandbox import SandboxSpec

    async def main():
        backend = BubblewrapBackend(base_dir=sys.argv[1])
        await backend.check()
        backend.disk_capped = False  # the workdir as a host folder: see the tests below
        sandbox = await backend.create(SandboxSpec())
        await sandbox.write_file("deep.py", sys.argv[3])
        made = await sandbox.exec(["python3", "deep.py", sys.argv[2]], timeout=300)
        assert made.stdout == "deep\\n", made
        print(sandbox.root, flush=True)
        await asyncio.Event().wait()  # held until killed

    asyncio.run(main())
""")


@pytest.fixture
def shm_base() -> Iterator[Path]:
    """A base folder on a tmpfs where there is one (deleting 10,000 folders from a disk with
    online discard takes minutes; what is tested is the walk, not the disk)."""
    parent = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else "/tmp"
    path = Path(tempfile.mkdtemp(prefix="rllm-deep-test-", dir=parent))
    path.chmod(0o711)
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


@pytest.fixture
def host_victim(tmp_path: Path) -> Path:
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "precious").write_text("host data")
    return folder


async def test_close_deletes_a_10000_deep_tree_without_following_its_links(
    shm_base: Path, host_victim: Path
) -> None:
    backend = BubblewrapBackend(base_dir=str(shm_base))
    await backend.check()
    # The workdir as a host folder (the mode of a normal user, or of root without mount rights):
    # the agent's tree is then on the host's file system, and close() deletes it there.
    backend.disk_capped = False
    sandbox = await backend.create(SandboxSpec())
    try:
        await sandbox.write_file("deep.py", DEEP)
        made = await sandbox.exec(["python3", "deep.py", str(host_victim)], timeout=300)
        assert made.stdout == "deep\n", made
    finally:
        await sandbox.close()
    assert not sandbox.root.exists()
    assert (host_victim / "precious").read_text() == "host data"


async def test_a_killed_harness_with_a_10000_deep_tree_does_not_stop_the_next_start(
    shm_base: Path, host_victim: Path
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", DEEP_HOLDER, str(shm_base), str(host_victim), DEEP],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    line = holder.stdout.readline().split()  # printed once the tree is made
    assert line, f"the holder exited with {holder.wait()} before making its tree"
    root = Path(line[0])
    holder.kill()
    holder.wait()
    assert root.exists()
    await BubblewrapBackend(base_dir=str(shm_base)).check()  # the sweep must not raise
    assert not root.exists(), "the killed harness's sandbox folder is still there"
    assert (host_victim / "precious").read_text() == "host data"


LEAF = st.sampled_from(["file", "link", "fifo", "folder", "locked"])
TREE = st.recursive(
    LEAF,
    lambda children: st.dictionaries(st.sampled_from("abcd"), children, min_size=1, max_size=4),
    max_leaves=25,
)


def _build(where: Path, shape: object, victim: Path) -> None:
    """Make ``shape`` at ``where``: a dict is a folder of its entries, a string one leaf."""
    if isinstance(shape, dict):
        where.mkdir()
        for name, sub in shape.items():
            _build(where / name, sub, victim)
    elif shape == "file":
        where.write_text("x")
    elif shape == "link":
        where.symlink_to(victim)  # a folder of the host's, which the deletion must not enter
    elif shape == "fifo":
        os.mkfifo(where)
    else:
        where.mkdir()
        if shape == "locked":  # made unreadable by its owner (matters to a normal user's harness)
            (where / "in").write_text("x")
            where.chmod(0)


@settings(max_examples=40, deadline=None)
@given(TREE)
def test_remove_tree_deletes_any_tree_and_nothing_a_link_points_to(
    tmp_path_factory: pytest.TempPathFactory, shape: object
) -> None:
    base = tmp_path_factory.mktemp("tree")
    victim = base / "victim"
    victim.mkdir()
    (victim / "precious").write_text("host data")
    root = base / "root"
    _build(root, shape, victim)
    assert remove_tree(root)
    assert not os.path.lexists(root)
    assert (victim / "precious").read_text() == "host data"
