"""The uids local sandboxes run as (as root): one per live sandbox, never shared by two live
sandboxes on one host, whichever harness process made them.

A sandbox's uid is what its process limit (RLIMIT_NPROC) counts and what keeps its files and
processes apart from every other sandbox's, so two live sandboxes must never share one. Deriving
it from the harness's pid and a counter could not promise that (two harnesses whose pids differ
by a multiple of the stride collide; the counter wraps), so uids are leased host-wide: a lease
on uid ``U`` is an exclusive ``flock`` on the file ``U`` in a root-only folder
(``/run/rllm-sandbox-uids``; the temporary folder where there is no ``/run``), held on an open
descriptor for the sandbox's life. ``flock`` belongs to the open file, not the process, so two
sandboxes of one process exclude each other too; the kernel drops it when the holder exits, so
the uids of a killed harness are free again at once (its sandboxes died with it:
``--die-with-parent``). Releasing unlinks the file while still holding the lock; a lease is
taken only when the locked file is still the one of that name (same inode), so an unlinked
file's lock never counts. The files a killed harness left are removed by the next process's
first lease (each is unlocked).

Each process starts at a random point of the range and walks it: a uid just given back by
another harness is the last to be reused. A forked child forgets its parent's leases (its
copies of their descriptors are closed; the parent still holds them). Harnesses that do not
share ``/run`` (containers of one kernel, each with its own) do not see each other's leases.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import tempfile
import threading
import weakref
from pathlib import Path

from rllm.sdk.sandbox import SandboxError, SandboxUnavailable

BASE = 2_000_000  # above the uids and subordinate-uid ranges distributions hand out
SPAN = 1 << 24
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def default_folder() -> Path:
    """Where the host's leases live: ``/run`` (per boot: a reboot frees every lease) where this
    user may write there, else the temporary folder."""
    run = Path("/run")
    usable = run.is_dir() and os.access(run, os.W_OK | os.X_OK)
    return (run if usable else Path(tempfile.gettempdir())) / "rllm-sandbox-uids"


class UidLeases:
    """Leases of uids in ``[base, base + span)``, shared through lock files in ``folder``."""

    def __init__(self, folder: Path | None = None, base: int = BASE, span: int = SPAN) -> None:
        self.folder = folder or default_folder()
        self.base, self.span = base, span
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # uid -> the descriptor holding its flock
        self._dir: int | None = None
        self._next = secrets.randbelow(span)
        _every.add(self)

    def take(self) -> int:
        """A uid no other live sandbox of this host holds; held until :meth:`give_back`."""
        with self._lock:
            folder = self._open_folder()
            for _ in range(min(self.span, 65536)):
                uid = self.base + self._next
                self._next = (self._next + 1) % self.span
                if uid not in self._held and (fd := self._try(folder, uid)) is not None:
                    self._held[uid] = fd
                    return uid
        raise SandboxUnavailable(
            f"no free sandbox uid: 65536 in a row are held by live sandboxes (leases in {self.folder})"
        )

    def give_back(self, uid: int) -> None:
        """End the lease on ``uid`` (its sandbox's processes are gone); a no-op if not held."""
        with self._lock:
            fd = self._held.pop(uid, None)
            if fd is None:
                return
            if self._dir is not None:
                with contextlib.suppress(OSError):
                    os.unlink(str(uid), dir_fd=self._dir)  # still locked: see _try
            os.close(fd)

    @property
    def held(self) -> frozenset[int]:
        """The uids this process holds now."""
        return frozenset(self._held)

    def _try(self, folder: int, uid: int) -> int | None:
        try:
            fd = os.open(str(uid), _LOCK_FLAGS, 0o600, dir_fd=folder)
        except OSError as exc:
            raise SandboxError(f"cannot take sandbox uid {uid}'s lease in {self.folder}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # The holder before may have unlinked the file between our open and our lock: the
            # lease is ours only if the locked file is still the one of that name.
            named = os.stat(str(uid), dir_fd=folder, follow_symlinks=False)
            mine = os.fstat(fd)
            if (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino):
                return fd
        except OSError:
            pass  # held by a live sandbox (EWOULDBLOCK), or unlinked meanwhile: the next uid
        os.close(fd)
        return None

    def _open_folder(self) -> int:
        if self._dir is None:
            try:
                with contextlib.suppress(FileExistsError):
                    self.folder.mkdir(mode=0o700, parents=True)
                fd = os.open(self.folder, _DIR_FLAGS)
            except OSError as exc:
                raise SandboxUnavailable(
                    f"cannot open the sandbox uid leases' folder {self.folder}: {exc}"
                ) from exc
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                os.close(fd)
                raise SandboxUnavailable(
                    f"the sandbox uid leases' folder {self.folder} is not this user's alone (owner "
                    f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): another user could hand out its uids"
                )
            self._dir = fd
            self._sweep(fd)
        return self._dir

    def _sweep(self, folder: int) -> None:
        """Remove the files of leases whose holders died (a killed harness leaves them, unlocked),
        so the folder does not grow; a live lease's file is locked and left alone."""
        names: list[str] = []
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            names = [entry.name for entry in entries if entry.name.isdigit()]
        for name in names:
            with contextlib.suppress(OSError):
                fd = os.open(name, _LOCK_FLAGS & ~os.O_CREAT, dir_fd=folder)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.unlink(name, dir_fd=folder)  # locked: no one holds it (see _try)
                finally:
                    os.close(fd)

    def _forget(self) -> None:
        """In a forked child: the leases are the parent's (it still holds them)."""
        for fd in self._held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._held = {}
        self._lock = threading.Lock()
        self._next = secrets.randbelow(self.span)


_every: weakref.WeakSet[UidLeases] = weakref.WeakSet()


def _forget_in_child() -> None:
    for leases in list(_every):
        leases._forget()


os.register_at_fork(after_in_child=_forget_in_child)
_leases = UidLeases()


def take() -> int:
    """A host-unique uid for a new sandbox (the process's :class:`UidLeases`)."""
    return _leases.take()


def give_back(uid: int | None) -> None:
    """End the lease on a closed sandbox's uid (None: it had none)."""
    if uid is not None:
        _leases.give_back(uid)
