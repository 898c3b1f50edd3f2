"""What leaves a local sandbox for the host: ``read_file`` and ``download`` (bubblewrap backend),
bounded so that an agent's disk cannot be multiplied on the host's.

A file's size is what the agent claims, not what it paid for: a sparse file of 1 TiB takes no
disk in the sandbox, and a 1 MiB file with 144 hard links takes 1 MiB. Copied naively, both
land on the host at their full apparent size, once per name. So each transfer has a
:class:`Budget` (the sandbox's ``disk_mb``, the most real data its workdir can hold): every
file counts its apparent size, every file or folder made on the host ``ENTRY_BYTES`` more, and
a transfer past it is refused with a :class:`SandboxAgentError` that says so (the agent's
doing: scored, never retried as infrastructure). Within it, a download
keeps holes as holes (only the data regions, found with ``SEEK_DATA``/``SEEK_HOLE``, are
written) and copies a hard-linked file once: its other names in the same download become hard
links to that copy on the host (refused, never copied again, where a link cannot be made).

Everything is read through the primitives of ``rllm.engine.sandbox.host_files``: no link is
followed at any component, only regular files are read, files are written to a fresh name and
renamed into place. These functions block: the sandbox runs them in a worker thread.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Callable
from pathlib import Path

from rllm.engine.sandbox.host_files import (
    CHUNK,
    FILE_FLAGS,
    MAX_DEPTH,
    kind,
    link_into,
    open_beneath,
    open_workdir,
    opendirs,
    owned_fd,
    refused_error,
    refusing,
    relative,
    replace_entry,
    require_regular,
    safe_mode,
)
from rllm.sdk.sandbox import SandboxAgentError

ENTRY_BYTES = 4096  # what each file or folder made on the host counts besides its size (an inode, a block)
_DIR_OUT = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class Budget:
    """What one transfer may still bring out of a sandbox: ``limit`` bytes in all, counting each
    file's apparent size (a sparse file's holes too: whoever reads the copy reads them) and
    ``ENTRY_BYTES`` for each file or folder made on the host."""

    def __init__(self, limit: int, path: str, what: str) -> None:
        self.limit, self.left, self.path, self.what = limit, limit, path, what

    def take(self, size: int) -> None:
        """Count ``size`` more bytes; refused, before they are written, when they do not fit."""
        if size > self.left:
            raise SandboxAgentError(  # what the agent left in its sandbox: its outcome, scored
                f"{self.what} {self.path!r}: more than {self.limit / 2**20:g} MiB would leave the "
                f"sandbox (one transfer brings out at most the sandbox's disk_mb, counting each "
                f"file's size and {ENTRY_BYTES // 1024} KiB per file or folder); refused"
            )
        self.left -= size


def read_from(workdir: Path, mount: str, path: str, limit: int) -> bytes:
    """The sandbox file ``path``, refused when it holds more than ``limit`` bytes (holes count:
    they are read as zeros) or grows past them while it is read."""
    rel = relative(mount, path)
    with (
        refusing(path, "read_file"),
        owned_fd(open_workdir(workdir)) as top,
        owned_fd(open_beneath(top, rel, FILE_FLAGS)) as fd,
    ):
        budget = Budget(limit, path, "read_file")
        size = require_regular(fd, path, "read_file").st_size
        budget.take(size)
        data = bytearray()
        while chunk := os.read(fd, CHUNK):
            data += chunk
            if len(data) > size:
                budget.take(len(data) - size)  # it grew meanwhile: the growth counts too
                size = len(data)
        return bytes(data)


def download_from(workdir: Path, mount: str, path: str, local: str, limit: int) -> None:
    """Copy a sandbox file or folder to ``local`` within a :class:`Budget` of ``limit`` bytes.
    Only regular files and folders are copied; links and special files are refused (named in
    the error, after the rest is copied)."""
    rel = relative(mount, path)
    walk = _Download(Budget(limit, path, "download"), Path(local))
    with (
        refusing(path, "download"),
        owned_fd(open_workdir(workdir)) as top,
        owned_fd(open_beneath(top, rel, FILE_FLAGS)) as src,
    ):
        st = os.fstat(src)
        if stat.S_ISDIR(st.st_mode):
            walk.dest.mkdir(parents=True, exist_ok=True)
            with owned_fd(os.open(walk.dest, _DIR_OUT)) as out:
                walk.tree(src, out, rel or ".", "", 0)
        else:
            require_regular(src, path, "download")
            walk.dest.parent.mkdir(parents=True, exist_ok=True)
            with owned_fd(os.open(walk.dest.parent, _DIR_OUT)) as out:
                walk.file(src, st, out, walk.dest.name, walk.dest.name)
    if walk.refused:
        raise refused_error(path, walk.refused)


class _Download:
    """One download: its budget, what it refused, and where the hard-linked files it copied lie
    (``(st_dev, st_ino)`` -> their copy's path under ``dest``)."""

    def __init__(self, budget: Budget, dest: Path) -> None:
        self.budget, self.dest = budget, dest
        self.refused: list[str] = []
        self.copied: dict[tuple[int, int], str] = {}

    def tree(self, src: int, out: int, rel: str, local: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise SandboxAgentError(f"download: {rel!r} is nested deeper than {MAX_DEPTH} folders")
        with os.scandir(src) as it:
            names = sorted(entry.name for entry in it)
        for name in names:
            where, here = posixpath.join(rel, name), posixpath.join(local, name)
            try:
                fd = os.open(name, FILE_FLAGS, dir_fd=src)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO, errno.ENOENT):
                    self.refused.append(where)  # a link, a socket, or gone meanwhile
                    continue
                raise
            with owned_fd(fd):
                st = os.fstat(fd)
                if stat.S_ISDIR(st.st_mode):
                    self.budget.take(ENTRY_BYTES)
                    # An existing host entry of that name is the caller's; a link there is not followed.
                    with owned_fd(opendirs(out, [name], None, create=True)) as sub:
                        self.tree(fd, sub, where, here, depth + 1)
                elif stat.S_ISREG(st.st_mode):
                    self.file(fd, st, out, name, here)
                else:
                    self.refused.append(f"{where} ({kind(st.st_mode)})")

    def file(self, src: int, st: os.stat_result, out: int, name: str, here: str) -> None:
        """Copy the regular file ``src`` as ``name`` in ``out`` (``here``: where that is under
        ``dest``), or link it to this download's copy of the same file."""
        inode = (st.st_dev, st.st_ino)
        first = self.copied.get(inode) if st.st_nlink > 1 else None
        self.budget.take(ENTRY_BYTES + (0 if first is not None else st.st_size))
        if first is None:
            replace_entry(out, name, _copy_sparse(src, st.st_size), safe_mode(st.st_mode), None)
            if st.st_nlink > 1:
                self.copied[inode] = here
            return
        try:
            link_into(out, name, self.dest / first)
        except OSError:  # another file system below dest, or too many links: not copied twice
            self.refused.append(f"{here} (a hard link of {first}; it was not copied twice)")


def _copy_sparse(src: int, size: int) -> Callable[[int], None]:
    """A ``fill`` for ``replace_entry``: the first ``size`` bytes of ``src`` (what was counted,
    however the file changes meanwhile), holes left as holes."""

    def fill(fd: int) -> None:
        pos = 0
        while pos < size:
            try:
                start = os.lseek(src, pos, os.SEEK_DATA)
                end = min(os.lseek(src, start, os.SEEK_HOLE), size)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    break  # nothing but a hole from ``pos`` on
                if exc.errno != errno.EINVAL:
                    raise
                start, end = pos, size  # no hole finding on this file system: copied whole
            if start >= size:
                break
            pos = _copy_range(src, fd, start, end)
            if pos < end:
                break  # it shrank meanwhile: the rest stays a hole
        os.ftruncate(fd, size)

    return fill


def _copy_range(src: int, dst: int, start: int, end: int) -> int:
    """Copy bytes ``[start, end)`` of ``src`` to the same offsets of ``dst``; where it stopped."""
    while start < end:
        chunk = os.pread(src, min(CHUNK, end - start), start)
        if not chunk:
            break
        view = memoryview(chunk)
        offset = start
        while view:
            written = os.pwrite(dst, view, offset)
            view, offset = view[written:], offset + written
        start += len(chunk)
    return start
