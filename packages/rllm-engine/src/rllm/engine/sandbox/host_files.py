"""File transfer into and out of a sandbox whose workdir is a host folder (bubblewrap backend).

The sandbox owns everything in its workdir and can change it at any moment (a background
process, a command running while the harness transfers), so no path is ever resolved by name
and then used again: every transfer walks from a directory fd of the workdir one component at a
time with ``O_NOFOLLOW`` (or one ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` call where
the kernel has it), and whatever it then reads or writes is the object it holds an fd of. A link
is refused at every component, never followed; only regular files are read or copied (opened
with ``O_NONBLOCK`` and checked with ``fstat``, so a FIFO, socket or device the agent made can
neither hang the harness nor be read); files are written to a fresh name and renamed over the
target, so a write never goes through an entry the agent made (a link, a hard link, a FIFO).
This module holds those primitives and the transfers into the sandbox; what leaves it for the
host (``read_file``, ``download``: bounded in size, sparse files and hard links copied as what
they take on disk) is ``rllm.engine.sandbox.outbound``. These functions block: the sandbox runs
them in a worker thread under a timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import posixpath
import secrets
import stat
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

from rllm.sdk.sandbox import SandboxAgentError, SandboxError
from rllm.types.errors import RLLMError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
MAX_DEPTH = 256  # deeper trees are refused rather than walked with one fd per level
CHUNK = 1 << 20
_BLOCK = 1 << 16  # the unit in which a downloaded file's zeros are left as holes
_ZEROS = bytes(_BLOCK)
_DIR_OUT = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # a host folder of the caller's
# openat2(2): one syscall number on every architecture (it postdates the split tables).
_SYS_OPENAT2 = 437
_RESOLVE = 0x02 | 0x04 | 0x08  # RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _load_openat2() -> Callable[..., int] | None:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"):
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    return syscall


_openat2 = _load_openat2()


def relative(mount: str, path: str) -> str:
    """``path`` (absolute under ``mount``, or relative to it) as a normalised path relative to
    the workdir (``""`` for the workdir itself); refused when it leaves the workdir."""
    mount = mount.rstrip("/") or "/"
    if path == mount or path.startswith(mount + "/"):
        rel = path[len(mount) :].lstrip("/")
    elif path.startswith("/"):
        raise SandboxAgentError(
            f"{path!r} is outside the sandbox workdir {mount}; only the workdir is transferable"
        )
    else:
        rel = path
    rel = posixpath.normpath(rel) if rel else "."
    if rel == ".." or rel.startswith("../"):
        raise SandboxAgentError(f"{path!r} resolves outside the sandbox workdir")
    return "" if rel == "." else rel


def open_beneath(dir_fd: int, rel: str, flags: int, mode: int = 0) -> int:
    """An fd of ``rel`` beneath ``dir_fd``, no link followed at any component (ELOOP if one is)."""
    global _openat2
    if not rel:
        return os.open(".", flags | os.O_CLOEXEC, dir_fd=dir_fd)
    if _openat2 is not None:
        how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE)
        fd = _openat2(_SYS_OPENAT2, dir_fd, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EPERM, errno.E2BIG, errno.EINVAL):
            raise _OpenFailed(err, os.strerror(err), rel)
        _openat2 = None  # an old kernel, or a seccomp filter that refuses it: walk instead
    parts = rel.split("/")
    current = dir_fd
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=current)
            if current != dir_fd:
                os.close(current)
            current = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=current)
    finally:
        if current != dir_fd:
            os.close(current)


class _OpenFailed(RLLMError, OSError):
    """openat2's errno, as the OSError os.open would raise (``refusing`` names its cause)."""


# What the sandbox's own content causes (a link, a special file or a folder in the way, an entry
# gone): the agent's doing, never the host's. Writing into the sandbox, a full disk cap is too.
_AGENT_ERRNOS = frozenset({errno.ELOOP, errno.EXDEV, errno.ENOENT, errno.ENOTDIR, errno.ENXIO, errno.EISDIR})
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


@contextlib.contextmanager
def refusing(path: str, what: str, *, into_sandbox: bool = False) -> Iterator[None]:
    """OS errors of a transfer as SandboxErrors that name the cause: a SandboxAgentError when
    the sandbox's content caused it (``into_sandbox``: a write into it, whose full disk cap is
    the agent's doing too; out of it, a full disk is the host's)."""
    try:
        yield
    except SandboxError:
        raise
    except OSError as exc:
        code = exc.errno or 0
        agents = code in _AGENT_ERRNOS or (into_sandbox and code in _FULL_ERRNOS)
        reason = {
            errno.ELOOP: "a link is in the way (links in the sandbox are never followed)",
            errno.EXDEV: "it resolves outside the sandbox workdir",
            errno.ENOENT: "no such file or folder in the sandbox",
            errno.ENOTDIR: "a component is a link or not a folder (links in the sandbox are never followed)",
            errno.ENXIO: "not a regular file",
            errno.EISDIR: "it is a folder",
            errno.ENOSPC: "the sandbox's disk cap is full",
            errno.EDQUOT: "the sandbox's disk cap is full",
            errno.EFBIG: "over the sandbox's file size cap",
        }.get(code, exc.strerror or str(exc))
        if not into_sandbox and code in _FULL_ERRNOS:
            reason = f"the host's disk is full ({exc.strerror})"
        raise (SandboxAgentError if agents else SandboxError)(f"{what} {path!r}: {reason}") from None


