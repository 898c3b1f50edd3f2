"""Per-sandbox cgroups for the local sandbox: memory, processes and CPU capped for the sandbox as
a whole (every process of every exec together), not per process.

Where they come from, checked once per backend:

- cgroup v2 (``memory.max``, ``memory.swap.max``, ``pids.max``, ``cpu.max``): under the cgroup
  this process runs in when it may enable the controllers there (the root cgroup, as root on a
  host), or under ``cgroup_parent``, a delegated v2 folder the operator names (no processes of
  its own; ``systemd-run --scope -p Delegate=yes`` makes one).
- cgroup v1 (``memory.limit_in_bytes`` (+ ``memory.memsw.limit_in_bytes``), ``pids.max``,
  ``cpu.cfs_quota_us``): one folder per hierarchy, under this process's own cgroup in each, so
  sandboxes stay inside whatever limits the harness itself runs under.
- neither writable (a normal user without delegation): the weaker mode, said once at start-up
  (``reason``): memory is capped per process (address space) only, processes per uid (as a
  normal user: per exec, counted in its user namespace).

One cgroup per sandbox, ``<base>/rllm-sandboxes/<pid>-<start time>-<n>-<PID namespace>``, removed
when it closes (the namespace keeps apart two harnesses of equal pid and start time, each pid 1 of
a container sharing the cgroup folder; each sweeps only names of its own namespace). Processes
join it before they exec anything (a wrapper shell writes its own pid, then execs bwrap), so
nothing a sandbox runs starts outside it.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from rllm.engine.sandbox import stale
from rllm.sdk.sandbox import SandboxLimits

_names = itertools.count()
_PERIOD_US = 100_000
CONTROLLERS = ("memory", "pids", "cpu")


@dataclass
class CgroupHost:
    """What this host lets the backend do: ``version`` is ``"v2"``, ``"v1"`` or ``"none"``;
    ``bases`` the folders sandbox cgroups are made in (one for v2, one per controller for v1)."""

    version: str
    bases: dict[str, Path] = field(default_factory=dict)
    reason: str = ""

    def create(self, limits: SandboxLimits) -> SandboxCgroup | None:
        """A new cgroup with ``limits``; None in the weaker mode."""
        cgroup = self.make()
        if cgroup is not None:
            try:
                cgroup.apply(limits)
            except BaseException:
                with contextlib.suppress(OSError):
                    cgroup.remove(timeout_s=0)
                raise
        return cgroup

    def make(self) -> SandboxCgroup | None:
        """A new cgroup without limits yet (None in the weaker mode): made ahead of use, it gets
        its limits from :meth:`SandboxCgroup.apply` when a sandbox takes it."""
        if self.version == "none":
            return None
        name = f"{stale.owner_token()}-{next(_names)}-{stale.pid_namespace()}"
        made: list[Path] = []
        try:
            for base in self.bases.values():
                path = base / name
                path.mkdir()
                made.append(path)
        except BaseException:
            for path in reversed(made):
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise
        return SandboxCgroup(made, self.version, tuple(self.bases))


@dataclass
class SandboxCgroup:
    """One sandbox's cgroup (one folder per v1 hierarchy, or one v2 folder)."""

    paths: list[Path]
    version: str = "v2"
    controllers: tuple[str, ...] = ()  # v1: the controller of each path

    def apply(self, limits: SandboxLimits) -> None:
        """Write ``limits`` (memory with no swap, processes, CPU)."""
        memory = limits.memory_mb * 1024 * 1024
        if self.version == "v2":
            path = self.paths[0]
            _write(path / "memory.max", memory)
            if (path / "memory.swap.max").exists():
                _write(path / "memory.swap.max", 0)
            _write(path / "pids.max", limits.max_procs + 2)
            _write(path / "cpu.max", f"{int(limits.cpus * _PERIOD_US)} {_PERIOD_US}")
            return
        for controller, path in zip(self.controllers, self.paths, strict=True):
            if controller == "memory":
                _write(path / "memory.limit_in_bytes", memory)
                if (path / "memory.memsw.limit_in_bytes").exists():
                    _write(path / "memory.memsw.limit_in_bytes", memory)
            elif controller == "pids":
                _write(path / "pids.max", limits.max_procs + 2)
            else:
                _write(path / "cpu.cfs_period_us", _PERIOD_US)
                _write(path / "cpu.cfs_quota_us", int(limits.cpus * _PERIOD_US))

    @property
    def procs_files(self) -> list[str]:
        """The files a process writes its pid to, to join."""
        return [str(path / "cgroup.procs") for path in self.paths]

    def remove(self, timeout_s: float = 5.0) -> None:
        """Remove the cgroup once its processes are gone (blocking: call off the event loop).
        A killed process leaves it a moment after its exit is seen, hence the retries."""
        deadline = time.monotonic() + timeout_s
        for path in self.paths:
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)


