"""A local sandbox's virtual screen: Xvfb and a minimal window manager (evilwm) in one bwrap of
the sandbox that lives as long as the sandbox (its "desktop session"), beside the per-exec ones.

The display is private: the X server listens only on a unix socket in a host folder of this
sandbox (``<root>/display/x11``, under a folder owned by the sandbox's uid, mode 0700) that every
bwrap of the sandbox mounts at /tmp/.X11-unix, never the host's; no TCP, and the abstract socket
sits in the session's own network namespace. The agent's execs mount it read-only (connecting
to a socket is no write): only the session, where the X server makes its socket, may write there,
and where the backend can mount (root) ``<root>/display`` is a tmpfs of ``DISPLAY_FOLDER``
(its pages charged to the writer's memory cgroup, the sandbox's), so not even the session's apps
can put more than that on the host. The session joins the sandbox's cgroup like any exec (its
memory counts against the sandbox's cap) and is killed with the sandbox at close.

The session also runs the desktop helper (``rllm.sdk.desktop_helper``): one process that takes
input and screenshot requests, so an action is a round trip, not an exec per action. It connects
to a unix socket the host listens on, in a host folder (``<root>/helper``, 0700, the sandbox's
uid) that only the session mounts (at ``/tmp/.rllm-helper``, read-only), never the agent's execs.

When the session does not come up, the error quotes the tail of the X server's log, read from
the agent's workdir as any file leaving the sandbox is (``host_files``: no link followed, only a
regular file, a bounded read), never by its path on the host.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shlex
import shutil
from pathlib import Path

from rllm.engine.sandbox import host_files, mounts
from rllm.sdk import desktop_helper
from rllm.sdk.desktop_channel import HelperChannel
from rllm.sdk.sandbox import DesktopSpec, SandboxError, SandboxSpec, SandboxUnavailable

DISPLAY = ":0"
SOCKET_DIR = "/tmp/.X11-unix"
LOG_DIR = ".rllm-desktop"  # in the workdir: the X server's and the apps' logs, for diagnosis
READY = "rllm-desktop-ready"
NO_HELPER = "rllm-desktop-no-helper"  # the session found no python3 to run the helper with
CTL = "/.rllm"  # the sandbox's read-only control folder (bubblewrap.CTL): the helper's program
HELPER = "desktop-helper.py"
HELPER_DIR = "/tmp/.rllm-helper"  # where the session (only) sees the host's socket folder
TOOLS = ("Xvfb", "evilwm", "xdotool", "xwd", "xwdtopnm")
START_TIMEOUT_S = 30.0
DISPLAY_FOLDER = ("64k", 16)  # the display folder's tmpfs: size, files and folders (one socket is needed)
_LOG_TAIL = 400  # characters of the X server's log quoted in a start-up error


def check_tools() -> None:
    """SandboxUnavailable naming the Debian packages when a desktop tool is missing."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise SandboxUnavailable(
            f"a sandbox desktop needs {', '.join(missing)}: apt-get install xvfb evilwm xdotool x11-apps netpbm"
        )


def session_script(spec: SandboxSpec, helper: bool = True, program: str = f"{CTL}/{HELPER}") -> str:
    """The desktop session's shell script: X server, window manager, the helper (``helper``: the
    host listens for it; ``program``: where the sandbox sees its file), the spec's apps, then a
    ready line on stdout; it waits on its children so the session lives until it is killed."""
    desktop = spec.desktop
    assert desktop is not None
    logs = f"{spec.workdir}/{LOG_DIR}"
    screen = f"{desktop.width}x{desktop.height}x{desktop.depth}"
    lines = [
        "set -e",
        f"mkdir -p {shlex.quote(logs)}",
        f"export DISPLAY={DISPLAY}",
        # -displayfd: the server writes the display number through this FIFO once it accepts
        # clients; the read returns then (or empty at EOF when the server died), no polling.
        "mkfifo /tmp/rllm-displayfd",
        f"Xvfb {DISPLAY} -screen 0 {screen} -nolisten tcp -noreset -displayfd 3 "
        f"3>/tmp/rllm-displayfd </dev/null >{shlex.quote(logs)}/xvfb.log 2>&1 &",
        "read -r number </tmp/rllm-displayfd || true",
        '[ -n "$number" ] || { echo rllm-desktop-xvfb-died; exit 1; }',
        f"evilwm -fn fixed </dev/null >{shlex.quote(logs)}/wm.log 2>&1 &",
        f"cd {shlex.quote(spec.workdir)}",
    ]
    if helper:
        run = f"python3 -I -S {program} {HELPER_DIR}/s </dev/null >/dev/null 2>{shlex.quote(logs)}/helper.log"
        lines.append(f"if command -v python3 >/dev/null; then {run} & else echo {NO_HELPER}; fi")
    for number, app in enumerate(desktop.apps):
        lines.append(f"/bin/sh -c {shlex.quote(app)} </dev/null >{shlex.quote(logs)}/app{number}.log 2>&1 &")
    lines += [f"echo {READY}", "exec >/dev/null 2>&1", "wait"]
    return "\n".join(lines) + "\n"