@contextlib.contextmanager
def owned_fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def open_workdir(root: Path) -> int:
    # The workdir folder itself is the harness's (its parent is not the sandbox's to change), so
    # failing to open it is the host's fault, never the agent's.
    try:
        return os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise SandboxError(
            f"the sandbox's workdir {root} cannot be opened on the host: {exc.strerror}"
        ) from None


def require_regular(fd: int, path: str, what: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise SandboxAgentError(f"{what} {path!r}: not a regular file ({kind(st.st_mode)}); refused")
    return st


def kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "folder"),
        (stat.S_ISLNK, "link"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


def opendirs(dir_fd: int, parts: list[str], uid: int | None, create: bool) -> int:
    """An fd of the folder ``parts`` beneath ``dir_fd`` (made, and given to ``uid``, if missing)."""
    current = os.dup(dir_fd)
    try:
        for part in parts:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=current)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # made meanwhile: opened (no-follow) below
                    os.mkdir(part, 0o755, dir_fd=current)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=current)
                if uid is not None:
                    os.fchown(nxt, uid, uid)
            os.close(current)
            current = nxt
        return current
    except BaseException:
        os.close(current)
        raise


def replace_entry(dir_fd: int, name: str, fill: Callable[[int], None], mode: int, uid: int | None) -> None:
    """Create ``name`` in ``dir_fd`` as a new regular file (``fill(fd)`` writes it) and rename it
    over whatever entry had that name: the old entry is replaced, never written through."""
    tmp = f".rllm-{secrets.token_hex(8)}.part"
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
    )
    try:
        try:
            fill(fd)
            if uid is not None:
                os.fchown(fd, uid, uid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def _write_all(data: bytes) -> Callable[[int], None]:
    def fill(fd: int) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    return fill


def _write_sparse(data: bytes) -> Callable[[int], None]:
    """Write ``data`` with its all-zero blocks left as holes (a sparse file stays sparse)."""

    def fill(fd: int) -> None:
        for start in range(0, len(data), _BLOCK):
            block = data[start : start + _BLOCK]
            if block != _ZEROS[: len(block)]:
                view, offset = memoryview(block), start
                while view:
                    written = os.pwrite(fd, view, offset)
                    view, offset = view[written:], offset + written
        os.ftruncate(fd, len(data))

    return fill


def link_into(dir_fd: int, name: str, target: Path) -> None:
    """Make ``name`` in ``dir_fd`` a hard link of the host file ``target`` (a download's own copy:
    a file hard-linked in the sandbox is copied once), renamed over whatever entry had that name."""
    tmp = f".rllm-{secrets.token_hex(8)}.part"
    os.link(target, tmp, dst_dir_fd=dir_fd, follow_symlinks=False)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def _copy_from(src: int) -> Callable[[int], None]:
    def fill(fd: int) -> None:
        while chunk := os.read(src, CHUNK):
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]

    return fill


def safe_mode(mode: int) -> int:
    """Permission bits for a copied file: never setuid/setgid/sticky, never group/other-writable."""
    return (stat.S_IMODE(mode) & 0o755) | 0o600


# ------------------------------------------------------------------ into the sandbox


def write_into(workdir: Path, mount: str, path: str, data: bytes, uid: int | None) -> None:
    rel = relative(mount, path)
    if not rel:
        raise SandboxAgentError(f"write_file {path!r}: it is the workdir itself, a folder")
    parent, name = posixpath.split(rel)
    with (
        refusing(path, "write_file", into_sandbox=True),
        owned_fd(open_workdir(workdir)) as top,
        owned_fd(opendirs(top, parent.split("/") if parent else [], uid, create=True)) as folder,
    ):
        replace_entry(folder, name, _write_all(data), 0o644, uid)


def upload_into(workdir: Path, mount: str, local: str, path: str, uid: int | None) -> None:
    """Copy a host file or folder (the caller's, trusted) into the sandbox. Links in it are
    recreated as links; existing entries in the sandbox are replaced, never written through."""
    source = Path(local)
    if not source.exists():
        raise SandboxError(f"upload: no local file or folder {local!r}")
    rel = relative(mount, path)
    with refusing(path, "upload to", into_sandbox=True), owned_fd(open_workdir(workdir)) as top:
        if source.is_dir():
            with owned_fd(opendirs(top, rel.split("/") if rel else [], uid, create=True)) as folder:
                _upload_tree(source, folder, uid, path, 0)
            return
        if not rel:
            raise SandboxError(f"upload to {path!r}: it is the workdir itself, a folder")
        parent, name = posixpath.split(rel)
        with owned_fd(opendirs(top, parent.split("/") if parent else [], uid, create=True)) as folder:
            _upload_file(source, folder, name, uid, path)


