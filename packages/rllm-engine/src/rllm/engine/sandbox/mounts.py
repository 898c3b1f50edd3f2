"""The host mounts of a local sandbox: sized tmpfs folders (its workdir, its display's socket
folder) that bound what the sandbox writes there, and their removal, never through a link.

Only root with ``CAP_SYS_ADMIN`` may mount (not a normal user, not root in a default Docker
container): :func:`can_mount` tells, and without it those folders are plain host folders (the
documented weaker mode).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import tempfile
from pathlib import Path

from rllm.sdk.sandbox import SandboxUnavailable

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8
log = logging.getLogger(__name__)
_libc = ctypes.CDLL(None, use_errno=True)


def mount_tmpfs(
    path: Path, size: str, uid: int | None, *, inodes: int | None = None, exec_ok: bool = True
) -> None:
    """A tmpfs of ``size`` (``"512m"``, ``"64k"``) on ``path`` (no devices, no setuid; no
    executables unless ``exec_ok``; at most ``inodes`` files and folders), mode 0700, owned by
    the sandbox's uid. Its pages are charged to the memory cgroup of whoever writes them."""
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    count = f",nr_inodes={inodes}" if inodes is not None else ""
    options = f"size={size},mode=0700{owner}{count}".encode()
    flags = _MS_NOSUID | _MS_NODEV | (0 if exec_ok else _MS_NOEXEC)
    if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", flags, options) != 0:
        err = ctypes.get_errno()
        raise SandboxUnavailable(f"cannot mount the sandbox's sized folder at {path}: {os.strerror(err)}")


def can_mount(base_dir: Path) -> bool:
    """Whether this process may mount a tmpfs (root without CAP_SYS_ADMIN, as in a default
    Docker container, may not)."""
    base_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
    probe = Path(tempfile.mkdtemp(prefix="mount-probe-", dir=base_dir))
    try:
        mount_tmpfs(probe, "1m", None)
    except SandboxUnavailable:
        return False
    else:
        detach(probe)
        return True
    finally:
        probe.rmdir()


def detach(path: Path) -> None:
    """Lazily unmount the tmpfs at ``path`` if one is there (never through a link); quiet when
    nothing is mounted there or the folder is gone."""
    if _libc.umount2(os.fsencode(path), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT, errno.EPERM):
            log.warning("sandbox folder %s: umount failed: %s", path, os.strerror(err))
