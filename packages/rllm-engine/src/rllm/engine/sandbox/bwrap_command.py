"""The command line a local sandbox's commands run under (:mod:`rllm.engine.sandbox.bubblewrap`).

From the outside in: a shell that joins the sandbox's cgroup before anything else runs (when it
has one), ``setpriv`` dropping to the sandbox's uid (root, cgroup v2), ``prlimit`` (CPU seconds,
address space, file size, processes, open files, no core dumps: they bind bwrap and everything
under it), then ``bwrap`` with the sandbox's mounts, namespaces and environment. A parked shell
(:mod:`rllm.engine.sandbox.parked`), already in a fresh cgroup, execs only what comes after the
join (:attr:`BwrapCommand.launch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from rllm.engine.sandbox import desktop
from rllm.engine.sandbox.cgroups import SandboxCgroup
from rllm.sdk.sandbox import SandboxSpec

CTL = "/.rllm"  # the sandbox's read-only view of its control folder (exec scripts)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
# Joins the cgroups named before "--" (its own pid, before anything else runs), then execs the rest.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


class UserOptions(TypedDict, total=False):
    """The create_subprocess_exec keywords that run a process as another user."""

    user: int
    group: int
    extra_groups: list[int]


@dataclass(frozen=True)
class BwrapCommand:
    """How one sandbox starts a bwrap. ``argv``: the whole command line of a fresh one (before the
    bwrap's own ``/bin/sh -c`` script); ``launch``: the part a parked shell execs, already in the
    cgroup; ``user``: the keywords that start ``argv`` as the sandbox's uid (empty when the
    command drops to it itself); ``inner_nproc``: the process limit set inside each exec's user
    namespace (a normal user on Linux >= 5.14), None when prlimit sets it around bwrap."""

    argv: list[str]
    launch: list[str]
    user: UserOptions
    inner_nproc: int | None


def sandbox_command(
    bwrap: str,
    ro_binds: tuple[str, ...],
    cgroups_version: str,
    spec: SandboxSpec,
    root: Path,
    uid: int | None,
    cgroup: SandboxCgroup | None,
) -> BwrapCommand:
    """The command of the sandbox of ``spec`` whose host folder is ``root``, run as ``uid`` (None:
    this process's user) in ``cgroup`` (None: no cgroups here)."""
    # RLIMIT_NPROC counts a uid's processes. As root, the sandbox's own uid: bwrap's two
    # processes count too. As a normal user, every process of that user would count, and
    # they come and go (zombies of earlier sandboxes wait for the host's init to reap them),
    # so a limit around bwrap could not be exact. Since Linux 5.14 the count is also kept per
    # user namespace: the limit is set inside the exec's namespace (the command and bwrap's
    # init there), where only that exec's processes count.
    inner_nproc: int | None = None
    if uid is not None:
        nproc: int | None = spec.limits.max_procs + 2
    elif _nproc_per_userns():
        nproc, inner_nproc = None, spec.limits.max_procs + 1
    else:
        nproc = spec.limits.max_procs + 2 + _processes_of(os.geteuid())
    argv = bwrap_argv(bwrap, ro_binds, spec, root, nproc)
    launch, user = argv, as_user(uid)
    if cgroup is not None:
        # A shell joins the cgroup before anything else runs, then execs bwrap. cgroup v1 lets
        # a process move itself when it may write cgroup.procs, so it runs as the sandbox's
        # uid from the start; v2 asks for write access to the common ancestor, so there the
        # shell runs as root and setpriv drops to the uid (one exec more, ~1-5 ms).
        join = ["/bin/sh", "-c", _JOIN, "rllm-join", *cgroup.procs_files, "--"]
        if uid is not None and cgroups_version == "v1":
            for procs in cgroup.procs_files:
                os.chown(procs, uid, uid)
            argv = [*join, *argv]
        elif uid is not None:
            drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
            argv = [*join, *drop, *argv]
            launch = [*drop, *launch]
            user = UserOptions()
        else:
            argv = [*join, *argv]
    return BwrapCommand(argv=argv, launch=launch, user=user, inner_nproc=inner_nproc)


def bwrap_argv(
    bwrap: str, ro_binds: tuple[str, ...], spec: SandboxSpec, root: Path, nproc: int | None
) -> list[str]:
    """The full command line (prlimit, then bwrap) that a command of this sandbox runs under
    (``nproc``: the process limit around bwrap; None when it is set inside instead)."""
    lim = spec.limits
    args = [
        "prlimit",
        f"--cpu={lim.cpu_s}",
        f"--as={lim.memory_mb * 1024 * 1024}",
        f"--fsize={lim.file_size_mb * 1024 * 1024}",
        *([f"--nproc={nproc}"] if nproc is not None else []),
        "--core=0",
        "--nofile=1024",
        "--",
        bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
    ]
    # network=True still gets a network namespace of its own (--unshare-all): slirp4netns
    # gives it outbound NAT with the host's loopback cut off (see rllm.engine.sandbox.network).
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    # Every writable mount is sized: /tmp and /dev/shm here, the workdir on the host; the
    # root and /dev (tmpfs of half the host's RAM each) are made read-only below.
    args += ["--size", str(lim.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    if spec.desktop is not None:  # the sandbox's own X socket folder, never the host's
        args += desktop.exec_binds(root)
    args += ["--size", str(lim.shm_mb * 1024 * 1024), "--tmpfs", "/dev/shm"]
    # After the tmpfs mounts: a folder under /tmp (a venv in a checkout there) stays visible.
    for path in ro_binds:
        args += ["--ro-bind", path, path]
    args += ["--bind", str(root / "work"), spec.workdir, "--ro-bind", str(root / "ctl"), CTL]
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    args += ["--chdir", spec.workdir, "--clearenv"]
    base_env = {"PATH": PATH, "HOME": spec.workdir, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    if spec.desktop is not None:
        base_env["DISPLAY"] = desktop.DISPLAY
    for key, value in {**base_env, **spec.env}.items():
        args += ["--setenv", key, value]
    return args


def as_user(uid: int | None) -> UserOptions:
    return UserOptions() if uid is None else UserOptions(user=uid, group=uid, extra_groups=[])


def spawn_as(user: UserOptions) -> dict[str, Any]:
    """``user`` as create_subprocess_exec keywords the running loop accepts: uvloop (the rollout
    worker processes' loop) refuses user/group/extra_groups, so there the child drops to the
    uid itself between fork and exec."""
    if not user or type(asyncio.get_running_loop()).__module__.startswith("asyncio"):
        return dict(user)
    uid = user.get("user", os.geteuid())
    gid = user.get("group", uid)

    def drop() -> None:  # runs in the forked child, before exec: the order matters (groups first)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return {"preexec_fn": drop}


def _nproc_per_userns() -> bool:
    """Whether RLIMIT_NPROC is counted per user namespace (Linux 5.14's ucounts)."""
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


def _processes_of(uid: int) -> int:
    """How many processes ``uid`` runs now (RLIMIT_NPROC counts them all, not just the sandbox's)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += 1
    return count
