"""A local sandbox's virtual screen: Xvfb and a minimal window manager (evilwm) in one bwrap of
the sandbox that lives as long as the sandbox (its "desktop session"), beside the per-exec ones.

The display is private: the X server listens only on a unix socket in a host folder of this
sandbox (``<root>/display/x11``, under a folder owned by the sandbox's uid, mode 0700) that every bwrap of the sandbox
mounts at /tmp/.X11-unix, never the host's; no TCP, and the abstract socket sits in the session's
own network namespace. The session joins the sandbox's cgroup like any exec (its memory counts
against the sandbox's cap) and is killed with the sandbox at close.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil

from rllm.sdk.sandbox import DesktopSpec, SandboxError, SandboxSpec, SandboxUnavailable

DISPLAY = ":0"
SOCKET_DIR = "/tmp/.X11-unix"
LOG_DIR = ".rllm-desktop"  # in the workdir: the X server's and the apps' logs, for diagnosis
READY = "rllm-desktop-ready"
TOOLS = ("Xvfb", "evilwm", "xdotool", "xwd", "xwdtopnm")
START_TIMEOUT_S = 30.0


def check_tools() -> None:
    """SandboxUnavailable naming the Debian packages when a desktop tool is missing."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise SandboxUnavailable(
            f"a sandbox desktop needs {', '.join(missing)}: apt-get install xvfb evilwm xdotool x11-apps netpbm"
        )


def session_script(spec: SandboxSpec) -> str:
    """The desktop session's shell script: X server, window manager, the spec's apps, then a
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
    for number, app in enumerate(desktop.apps):
        lines.append(f"/bin/sh -c {shlex.quote(app)} </dev/null >{shlex.quote(logs)}/app{number}.log 2>&1 &")
    lines += [f"echo {READY}", "exec >/dev/null 2>&1", "wait"]
    return "\n".join(lines) + "\n"


async def wait_ready(stdout: asyncio.StreamReader) -> None:
    """Return once the session printed its ready line; SandboxError saying why if it ended or
    took longer than START_TIMEOUT_S."""
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while line := await stdout.readline():
                if line.strip() == READY.encode():
                    return
    except TimeoutError:
        raise SandboxError(f"the sandbox desktop did not start within {START_TIMEOUT_S:g} s") from None
    raise SandboxError("the sandbox desktop's session ended before its display was ready")


__all__ = ["DISPLAY", "SOCKET_DIR", "DesktopSpec", "check_tools", "session_script", "wait_ready"]
