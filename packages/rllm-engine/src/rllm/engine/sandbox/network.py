"""The network of a local sandbox whose spec allows it: a network namespace of its own (its own
loopback), wired to the outside by ``slirp4netns`` (user-mode NAT) with the host's loopback cut
off (``--disable-host-loopback``).

What such a sandbox reaches: its own loopback; by IP, whatever the host itself reaches outbound
(the internet, the LAN, and services on the host's *non-loopback* addresses); DNS through the
host's ``/etc/resolv.conf`` when that names a non-loopback server. What it does not reach:
anything bound to the host's loopback (127.0.0.0/8, ::1) — model gateways, databases, the
harness's own servers — nor the host's network interfaces themselves (no ``--share-net``).

Each exec's bwrap has its own namespace and its own slirp4netns, started when the bwrap is
(ahead of the exec for the warm spare). It is not ended the moment the command ends:
slirp4netns reads one packet per turn of its loop and stops at the first turn that sees its
exit fd closed, so the packets the command sent last (a reply written just before it exited,
still queued on the tap device, which slirp4netns keeps alive) would be dropped. An exec that
ended by itself keeps its slirp4netns until the sandbox's next exec ends (or the sandbox
closes), which lets it forward them and finish the connections' teardown; a killed one's is
ended at once. The steps are synchronised on events,
never on time: bwrap reports its namespaces' pid on ``--info-fd``; the command announces on its
stderr that bwrap's setup is done; slirp4netns joins the user namespace that *owns* the network
namespace (``NS_GET_USERNS``: bwrap nests a second user namespace, which must not be the one
joined) and reports on ``--ready-fd`` once ``tap0`` is configured; only then is the exec woken.

slirp4netns runs as the harness's user with ``--enable-sandbox --enable-seccomp``. As a normal
user it cannot configure bwrap's namespace (bwrap maps no root there), so networked sandboxes need
root; otherwise creating one is refused with SandboxUnavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path

from rllm.sdk.sandbox import SandboxError, SandboxUnavailable

_NS_GET_USERNS = 0xB701  # _IO(0xb7, 0x1): the user namespace owning a namespace
_READY_TIMEOUT_S = 60.0  # a slirp4netns that neither fails nor gets ready in this long is stuck


def check_available() -> None:
    """Refuse networked sandboxes where they cannot be given their own network."""
    if shutil.which("slirp4netns") is None:
        raise SandboxUnavailable(
            "the sandbox spec allows network, which the local sandbox gives through slirp4netns "
            "(its own network namespace, host loopback cut off); it is not installed: "
            "apt-get install slirp4netns"
        )
    if os.geteuid() != 0:
        raise SandboxUnavailable(
            "the sandbox spec allows network, but as a normal user the local sandbox cannot give "
            "it a network namespace of its own (slirp4netns cannot configure bwrap's namespace); "
            "run the harness as root, or use the docker backend"
        )


class Wiring:
    """The pipes and the slirp4netns of one networked bwrap."""

    def __init__(self, log_path: Path) -> None:
        self._info_r, self.info_w = os.pipe()
        self._exit_r, self._exit_w = os.pipe()  # slirp4netns exits when this write end closes
        self.log_path = log_path
        self.slirp: asyncio.subprocess.Process | None = None

    def bwrap_args(self) -> list[str]:
        return ["--info-fd", str(self.info_w)]

    @staticmethod
    def announce(inner: str) -> str:
        """``inner`` preceded by the line (on stderr, read by :meth:`connect` before the command
        is woken) that says bwrap's setup is done."""
        return f"echo up >&2; {inner}"

    @property
    def child_fds(self) -> tuple[int]:
        return (self.info_w,)

    def started(self) -> None:
        """bwrap has been started (or failed to be): the child's ends are closed here."""
        with contextlib.suppress(OSError):
            os.close(self.info_w)
        self.info_w = -1

    async def connect(self, stderr: asyncio.StreamReader) -> None:
        """Wire the started bwrap's namespace to the outside; raise SandboxError if it fails.
        ``stderr`` is the bwrap's: its first line is the command's "up" (or bwrap's error)."""
        try:
            async with asyncio.timeout(_READY_TIMEOUT_S):
                info_r, self._info_r = self._info_r, -1
                info = await _read_to_end(info_r)  # (closes the pipe)
                up = await stderr.readline()
                if not info or up != b"up\n":
                    raise SandboxError(
                        "the networked sandbox's bwrap ended before its setup was done: "
                        + (up + await stderr.read(2000)).decode(errors="replace").strip()
                    )
                pid = int(json.loads(info)["child-pid"])
                netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    owner = fcntl.ioctl(netns, _NS_GET_USERNS)
                finally:
                    os.close(netns)
                ready_r, ready_w = os.pipe()
                try:
                    with open(self.log_path, "wb") as log:
                        self.slirp = await asyncio.create_subprocess_exec(
                            "slirp4netns",
                            "--configure",
                            "--mtu=65520",
                            "--disable-host-loopback",
                            "--enable-sandbox",
                            "--enable-seccomp",
                            f"--userns-path=/proc/self/fd/{owner}",
                            f"--ready-fd={ready_w}",
                            f"--exit-fd={self._exit_r}",
                            str(pid),
                            "tap0",
                            pass_fds=(owner, ready_w, self._exit_r),
                            stdin=asyncio.subprocess.DEVNULL,
                            stdout=log,
                            stderr=log,
                            start_new_session=True,
                        )
                finally:
                    os.close(owner)
                    os.close(ready_w)
                    os.close(self._exit_r)
                    self._exit_r = -1
                ready = await _read_line(ready_r, until=b"1")
                if ready != b"1":
                    raise SandboxError(
                        "slirp4netns could not wire the sandbox's network: "
                        + self.log_path.read_text(errors="replace").strip()[-300:]
                    )
        except TimeoutError:
            raise SandboxError(f"the sandbox's network was not ready within {_READY_TIMEOUT_S:g} s") from None
        except (OSError, ValueError, KeyError) as exc:
            raise SandboxError(f"could not wire the sandbox's network: {exc}") from exc

    def close(self) -> None:
        """End slirp4netns (closing its exit fd) and drop the pipes. Synchronous, idempotent."""
        for fd in (self._info_r, self._exit_r, self._exit_w, self.info_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._info_r = self._exit_r = self._exit_w = self.info_w = -1

    async def wait(self) -> None:
        """Reap slirp4netns once it ended (after close)."""
        if self.slirp is not None:
            await self.slirp.wait()


async def _read_to_end(fd: int) -> bytes:
    """Everything written to the pipe ``fd`` (closed here) until its writers are gone."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    try:
        return await reader.read()
    finally:
        transport.close()


async def _read_line(fd: int, until: bytes = b"\n") -> bytes:
    """The pipe's first line (or first ``until``); the pipe is closed afterwards, so later
    writes by the sandbox get EPIPE."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    try:
        with contextlib.suppress(asyncio.IncompleteReadError):
            return await reader.readuntil(until)
        return b""
    finally:
        transport.close()
