"""Processes parked in fresh cgroups, so a cold sandbox does not wait for a cgroup join.

Moving a process into a cgroup (writing its pid to ``cgroup.procs``) takes the kernel's
cgroup-wide threadgroup lock in write mode; when no move happened in the last few milliseconds
that waits for an RCU grace period (7-15 ms measured here, per hierarchy). A process *forked*
inside a cgroup needs no move. So, off the critical path, the backend keeps a few shells that
have already joined a fresh, empty cgroup each and wait on their stdin for one line: the
command line (``prlimit ... bwrap ...``) they then exec. A sandbox takes one (with its cgroup,
whose limits it then writes, and, as root, the uid the shell runs as) for its first bwrap;
a worker thread refills the lot. ``CLONE_INTO_CGROUP`` (cgroup v2) would avoid the move
altogether, but neither asyncio nor ``subprocess`` can pass clone3 flags; a parked process
serves v1 and v2 alike.

The shells are started with :class:`subprocess.Popen` in that thread, tied to no event loop;
the sandbox that takes one adopts it into its loop (:class:`AdoptedProcess`: its output pipes
become stream readers, its exit is watched through a pidfd). One left parked sees end-of-file
on its stdin when this process exits and ends by itself; its cgroup is removed at exit, or
swept at the next start-up when this process was killed (the cgroup's name starts with its pid).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import shlex
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rllm.engine.sandbox.cgroups import CgroupHost, SandboxCgroup
from rllm.sdk.sandbox import SandboxError
from rllm.types.errors import NotFoundError

# Joins the cgroups named before "--", then execs the one line read from stdin (written with
# shlex quoting; the shell reads stdin a byte at a time, so what follows the line, the exec's
# wake-up, stays in the pipe for bwrap's shell).
PARK = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; read -r line || exit 111; eval "exec $line"'
MAX_LINE = 32_768  # well under a pipe's buffer, so writing the line never blocks
log = logging.getLogger(__name__)


@dataclass
class Parked:
    """A shell in ``cgroup`` (running as ``uid`` when not None), waiting for its command line."""

    cgroup: SandboxCgroup
    uid: int | None
    popen: subprocess.Popen[bytes]
    wake: int  # the write end of its stdin

    def launch(self, argv: list[str]) -> bool:
        """Have the shell exec ``argv``; False when it cannot carry it (a newline in an
        argument, an over-long line) or has died (the caller then drops it)."""
        line = shlex.join(argv)
        if "\n" in line or len(line) > MAX_LINE:
            return False
        try:
            os.write(self.wake, (line + "\n").encode())
        except OSError:
            return False
        return True

    async def adopt(self) -> AdoptedProcess:
        """The shell as a process of the running loop (its output read as streams)."""
        return await AdoptedProcess.adopt(self.popen)

    def drop(self) -> None:
        """Let the shell go (it ends on end-of-file; killed too, for promptness)."""
        with contextlib.suppress(OSError):
            os.close(self.wake)
        with contextlib.suppress(OSError):
            os.killpg(self.popen.pid, signal.SIGKILL)


class AdoptedProcess:
    """What the sandbox uses of ``asyncio.subprocess.Process`` (pid, returncode, stdout, stderr,
    wait), over a process another thread started: asyncio cannot adopt one."""

    def __init__(
        self, popen: subprocess.Popen[bytes], stdout: asyncio.StreamReader, stderr: asyncio.StreamReader
    ) -> None:
        self.pid, self._popen = popen.pid, popen
        self.stdout, self.stderr = stdout, stderr
        self.returncode: int | None = None
        loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd = os.pidfd_open(popen.pid)
        loop.add_reader(self._pidfd, self._reap, loop)

    @classmethod
    async def adopt(cls, popen: subprocess.Popen[bytes]) -> AdoptedProcess:
        assert popen.stdout is not None and popen.stderr is not None
        loop = asyncio.get_running_loop()
        readers = []
        for pipe in (popen.stdout, popen.stderr):
            reader = asyncio.StreamReader(loop=loop)
            await loop.connect_read_pipe(lambda r=reader: asyncio.StreamReaderProtocol(r, loop=loop), pipe)
            readers.append(reader)
        return cls(popen, readers[0], readers[1])

    def _reap(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        try:
            _, status = os.waitpid(self.pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            code = 255
        self.returncode = self._popen.returncode = code
        if not self._exited.done():
            self._exited.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class ParkingLot:
    """Up to ``size`` parked shells for one cgroup host, refilled by a worker thread;
    ``new_uid`` gives each its uid (None: this process's user), ``free_uid`` takes back the uid
    of a shell that no sandbox took (a sandbox that takes one gives its uid back at close). As
    root under cgroup v1 the shell itself runs as that uid (v1 lets a process move itself into
    a cgroup whose ``cgroup.procs`` it may write); under v2 it stays root until its command
    drops privileges."""

    def __init__(
        self,
        cgroups: CgroupHost,
        new_uid: Callable[[], int | None],
        free_uid: Callable[[int | None], None],
        size: int = 2,
    ) -> None:
        self.cgroups, self.new_uid, self.free_uid, self.size = cgroups, new_uid, free_uid, size
        self._ready: deque[Parked] = deque()
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        atexit.register(self.close)

    @property
    def ready(self) -> int:
        """How many shells are parked now."""
        return len(self._ready)

    def take(self) -> Parked | None:
        """A parked shell (None when none is ready); the lot is refilled either way."""
        found = None
        with self._lock:
            while self._ready and found is None:
                parked = self._ready.popleft()
                if parked.popen.poll() is None:
                    found = parked
                else:
                    parked.drop()
                    _remove_soon(parked.cgroup)
                    self.free_uid(parked.uid)  # its shell has exited
        self.fill()
        return found

    def fill(self) -> None:
        """Have the worker thread park shells up to ``size`` (started on first use)."""
        if self._closed:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rllm-sandbox-park", daemon=True)
            self._thread.start()
        self._wanted.set()

    def _run(self) -> None:
        while not self._closed:
            self._wanted.wait()
            self._wanted.clear()
            while not self._closed and len(self._ready) < self.size:
                try:
                    parked = self._park_one()
                except (OSError, SandboxError) as exc:
                    log.warning("could not park a shell in a new cgroup (cold starts join theirs): %s", exc)
                    break
                with self._lock:
                    self._ready.append(parked)

    def _park_one(self) -> Parked:
        cgroup = self.cgroups.make()
        if cgroup is None:
            raise NotFoundError("no cgroup could be made here")  # an OSError: the loop above logs it
        try:
            uid = self.new_uid()
        except BaseException:
            with contextlib.suppress(OSError):
                cgroup.remove(timeout_s=0)
            raise
        as_uid = uid is not None and self.cgroups.version == "v1"
        read_end, wake = os.pipe()
        try:
            if as_uid and uid is not None:
                for procs in cgroup.procs_files:
                    os.chown(procs, uid, uid)
            popen = subprocess.Popen(
                ["/bin/sh", "-c", PARK, "rllm-park", *cgroup.procs_files, "--"],
                stdin=read_end,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                user=uid if as_uid else None,
                group=uid if as_uid else None,
                extra_groups=[] if as_uid else None,
            )
        except BaseException:
            os.close(wake)
            with contextlib.suppress(OSError):
                cgroup.remove(timeout_s=0)
            self.free_uid(uid)
            raise
        finally:
            os.close(read_end)
        return Parked(cgroup, uid, popen, wake)

    def close(self) -> None:
        """Drop every parked shell and remove its cgroup (also at interpreter exit)."""
        self._closed = True
        self._wanted.set()
        with self._lock:
            dropped, self._ready = list(self._ready), deque()
        for parked in dropped:
            parked.drop()
            with contextlib.suppress(subprocess.TimeoutExpired):
                parked.popen.wait(timeout=1.0)
                self.free_uid(parked.uid)  # (one that outlives the wait keeps it till exit)
            with contextlib.suppress(OSError):
                parked.cgroup.remove(timeout_s=1.0)


_lots: dict[tuple[object, ...], ParkingLot] = {}


def _forget_in_child() -> None:
    """A forked child must neither use nor (at its exit) kill its parent's parked shells: it
    closes its copies of their pipes and starts with empty lots of its own."""
    for lot in _lots.values():
        for parked in lot._ready:
            with contextlib.suppress(OSError):
                os.close(parked.wake)
        lot._ready, lot._thread = deque(), None
        lot._lock, lot._wanted = threading.Lock(), threading.Event()


os.register_at_fork(after_in_child=_forget_in_child)


def lot_for(
    cgroups: CgroupHost, new_uid: Callable[[], int | None], free_uid: Callable[[int | None], None]
) -> ParkingLot:
    """The process's one lot for this cgroup host (backends sharing a host share it)."""
    key = (cgroups.version, tuple(sorted((k, str(v)) for k, v in cgroups.bases.items())), os.geteuid())
    if key not in _lots:
        _lots[key] = ParkingLot(cgroups, new_uid, free_uid)
    return _lots[key]


def _remove_soon(cgroup: SandboxCgroup) -> None:
    """Remove ``cgroup`` once its shell has exited, in a daemon thread (never on the loop)."""

    def remove() -> None:
        with contextlib.suppress(OSError):
            cgroup.remove(timeout_s=5.0)

    threading.Thread(target=remove, name="rllm-cgroup-remove", daemon=True).start()