def _upload_file(source: Path, folder: int, name: str, uid: int | None, path: str) -> None:
    with owned_fd(os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)) as src:
        st = require_regular(src, str(source), "upload")
        replace_entry(folder, name, _copy_from(src), safe_mode(st.st_mode), uid)


def _upload_tree(source: Path, folder: int, uid: int | None, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise SandboxError(f"upload: {source} is nested deeper than {MAX_DEPTH} folders")
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        if entry.is_symlink():
            target = os.readlink(entry.path)
            tmp = f".rllm-{secrets.token_hex(8)}.link"
            os.symlink(target, tmp, dir_fd=folder)
            if uid is not None:
                os.chown(tmp, uid, uid, dir_fd=folder, follow_symlinks=False)
            os.rename(tmp, entry.name, src_dir_fd=folder, dst_dir_fd=folder)
        elif entry.is_dir(follow_symlinks=False):
            with owned_fd(opendirs(folder, [entry.name], uid, create=True)) as sub:
                _upload_tree(Path(entry.path), sub, uid, path, depth + 1)
        else:
            _upload_file(Path(entry.path), folder, entry.name, uid, path)


# ------------------------------------------------------------------ the host side of remote backends


def save_local(local: str, rel: str, data: bytes, mode: int = 0o644) -> None:
    """Write one downloaded file at ``rel`` under the host folder ``local`` (``rel`` empty:
    ``local`` is the file): folders are made and entered without following links, the file is
    created fresh (its zero blocks left as holes) and renamed into place, and ``rel`` (named by
    the sandbox) may not leave ``local``. The Docker and E2B backends' downloads go through here."""
    dest = Path(local)
    where = relative("/", rel) if rel else ""
    with refusing(rel or local, "download to"):
        if not where:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with owned_fd(os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)) as out:
                replace_entry(out, dest.name, _write_sparse(data), safe_mode(mode), None)
            return
        dest.mkdir(parents=True, exist_ok=True)
        parent, name = posixpath.split(where)
        with (
            owned_fd(os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)) as top,
            owned_fd(opendirs(top, parent.split("/") if parent else [], None, create=True)) as out,
        ):
            replace_entry(out, name, _write_sparse(data), safe_mode(mode), None)


def link_local(local: str, rel: str, first: str) -> None:
    """Make ``rel`` under ``local`` a hard link of ``first``, a file this download already wrote
    under ``local`` (both named by the sandbox, neither may leave ``local``)."""
    dest = Path(local)
    where, source = relative("/", rel), relative("/", first)
    if not where or not source:
        raise SandboxError(f"download to {rel!r}: a hard link needs a name under {local!r}")
    parent, name = posixpath.split(where)
    with (
        refusing(rel, "download to"),
        owned_fd(os.open(dest, _DIR_OUT)) as top,
        owned_fd(opendirs(top, parent.split("/") if parent else [], None, create=True)) as out,
    ):
        link_into(out, name, dest / source)


def make_local_dir(local: str, rel: str) -> None:
    """Make the folder ``rel`` under ``local`` (links in the way refused, not followed)."""
    dest = Path(local)
    dest.mkdir(parents=True, exist_ok=True)
    where = relative("/", rel) if rel else ""
    if where:
        with (
            refusing(rel, "download to"),
            owned_fd(os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)) as top,
        ):
            os.close(opendirs(top, where.split("/"), None, create=True))


def extract_tar(tar: tarfile.TarFile, top: str, local: str, path: str) -> None:
    """Unpack a downloaded archive (its top entry named ``top``) as ``local``: regular files and
    folders only, through :func:`save_local`; links, hard links and devices are refused."""
    refused: list[str] = []
    for member in tar:
        name = member.name.rstrip("/")
        if name != top and not name.startswith(top + "/"):
            refused.append(member.name)
            continue
        rel = name[len(top) + 1 :]
        if member.isdir():
            make_local_dir(local, rel)
        elif member.isreg():
            handle = tar.extractfile(member)
            save_local(local, rel, handle.read() if handle is not None else b"", member.mode)
        else:
            refused.append(rel or path)
    if refused:
        raise refused_error(path, refused)


def refused_error(path: str, refused: list[str]) -> SandboxError:
    shown = ", ".join(refused[:5]) + (f" and {len(refused) - 5} more" if len(refused) > 5 else "")
    return SandboxAgentError(
        f"download {path!r}: {len(refused)} entries are links or special files and were not "
        f"copied (links are never created on the host): {shown}"
    )


def give_to(path: Path, uid: int | None) -> None:
    """Hand ``path`` (recursively, links not followed) to the sandbox's uid when we run as root."""
    if uid is None:
        return
    os.chown(path, uid, uid, follow_symlinks=False)
    if path.is_dir() and not path.is_symlink():
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
