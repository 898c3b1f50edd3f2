"""File transfer into and out of a sandbox whose workdir is a host folder (bubblewrap backend).

The sandbox owns what is in its workdir, symlinks included, so every path is resolved on the
host and refused when it lands outside the workdir: a link planted by the agent must never make
the (possibly root) host process read or overwrite a host file. Copies keep links as links.
Nothing runs in the sandbox between execs (each exec's processes die with it), so the check is
not raced by the sandbox while no exec is in flight.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rllm.sdk.sandbox import SandboxError


def host_path(workdir: Path, mount: str, path: str) -> Path:
    """The host path of sandbox path ``path`` (absolute under ``mount``, or relative to it)."""
    rel = (
        path[len(mount) :].lstrip("/") if path == mount or path.startswith(mount.rstrip("/") + "/") else path
    )
    if rel.startswith("/"):
        raise SandboxError(
            f"{path!r} is outside the sandbox workdir {mount}; only the workdir is transferable"
        )
    root = workdir.resolve()
    target = (root / rel).resolve()
    if target != root and not target.is_relative_to(root):
        raise SandboxError(f"{path!r} resolves outside the sandbox workdir")
    return target


def give_to(path: Path, uid: int | None) -> None:
    """Hand ``path`` (recursively, links not followed) to the sandbox's uid when we run as root."""
    if uid is None:
        return
    os.chown(path, uid, uid, follow_symlinks=False)
    if path.is_dir() and not path.is_symlink():
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


def write_into(workdir: Path, mount: str, path: str, data: bytes, uid: int | None) -> None:
    target = host_path(workdir, mount, path)
    made = _make_parents(workdir, target)
    if target.is_symlink() or target.is_dir():
        raise SandboxError(f"{path!r} is a link or a folder in the sandbox; refusing to write through it")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    for p in [*made, target]:
        give_to(p, uid)


def read_from(workdir: Path, mount: str, path: str) -> bytes:
    target = host_path(workdir, mount, path)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SandboxError(f"no file {path!r} in the sandbox") from None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def upload_into(workdir: Path, mount: str, local: str, path: str, uid: int | None) -> None:
    source = Path(local)
    if not source.exists():
        raise SandboxError(f"upload: no local file or folder {local!r}")
    target = host_path(workdir, mount, path)
    made = _make_parents(workdir, target)
    if target.is_symlink():
        raise SandboxError(f"{path!r} is a link in the sandbox; refusing to write through it")
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copyfile(source, target, follow_symlinks=False)
    for p in [*made, target]:
        give_to(p, uid)


def download_from(workdir: Path, mount: str, path: str, local: str) -> None:
    source = host_path(workdir, mount, path)
    if source.is_dir():
        shutil.copytree(source, local, symlinks=True, dirs_exist_ok=True)
    elif source.is_file():
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, local, follow_symlinks=False)
    else:
        raise SandboxError(f"download: no file or folder {path!r} in the sandbox")


def _make_parents(workdir: Path, target: Path) -> list[Path]:
    made = []
    for parent in reversed(target.parents):
        if parent.is_relative_to(workdir.resolve()) and not parent.exists():
            parent.mkdir()
            made.append(parent)
    return made