async def wait_ready(stdout: asyncio.StreamReader) -> bool:
    """Return once the session printed its ready line (True unless it could not start the
    helper); SandboxError saying why if it ended or took longer than START_TIMEOUT_S."""
    helper = True
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while line := await stdout.readline():
                if line.strip() == NO_HELPER.encode():
                    helper = False
                if line.strip() == READY.encode():
                    return helper
    except TimeoutError:
        raise SandboxError(f"the sandbox desktop did not start within {START_TIMEOUT_S:g} s") from None
    raise SandboxError("the sandbox desktop's session ended before its display was ready")


async def listen(
    root: Path,
    uid: int | None,
    spec: SandboxSpec,
    *,
    program_dir: str = "ctl",
    socket_mode: int | None = None,
) -> HelperChannel:
    """The host's end of the session's helper: a unix socket in ``root``'s helper folder (bound
    into the session by :func:`session_binds`) and the helper's program in ``root / program_dir``
    (its control folder). A socket that cannot be made (a base folder too long for a socket
    path) leaves the channel unavailable: actions then run one exec each."""
    assert spec.desktop is not None
    channel = HelperChannel(spec.desktop)
    (root / program_dir / HELPER).write_text(_helper_source())
    path = root / "helper" / "s"
    try:
        server = await asyncio.start_unix_server(channel.connected, path=str(path))
        if uid is not None:
            os.chown(path, uid, uid)
        if socket_mode is not None:
            os.chmod(path, socket_mode)
    except OSError as exc:
        channel.unavailable(f"no socket for it at {path}: {exc}")
        return channel
    channel.on_close(server.close)
    return channel


def exec_binds(root: Path) -> list[str]:
    """bwrap arguments of every exec of a desktop sandbox: the display's socket folder, read-only."""
    return ["--ro-bind", str(root / "display" / "x11"), SOCKET_DIR]


def session_binds(root: Path) -> list[str]:
    """bwrap arguments of the desktop session (only): the socket folder writable (the X server
    makes its socket there), the helper's socket folder read-only."""
    return [
        "--bind",
        str(root / "display" / "x11"),
        SOCKET_DIR,
        "--ro-bind",
        str(root / "helper"),
        HELPER_DIR,
    ]


def make_folders(root: Path, uid: int | None, sized: bool) -> None:
    """The sandbox's display and helper folders: 0700 and, as root, owned by the sandbox's uid
    (Xvfb makes its socket folder world-writable, 1777; the folder above it keeps other host
    users from reaching the socket). ``sized``: the display folder is a tmpfs of
    ``DISPLAY_FOLDER`` (the caller unmounts it, :func:`mounts.detach`, before deleting ``root``)."""
    for folder in (root / "display", root / "helper"):
        folder.mkdir(mode=0o700)
        if uid is not None:
            os.chown(folder, uid, uid)
    if sized:
        size, inodes = DISPLAY_FOLDER
        mounts.mount_tmpfs(root / "display", size, uid, inodes=inodes, exec_ok=False)
    (root / "display" / "x11").mkdir(mode=0o700)
    if uid is not None:
        os.chown(root / "display" / "x11", uid, uid)


def startup_log(workdir: Path) -> str:
    """The tail of the X server's log in the sandbox's ``workdir``, for a
    start-up error: never read through a link, only a regular file, at most its last 4 KiB."""
    path = f"{LOG_DIR}/xvfb.log"
    try:
        with (
            host_files.refusing(path, "the X server log"),
            host_files.owned_fd(host_files.open_workdir(workdir)) as top,
            host_files.owned_fd(host_files.open_beneath(top, path, host_files.FILE_FLAGS)) as fd,
        ):
            size = host_files.require_regular(fd, path, "the X server log").st_size
            text = os.pread(fd, 4096, max(0, size - 4096)).decode(errors="replace")
    except SandboxError as exc:
        return f"(not read: {exc})"
    return text.strip()[-_LOG_TAIL:] or "(the X server wrote nothing)"


@functools.cache
def _helper_source() -> str:
    return Path(desktop_helper.__file__).read_text()


__all__ = [
    "DISPLAY",
    "SOCKET_DIR",
    "DesktopSpec",
    "check_tools",
    "exec_binds",
    "listen",
    "make_folders",
    "session_binds",
    "session_script",
    "startup_log",
    "wait_ready",
]
