"""Deleting a folder the sandbox filled (its workdir, a stale sandbox's folder): however deep the
agent nested it, without following a link, and with a bounded number of open descriptors.

``shutil.rmtree`` recurses once per level: a 10,000-deep chain of folders (one ``mkdir`` and
``cd`` per level, which any command can do) raises ``RecursionError``, which left a sandbox's
folder behind at ``close()`` and made every later start-up's stale sweep fail on it. Here the
walk is a loop over an explicit stack. Every step is relative to a directory descriptor:
entries are opened with ``O_NOFOLLOW | O_DIRECTORY`` (a link, swapped in at any moment, is
unlinked as a link, never entered), files are removed with ``unlinkat`` and folders with
``rmdir`` in the descriptor of their parent. Only the last ``_WINDOW`` levels keep a descriptor
open; the walk climbs above them through ``..``, accepted only when it is the very folder (device
and inode) it descended from, else the walk starts again from the top (the tree was rearranged
under it). Entries that cannot be removed (a mount point, a file made immutable) are skipped, so
the walk always ends; :func:`remove_tree` then says the folder is still there.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WINDOW = 64  # descriptors kept open along the current path (the top's, always, besides)
_RESTARTS = 100  # walks started over from the top (the tree was rearranged meanwhile) before giving up
log = logging.getLogger(__name__)


@dataclass
class _Level:
    """One folder on the path from the top: its name in its parent, identity, descriptor (None
    once closed to keep the window) and the subfolders still to enter (from its last scan)."""

    name: str
    ident: tuple[int, int]
    fd: int | None
    pending: list[str] = field(default_factory=list)


def remove_tree(path: Path) -> bool:
    """Delete ``path`` (a folder, a file or a link: never followed) and everything below it;
    True when it is gone. Blocking: call it off the event loop. ``path``'s parent is the
    caller's (trusted); everything below ``path`` may be hostile."""
    try:
        parent = os.open(path.parent, _DIR_FLAGS)
    except OSError:
        return not os.path.lexists(path)
    try:
        try:
            st = os.stat(path.name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.name, dir_fd=parent)
            return True
        _empty(parent, path.name)
        try:
            os.rmdir(path.name, dir_fd=parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not delete %s: %s", path, exc.strerror)
            return False
        return True
    finally:
        os.close(parent)


def _empty(parent: int, name: str) -> None:
    """Remove everything inside the folder ``name`` of ``parent`` (the folder itself stays)."""
    try:
        top = _open_writable(parent, name)
    except OSError:
        return
    stuck: set[tuple[tuple[int, int], str]] = set()  # (folder, name) entries that would not go
    try:
        for _ in range(_RESTARTS):
            if _walk(top, stuck):
                return
        log.warning("gave up emptying %s: its tree kept changing while it was deleted", name)
    finally:
        os.close(top)


def _walk(top: int, stuck: set[tuple[tuple[int, int], str]]) -> bool:
    """One depth-first pass from ``top``; False when it must start over (the tree moved)."""
    st = os.fstat(top)
    path = [_Level("", (st.st_dev, st.st_ino), top)]
    try:
        while path:
            level = path[-1]
            sub = _next_folder(level, stuck)
            if sub is not None:
                path.append(sub)
                _trim(path)
                continue
            if len(path) == 1:
                return True  # the top holds nothing removable any more
            # Done with this folder: climb to its parent, then remove it there.
            path.pop()
            parent = path[-1]
            assert level.fd is not None  # the deepest level's descriptor is always open
            climbed = parent.fd is not None or _climb(level.fd, parent)
            os.close(level.fd)
            level.fd = None
            if not climbed:
                return False
            assert parent.fd is not None
            try:
                os.rmdir(level.name, dir_fd=parent.fd)
            except FileNotFoundError:
                pass
            except OSError:
                stuck.add((parent.ident, level.name))  # refilled meanwhile, or busy: skipped
        return True
    finally:
        for level in path[1:]:
            if level.fd is not None:
                os.close(level.fd)


def _next_folder(level: _Level, stuck: set[tuple[tuple[int, int], str]]) -> _Level | None:
    """The next subfolder of ``level`` to empty (opened, no link followed), or None when none is
    left. A scan unlinks every other entry and lists the subfolders; once they are worked
    through, the folder is scanned again (for what appeared meanwhile) until a scan lists none."""
    assert level.fd is not None
    while True:
        if not level.pending:
            _scan(level, stuck)
            if not level.pending:
                return None
        name = level.pending.pop()
        try:
            fd = _open_writable(level.fd, name)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                _unlink(level, name, stuck)  # swapped for a link or a file: removed as that
            elif exc.errno != errno.ENOENT:
                stuck.add((level.ident, name))
            continue
        st = os.fstat(fd)
        return _Level(name, (st.st_dev, st.st_ino), fd)


def _open_writable(parent: int, name: str) -> int:
    """The folder ``name`` of ``parent`` (no link followed), made readable and writable for its
    owner first when that is us: as a normal user, the agent's files are ours, and a folder it
    made 0 or 0555 could neither be listed nor emptied otherwise (root needs no such help)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        # Unreadable: opened as a path only (that needs no permission), to change its mode.
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            if os.fstat(handle).st_uid != os.geteuid():
                raise
            os.chmod(f"/proc/self/fd/{handle}", stat.S_IRWXU)  # the folder held, never a link
        finally:
            os.close(handle)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() != 0 and st.st_mode & stat.S_IRWXU != stat.S_IRWXU:
        os.fchmod(fd, stat.S_IRWXU)  # listable and writable, so its entries can be removed
    return fd


def _scan(level: _Level, stuck: set[tuple[tuple[int, int], str]]) -> None:
    """Unlink every non-folder entry of ``level`` and list its subfolders in ``pending``."""
    assert level.fd is not None
    try:
        listing = os.scandir(level.fd)
    except OSError:
        return  # unreadable after all: left, and its removal will fail (logged by the caller)
    with listing as entries:
        for entry in entries:
            if (level.ident, entry.name) in stuck:
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                level.pending.append(entry.name)
            else:
                _unlink(level, entry.name, stuck)


def _unlink(level: _Level, name: str, stuck: set[tuple[tuple[int, int], str]]) -> None:
    assert level.fd is not None
    try:
        os.unlink(name, dir_fd=level.fd)
    except FileNotFoundError:
        pass
    except OSError:
        stuck.add((level.ident, name))


def _trim(path: list[_Level]) -> None:
    """Keep at most ``_WINDOW`` descriptors open below the top: the one that just left the
    window (levels above it were closed as they left it) is closed."""
    leaving = len(path) - 1 - _WINDOW
    if leaving >= 1:
        level = path[leaving]
        if level.fd is not None:
            os.close(level.fd)
            level.fd = None


def _climb(child: int, parent: _Level) -> bool:
    """Reopen ``parent`` through ``child``'s ``..``; False unless it is the folder descended from."""
    try:
        fd = os.open("..", _DIR_FLAGS, dir_fd=child)
    except OSError:
        return False
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != parent.ident:
        os.close(fd)
        return False
    parent.fd = fd
    return True
