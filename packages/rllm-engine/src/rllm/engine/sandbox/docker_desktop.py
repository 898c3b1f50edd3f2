"""Docker desktops (``SandboxSpec.desktop`` on the Docker backend): the local backend's desktop
session (``desktop.session_script``: Xvfb, evilwm, the desktop helper, the spec's apps) run as
one ``docker exec`` that lives as long as the container, started after the spec's files and
setup, so the apps find them.

The display is private: the container gets a tmpfs of its own at /tmp/.X11-unix (never a bind
of the host's), Xvfb listens on no TCP port and its abstract socket lies in the container's own
network namespace, and ``DISPLAY`` is the container's :0 whatever the spec's env says. The
session's processes run in the container's cgroup (its memory cap) and private IPC namespace
(MIT-SHM screenshots), and go with the container at close.

The helper reaches the host over a unix socket, as on the local backend, in a host folder made
for this one sandbox (a 0700 temporary folder holding a 0755 ``helper`` folder) bind-mounted
read-only at /tmp/.rllm-helper: a process of the container can connect to the socket (connect
needs no write access to the mount) but can neither replace it nor leave anything on the host.
Unlike the local backend's, every process of the container sees that folder, so the sandbox is
handed out only once the helper said hello (the host takes the first connection only: that one
is the helper's; the task's own apps, started beside it, are as trusted as on the local backend). A socket rather than the helper on a ``docker exec``'s stdio: the stdio
goes through the daemon (one more hop per action) in Docker's stream framing, while the socket
serves the local backend's channel unchanged. The helper's program lies in the same folder.
This needs an engine that shares the host's filesystem (a local Linux engine); where a socket
cannot be reached through a bind mount (Docker Desktop's VM, a remote engine) no helper
connects, and after ``desktop_channel.HELLO_TIMEOUT_S`` actions run one exec each.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

from rllm.engine.sandbox import desktop
from rllm.sdk.desktop_channel import HelperChannel
from rllm.sdk.sandbox import ExecResult, SandboxError, SandboxSpec

IMAGE = "rllm-desktop"  # docker build -t rllm-desktop cookbooks/desktop
BUILD_HINT = f"build the desktop image: docker build -t {IMAGE} cookbooks/desktop"
PROGRAM = f"{desktop.HELPER_DIR}/{desktop.HELPER}"
_PUMPS: set[asyncio.Future[None]] = set()


class DesktopContainer(Protocol):
    """What the session needs of a Docker sandbox."""

    client: Any
    container: Any
    spec: SandboxSpec
    desktop_helper: HelperChannel | None

    async def exec(
        self, cmd: str | list[str], timeout: float | None = None, env: dict[str, str] | None = None
    ) -> ExecResult: ...


def make_root() -> Path:
    """This sandbox's host folder (0700): the helper's folder in it is what the container mounts."""
    root = Path(tempfile.mkdtemp(prefix="rllm-docker-desktop-"))
    (root / "helper").mkdir()
    os.chmod(root / "helper", 0o755)  # the container's uid need not be ours: it only reads
    return root


def options(root: Path) -> dict[str, Any]:
    """``containers.run`` options a desktop adds (merged by ``docker.container_options``)."""
    return {
        "tmpfs": {desktop.SOCKET_DIR: "size=1m,mode=1777"},
        "environment": {"DISPLAY": desktop.DISPLAY},
        "volumes": {str(root / "helper"): {"bind": desktop.HELPER_DIR, "mode": "ro"}},
        "ipc_mode": "private",
    }


async def start(sandbox: DesktopContainer, root: Path) -> str:
    """Start the desktop session in ``sandbox``'s container and return its exec id once the X
    server accepts clients, the apps are started and the helper said hello (or is known not to
    come)."""
    spec = sandbox.spec
    channel = await desktop.listen(root, None, spec, program_dir="helper", socket_mode=0o666)
    sandbox.desktop_helper = channel
    script = desktop.session_script(spec, helper=channel.state == "new", program=PROGRAM)
    api = sandbox.client.api
    argv = ["/bin/sh", "-c", script]
    env = {"DISPLAY": desktop.DISPLAY}
    created = await asyncio.to_thread(
        api.exec_create, sandbox.container.id, argv, environment=env, workdir=spec.workdir
    )
    session = created["Id"]
    stdout = asyncio.StreamReader()
    pumping = asyncio.ensure_future(
        asyncio.to_thread(_pump, api, session, stdout, asyncio.get_running_loop())
    )
    _PUMPS.add(pumping)  # (held until done: the loop keeps only weak references to tasks)
    pumping.add_done_callback(_PUMPS.discard)
    try:
        helper = await desktop.wait_ready(stdout)
    except SandboxError as exc:
        raise SandboxError(f"{exc}; X server log: {await _log(sandbox)}") from None
    if not helper:
        channel.unavailable("the sandbox has no python3 to run it")
    else:
        await channel.ready()
    return session


async def alive(sandbox: DesktopContainer, session: str) -> bool:
    """Whether the desktop session still runs."""
    try:
        info = await asyncio.to_thread(sandbox.client.api.exec_inspect, session)
    except Exception:
        return False
    return bool(info.get("Running"))


def _pump(api: Any, session: str, reader: asyncio.StreamReader, loop: asyncio.AbstractEventLoop) -> None:
    """Feed the session's stdout to ``reader`` until its ready line (a worker thread: the Docker
    SDK blocks). The stream ends when the container goes, so this thread never outlives it."""
    seen = b""
    try:
        for out, _err in api.exec_start(session, stream=True, demux=True):
            if out:
                _soon(loop, reader.feed_data, out)
                seen = (seen + out)[-256:]
                if desktop.READY.encode() in seen:
                    return
    except Exception:  # the stream broke: wait_ready reports the session's end
        pass
    finally:
        _soon(loop, reader.feed_eof)


def _soon(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
        loop.call_soon_threadsafe(fn, *args)


async def _log(sandbox: DesktopContainer) -> str:
    with contextlib.suppress(Exception):
        result = await sandbox.exec(["cat", f"{desktop.LOG_DIR}/xvfb.log"], timeout=10)
        return result.stdout.strip()[-400:] or "(the X server wrote nothing)"
    return "(no X server log)"


__all__ = ["BUILD_HINT", "IMAGE", "PROGRAM", "alive", "make_root", "options", "start"]
