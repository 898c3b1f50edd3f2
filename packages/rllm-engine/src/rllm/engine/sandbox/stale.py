"""Sandboxes left behind by a harness that was killed (``kill -9``): found and removed at the next
start-up of a backend over the same folder.

Each sandbox folder holds an ownership marker (``owner``: the creating process's pid, its
start time in clock ticks since boot, from ``/proc/<pid>/stat``, and its PID namespace), written
by the harness in the sandbox's root folder, which the sandbox's code cannot write. A folder is
swept only when its owner is provably dead: no process with that pid, or one that started at
another time (the pid was reused), in this process's own PID namespace (a harness in another
one, e.g. a container sharing ``/tmp``, cannot be seen, so its folders are left alone). A folder
without a readable marker is left alone too. Sweeping never follows a
link: entries are examined with ``lstat``, the marker is opened with ``O_NOFOLLOW``, the
sandbox's tmpfs folders (workdir, display) are detached with ``UMOUNT_NOFOLLOW``, and the tree
is deleted by ``safe_delete.remove_tree`` (from directory fds, no link followed, as deep as the
agent nested it: a folder it cannot delete is logged and left, never an error of the start-up).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from rllm.engine.sandbox import mounts, safe_delete

MARKER = "owner"
MOUNTED = ("work", "display")  # the folders of a sandbox that may be tmpfs mounts
log = logging.getLogger(__name__)


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot); None when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may hold spaces and parentheses: split after its last ")".
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def owner_token(pid: int | None = None) -> str:
    """``<pid>-<start time>`` of this process (or ``pid``): names what a dead owner leaves."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{start_time(pid)}"


def is_dead(token: str) -> bool:
    """Whether the owner named by ``token`` (``<pid>-<start time>``) is provably gone."""
    pid, _, started = token.partition("-")
    if not pid.isdigit() or not started.isdigit():
        return False  # not a marker of ours: nothing is proven
    now = start_time(int(pid))
    return now is None or now != int(started)


def pid_namespace() -> str:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``; "" if unknown)."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def write_marker(root: Path) -> None:
    """Mark ``root`` (a new sandbox folder) as this process's."""
    fd = os.open(root / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, f"{owner_token()} {pid_namespace()}".encode())
    finally:
        os.close(fd)


def sweep(base_dir: Path, prefix: str = "sb-") -> list[Path]:
    """Remove the sandbox folders under ``base_dir`` whose owner is provably dead (their workdir
    tmpfs unmounted first); returns what was removed. Blocking: call off the event loop."""
    removed = []
    try:
        entries = list(os.scandir(base_dir))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
            continue
        root = Path(entry.path)
        marker = _read_marker(root)
        token, _, namespace = (marker or "").partition(" ")
        if marker is None or namespace != pid_namespace() or not namespace or not is_dead(token):
            continue
        for folder in MOUNTED:
            mounts.detach(root / folder)
        if safe_delete.remove_tree(root):
            removed.append(root)
            log.info("removed sandbox %s left by dead process %s", root, token)
        else:
            log.warning("sandbox %s left by dead process %s: not entirely deleted", root, token)
    return removed


def _read_marker(root: Path) -> str | None:
    try:
        fd = os.open(root / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, 64).decode(errors="replace").strip()
    finally:
        os.close(fd)
