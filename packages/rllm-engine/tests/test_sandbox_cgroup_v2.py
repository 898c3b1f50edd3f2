"""The cgroup v2 path of the local sandbox, against a FAKE cgroup v2 filesystem: a plain folder
tree that imitates what the kernel does (a host with cgroup v2 controllers cannot be had here:
this one runs cgroup v1, its v2 mount has no controllers). Everything else is real: bwrap runs,
the parked shell and the join write their pids, setpriv drops to the sandbox's uid as root.

What the fake imitates (``FakeCgroup2``): ``mkdir`` of a cgroup creates its interface files, its
``cgroup.controllers`` being what its parent enabled in ``cgroup.subtree_control``; ``rmdir``
refuses (EBUSY) while a pid written to its ``cgroup.procs`` is alive and otherwise removes the
interface files with the folder. It does not enforce any limit.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import needs_bwrap

from rllm.engine.sandbox import BubblewrapBackend
from rllm.engine.sandbox.cgroups import detect
from rllm.sdk.sandbox import SandboxLimits, SandboxSpec

pytestmark = [needs_bwrap, pytest.mark.timeout(120)]

INTERFACE = ("cgroup.procs", "cgroup.subtree_control", "memory.max", "memory.swap.max", "pids.max", "cpu.max")


class FakeCgroup2:
    """A folder tree behaving (for mkdir, rmdir and the interface files) like a cgroup v2 mount."""

    def __init__(self, root: Path, controllers: str = "cpuset cpu io memory pids") -> None:
        self.root = root
        root.mkdir()
        for name in INTERFACE:
            (root / name).write_text("")
        (root / "cgroup.controllers").write_text(controllers + "\n")

    def owns(self, path: Path) -> bool:
        return path.is_relative_to(self.root) and path != self.root

    def made(self, path: Path) -> None:
        """What the kernel puts in a new cgroup."""
        enabled = (path.parent / "cgroup.subtree_control").read_text().split()
        (path / "cgroup.controllers").write_text(" ".join(c.lstrip("+") for c in enabled) + "\n")
        for name in INTERFACE:
            (path / name).write_text("max\n" if name.endswith(".max") else "")

    def remove(self, path: Path) -> None:
        if any(child.is_dir() for child in path.iterdir()):
            raise OSError(errno.EBUSY, "has child cgroups", str(path))
        for pid in (path / "cgroup.procs").read_text().split():
            if _alive(int(pid)):
                raise OSError(errno.EBUSY, f"process {pid} is still in it", str(path))
        for child in path.iterdir():
            child.unlink()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCgroup2]:
    tmp_path.chmod(0o755)  # as root, the sandbox's uid must reach its folders below
    fs = FakeCgroup2(tmp_path / "cgroup2")
    real_mkdir, real_rmdir = Path.mkdir, Path.rmdir

    def mkdir(self: Path, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
        existed = self.exists()
        real_mkdir(self, mode, parents, exist_ok)
        if fs.owns(self) and not existed:
            fs.made(self)

    def rmdir(self: Path) -> None:
        if fs.owns(self) and self.is_dir():
            fs.remove(self)
        real_rmdir(self)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(Path, "rmdir", rmdir)
    yield fs


async def test_v2_caps_are_written_and_removed_with_the_sandbox(fake: FakeCgroup2) -> None:
    backend = BubblewrapBackend(cgroup_parent=str(fake.root))
    await backend.check()
    assert backend.cgroups.version == "v2", backend.cgroups.reason
    assert "cgroup v2" in backend.mode()
    base = fake.root / "rllm-sandboxes"
    # Controllers enabled for the sandboxes' parent folder and for each sandbox below it.
    assert set((fake.root / "cgroup.subtree_control").read_text().split()) >= {"+memory", "+pids", "+cpu"}
    assert set((base / "cgroup.subtree_control").read_text().split()) >= {"+memory", "+pids", "+cpu"}
    limits = SandboxLimits(memory_mb=256, max_procs=20, cpus=0.5)
    try:
        for _ in range(3):  # the first may join on its own, later ones come from parked shells
            sandbox = await backend.create(SandboxSpec(limits=limits))
            try:
                assert sandbox.cgroup is not None
                (path,) = sandbox.cgroup.paths
                assert path.parent == base
                assert (path / "memory.max").read_text() == str(256 * 1024 * 1024)
                assert (path / "memory.swap.max").read_text() == "0"
                assert (path / "pids.max").read_text() == "22"  # max_procs + bwrap's two
                assert (path / "cpu.max").read_text() == "50000 100000"
                result = await sandbox.exec("id -u; echo ok")
                assert result.stdout.split()[-1] == "ok", result
                if os.geteuid() == 0:  # joined as root, then dropped to the sandbox's own uid
                    assert result.stdout.split()[0] == str(sandbox.uid)
                assert (path / "cgroup.procs").read_text().strip(), "no process joined the cgroup"
                again = await sandbox.exec("id -u")  # a bwrap that joined by itself (not parked)
                assert again.ok and again.stdout == result.stdout.split()[0] + "\n", again
            finally:
                await sandbox.close()
            assert not path.exists(), "the sandbox's cgroup was not removed at close"
    finally:
        if backend.lot is not None:
            backend.lot.close()  # parked shells' cgroups, removed while the fake is in place
    assert [p.name for p in base.iterdir() if p.is_dir()] == []


def test_v2_without_the_controllers_is_the_weaker_mode_saying_why(fake: FakeCgroup2) -> None:
    (fake.root / "cgroup.controllers").write_text("cpu io\n")
    host = detect(str(fake.root))
    assert host.version == "none"
    assert "offers the controllers ['cpu', 'io'], not memory, pids, cpu" in host.reason