def _sweep(base: Path) -> None:
    """Remove sandbox cgroups left by processes that died without closing them (SIGKILL); an
    empty cgroup whose creator is gone has no one else to remove it. A name is
    ``<pid>-<start time>-<n>-<PID namespace>``: the creator is gone when no process of this
    namespace has that pid and start time (another namespace's names are left alone: their
    creators cannot be seen from here). Older names: ``<pid>-<start time>-<n>``, as if of this
    namespace; ``<pid>-<n>``, gone when the pid is."""
    deadline = time.monotonic() + 3.0
    namespace = stale.pid_namespace()
    with contextlib.suppress(OSError):
        for child in base.iterdir():
            parts = child.name.split("-")
            if len(parts) == 4:
                dead = bool(namespace) and parts[3] == namespace and stale.is_dead(f"{parts[0]}-{parts[1]}")
            elif len(parts) == 3:
                dead = stale.is_dead(f"{parts[0]}-{parts[1]}")
            else:
                dead = parts[0].isdigit() and not Path(f"/proc/{parts[0]}").exists()
            if dead and child.is_dir() and not child.is_symlink():
                # Its processes die with their owner (--die-with-parent), a moment after it.
                with contextlib.suppress(OSError):
                    SandboxCgroup([child]).remove(timeout_s=max(0.0, deadline - time.monotonic()))


def _write(path: Path, value: object) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, options) of every cgroup mount."""
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                found.append((parts[1], parts[2], set(parts[3].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under ``""`` its v2 path."""
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    return own


def detect(cgroup_parent: str | None = None) -> CgroupHost:
    """The cgroup support this process has (never raises: the weaker mode says why)."""
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError as exc:
        return CgroupHost("none", reason=f"cannot read this process's cgroups ({exc})")
    reasons = []
    v2 = _try_v2(mounts, own, cgroup_parent, reasons)
    if v2 is not None:
        return v2
    if cgroup_parent is not None:
        return CgroupHost("none", reason=f"cgroup_parent {cgroup_parent}: {'; '.join(reasons)}")
    v1 = _try_v1(mounts, own, reasons)
    if v1 is not None:
        return v1
    return CgroupHost("none", reason="; ".join(reasons) or "no cgroup filesystem is mounted")


def _try_v2(
    mounts: list[tuple[str, str, set[str]]], own: dict[str, str], parent: str | None, reasons: list[str]
) -> CgroupHost | None:
    unified = next((point for point, kind, _ in mounts if kind == "cgroup2"), None)
    if unified is None and parent is None:
        return None
    top = Path(parent) if parent is not None else Path(unified or "/") / own.get("", "/").lstrip("/")
    try:
        available = set((top / "cgroup.controllers").read_text().split())
    except OSError as exc:
        reasons.append(f"v2: cannot read {top / 'cgroup.controllers'} ({exc.strerror})")
        return None
    if not set(CONTROLLERS) <= available:
        reasons.append(
            f"v2: {top} offers the controllers {sorted(available) or 'none'}, not memory, pids, cpu"
        )
        return None
    base = top / "rllm-sandboxes"
    try:
        _enable(top)
        base.mkdir(exist_ok=True)
        _enable(base)
    except OSError as exc:
        why = (
            "it holds processes (v2 allows controllers only below cgroups without)"
            if exc.errno == errno.EBUSY
            else exc.strerror
        )
        reasons.append(f"v2: cannot enable memory, pids, cpu below {top}: {why}")
        return None
    _sweep(base)
    return CgroupHost("v2", {"all": base})


def _enable(path: Path) -> None:
    enabled = set((path / "cgroup.subtree_control").read_text().split())
    missing = [c for c in CONTROLLERS if c not in enabled]
    if missing:
        _write(path / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))


def _try_v1(
    mounts: list[tuple[str, str, set[str]]], own: dict[str, str], reasons: list[str]
) -> CgroupHost | None:
    bases: dict[str, Path] = {}
    for controller in CONTROLLERS:
        point = next((p for p, kind, opts in mounts if kind == "cgroup" and controller in opts), None)
        if point is None:
            reasons.append(f"v1: no {controller} hierarchy is mounted")
            return None
        base = Path(point) / own.get(controller, "/").lstrip("/") / "rllm-sandboxes"
        try:
            base.mkdir(exist_ok=True)
            probe = base / f"probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            probe.rmdir()
        except OSError as exc:
            reasons.append(f"v1: cannot create cgroups under {base.parent} ({exc.strerror})")
            return None
        bases[controller] = base
    for base in bases.values():
        _sweep(base)
    return CgroupHost("v1", bases)
