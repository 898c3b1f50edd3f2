"""The local sandbox: every command runs under bubblewrap (``bwrap``) with hard limits.

What a command sees: the host's system read-only (/usr, /etc, the /bin-style links), a private
writable workdir (a host folder only this sandbox mounts), a private /tmp (a size-capped tmpfs),
its own /proc and /dev, no network unless the spec allows it, a cleared environment, and its own
PID namespace, user, IPC and UTS namespaces. Limits (``prlimit`` around bwrap, so they bind bwrap
and everything under it): CPU seconds and address space per process, file size, no core dumps,
and processes. As root, each sandbox runs as a uid of its own (leased host-wide, ``uids``),
which makes the process limit per sandbox and keeps sandbox code from being root on the host;
as a normal user, the process limit is set inside each exec's user namespace, so it counts that
exec's processes only.

Each exec runs in a fresh PID namespace over the sandbox's files, so nothing it starts outlives
it (a background process, a fork bomb): when the command ends, the kernel kills the rest of its
namespace. ``--die-with-parent`` does the same when the process holding the sandbox dies. One
bwrap is kept started and blocked on a pipe, so the next exec only writes its script and wakes
it (the warm path); bwrap itself is never skipped: when it cannot create its namespaces the
backend refuses with ``SandboxUnavailable`` and runs nothing.

Here: the backend (the one-time check, the mode it runs in) and a sandbox's host side (its
folder, uid, cgroup, files, desktop, harness bridge, piped processes, close). The command line its bwraps run
under is :mod:`rllm.engine.sandbox.bwrap_command`; starting, waking, reading and killing them,
:mod:`rllm.engine.sandbox.bwrap_exec`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rllm.engine.sandbox import (
    desktop,
    host_files,
    mounts,
    network,
    outbound,
    parked,
    piped,
    safe_delete,
    session_bridge,
    stale,
    uids,
)
from rllm.engine.sandbox.bwrap_command import CTL, sandbox_command
from rllm.engine.sandbox.bwrap_exec import BwrapExecs
from rllm.engine.sandbox.cgroups import CgroupHost, SandboxCgroup, detect
from rllm.sdk.desktop_channel import HelperChannel
from rllm.sdk.sandbox import (
    ExecResult,
    HarnessHookup,
    SandboxError,
    SandboxSpec,
    SandboxUnavailable,
)

TRANSFER_TIMEOUT_S = 120.0  # one file transfer; a slower one fails rather than stalls the rollout
log = logging.getLogger(__name__)
T = TypeVar("T")


class BubblewrapBackend:
    """Creates :class:`BubblewrapSandbox` es. ``ro_binds`` adds host folders (read-only, same
    path), e.g. a Python outside /usr. ``base_dir`` holds the sandboxes' host folders."""

    name = "bubblewrap"

    def __init__(
        self,
        *,
        bwrap: str = "bwrap",
        base_dir: str | None = None,
        ro_binds: tuple[str, ...] = (),
        cgroup_parent: str | None = None,
    ) -> None:
        self.bwrap = bwrap
        # One default folder per user: root's is enterable by the sandbox uids but not writable
        # by other users, who get their own.
        default = "rllm-sandboxes" if _is_root() else f"rllm-sandboxes-{os.geteuid()}"
        self.base_dir = Path(base_dir or Path(tempfile.gettempdir()) / default)
        self.ro_binds = tuple(ro_binds)
        self.cgroup_parent = cgroup_parent
        self.cgroups = CgroupHost("none", reason="not checked yet")
        self.disk_capped = False  # the workdir is a sized tmpfs (needs root to mount)
        self.lot: parked.ParkingLot | None = None  # shells parked in fresh cgroups (cold starts)
        self._checked: asyncio.Future[None] | None = None

    async def check(self) -> None:
        """Prove once that bwrap can create every namespace here; raise SandboxUnavailable if not."""
        if self._checked is None:
            self._checked = asyncio.ensure_future(self._probe())
        await asyncio.shield(self._checked)

    async def _probe(self) -> None:
        for tool in (self.bwrap, "prlimit"):
            if shutil.which(tool) is None:
                raise SandboxUnavailable(
                    f"{tool!r} is not installed; the local sandbox needs bubblewrap and util-linux's prlimit "
                    "(apt-get install bubblewrap) and never runs commands unsandboxed"
                )
        if _is_root():
            _check_traversable(self.base_dir)
        # Sandboxes of a harness killed with SIGKILL (tmpfs workdirs still mounted) go first.
        await asyncio.to_thread(stale.sweep, self.base_dir)
        self.cgroups = detect(self.cgroup_parent)
        self.disk_capped = _is_root() and mounts.can_mount(self.base_dir)
        lot = self.cgroups.version != "none"
        self.lot = parked.lot_for(self.cgroups, _new_uid, uids.give_back) if lot else None
        sandbox = BubblewrapSandbox(self, SandboxSpec())
        try:
            result = await sandbox.exec("true", timeout=30)
        finally:
            await sandbox.close()
        if not result.ok:
            raise SandboxUnavailable(
                f"bubblewrap cannot create its namespaces here (exit {result.exit_code}: "
                f"{result.stderr.strip()[:300]}); refusing to run commands unsandboxed"
            )
        (log.info if self.cgroups.version != "none" and self.disk_capped else log.warning)("%s", self.mode())

    def mode(self) -> str:
        """One line: which of the per-sandbox caps this backend enforces here, and why not the rest."""
        caps = (
            f"per-sandbox memory, processes and CPU through cgroup {self.cgroups.version}"
            if self.cgroups.version != "none"
            else "WEAKER MODE: no writable cgroups, so memory is capped per process (address space) "
            f"and processes per uid (as a normal user: per exec), not per sandbox ({self.cgroups.reason})"
        )
        disk = (
            "the workdir is a tmpfs of disk_mb"
            if self.disk_capped
            else "the workdir is an uncapped host folder (only file_size_mb per file): mounting a "
            "sized tmpfs that outlives each exec needs root"
        )
        return f"bubblewrap sandbox: {caps}; {disk}"

    async def create(self, spec: SandboxSpec) -> BubblewrapSandbox:
        """A started sandbox of ``spec``: files written, setup run, a bwrap ready for the first exec."""
        await self.check()
        if spec.network:
            network.check_available()
        if spec.desktop is not None:
            desktop.check_tools()
        sandbox = BubblewrapSandbox(self, spec)
        try:
            await sandbox.prepare()
        except BaseException:
            await sandbox.close()
            raise
        return sandbox


class BubblewrapSandbox:
    """One sandbox: a private host folder (workdir + control scripts) and the limits of its spec."""

    def __init__(self, backend: BubblewrapBackend, spec: SandboxSpec) -> None:
        self.backend, self.spec = backend, spec
        backend.base_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
        self.root = Path(tempfile.mkdtemp(prefix="sb-", dir=backend.base_dir))
        stale.write_marker(self.root)  # lets the next start-up sweep it if this process is killed
        self.root.chmod(0o711)  # the sandbox's uid mounts its own folders, so it must reach them
        (self.root / "work").mkdir(mode=0o700)
        (self.root / "ctl").mkdir(mode=0o755)
        # The first bwrap starts from a shell already in a fresh cgroup when one is parked (not
        # for networked specs: their bwrap needs descriptors passed at its start).
        self._parked = backend.lot.take() if backend.lot is not None and not spec.network else None
        self.uid = self._parked.uid if self._parked is not None else _new_uid()
        self._mounts: list[Path] = []  # sized tmpfs folders, unmounted at close
        self._dropped: list[subprocess.Popen[bytes]] = []  # parked shells let go, to wait for
        self.cgroup: SandboxCgroup | None = self._parked.cgroup if self._parked is not None else None
        try:
            if backend.disk_capped:
                self._mounts.append(self.root / "work")
                mounts.mount_tmpfs(self.root / "work", f"{spec.limits.disk_mb}m", self.uid)
            host_files.give_to(self.root / "work", self.uid)
            if spec.desktop is not None:
                self._mounts.append(self.root / "display")
                desktop.make_folders(self.root, self.uid, sized=backend.disk_capped)
            if self.cgroup is not None:
                self.cgroup.apply(spec.limits)
            else:
                self.cgroup = backend.cgroups.create(spec.limits)
        except BaseException as exc:
            self._drop_parked()
            self._remove()
            if isinstance(exc, OSError):
                raise SandboxError(f"could not set up the sandbox's folder or cgroup: {exc}") from exc
            raise
        command = sandbox_command(
            backend.bwrap, backend.ro_binds, backend.cgroups.version, spec, self.root, self.uid, self.cgroup
        )
        # Its bwraps (the first one maybe from the parked shell, which is theirs from here on).
        self._execs = BwrapExecs(self.root, spec, command, self._parked, self._dropped)
        self._parked = None
        self._desktop: asyncio.subprocess.Process | None = None  # the desktop session's bwrap
        self._bridge: session_bridge.SessionBridge | None = None  # a command harness's gateway bridge
        self._piped: list[piped.SandboxProcess] = []  # long-running processes piped to the host
        self.desktop_helper: HelperChannel | None = None  # the session's input/screenshot helper

    @property
    def closed(self) -> bool:
        return self._execs.closed

    @property
    def started_parked(self) -> bool:
        """Whether its first bwrap was exec'd by a parked shell."""
        return self._execs.started_parked

    async def prepare(self) -> None:
        for rel, text in self.spec.files.items():
            await self.write_file(rel, text)
        if self.spec.setup:
            (self.root / "ctl" / "setup.sh").write_text(self.spec.setup)
            try:
                result = await self.exec(["/bin/sh", f"{CTL}/setup.sh"], timeout=self.spec.setup_timeout_s)
            finally:
                # The agent must not read the setup script (it may hold the task's answer).
                (self.root / "ctl" / "setup.sh").unlink(missing_ok=True)
            if not result.ok:
                why = "timed out" if result.timed_out else f"exit {result.exit_code}"
                raise SandboxError(f"sandbox setup script failed ({why}): {result.stderr.strip()[-500:]}")
        if self.spec.desktop is not None:
            await self._start_desktop()
        await self._execs.ready()

    async def _start_desktop(self) -> None:
        """Start the desktop session (a bwrap of this sandbox that lives until close) and return
        once its X server accepts clients and its apps are started."""
        self.desktop_helper = channel = await desktop.listen(self.root, self.uid, self.spec)
        script = desktop.session_script(self.spec, helper=channel.state == "new")
        self._desktop = proc = await self._execs.start_resident(desktop.session_binds(self.root), script)
        assert proc.stdout is not None
        try:
            helper = await desktop.wait_ready(proc.stdout)
        except SandboxError as exc:
            raise SandboxError(f"{exc}; X server log: {desktop.startup_log(self.root / 'work')}") from None
        if not helper:
            channel.unavailable("the sandbox has no python3 to run it")

    # ------------------------------------------------------------------ exec
    async def exec(
        self, cmd: str | list[str], timeout: float | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        self._check_open()
        timeout = self.spec.limits.exec_timeout_s if timeout is None else timeout
        return await self._execs.run(cmd, timeout, env or {})

    async def start_process(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        socket_dir: str | None = None,
    ) -> piped.SandboxProcess:
        """``argv`` as a long-running process of this sandbox with its stdin and stdout piped to
        the host (``rllm.engine.sandbox.piped``), and, with ``socket_dir``, a folder of its own
        there for unix sockets the host connects to; killed at close if it has not ended before."""
        self._check_open()
        process = await piped.start(self._execs, argv, env or {}, cwd, socket_dir, self.uid)
        self._piped.append(process)
        return process

    async def hook_up_harness(self, base_url: str, api_key: str, files: dict[str, bytes]) -> HarnessHookup:
        """Bridge a command harness in this sandbox to the session ``base_url`` and nothing else
        (``rllm.engine.sandbox.session_bridge``); once per sandbox, closed with it."""
        self._check_open()
        if self._bridge is not None:
            raise SandboxError("this sandbox already bridges a harness to a session")
        self._bridge, hookup = await session_bridge.hook_up(
            self.root / "ctl", CTL, self.uid, base_url, api_key, files
        )
        return hookup

    # ------------------------------------------------------------------ files
    # Off the event loop and under a timeout: file work on the agent's folder must not be able
    # to stall every other rollout of the loop (host_files itself never blocks on a FIFO).
    async def write_file(self, path: str, data: bytes | str) -> None:
        self._check_open()
        raw = data.encode() if isinstance(data, str) else data
        await _off_loop(host_files.write_into, self.root / "work", self.spec.workdir, path, raw, self.uid)

    async def read_file(self, path: str) -> bytes:
        self._check_open()
        return await _off_loop(outbound.read_from, self.root / "work", self.spec.workdir, path, self._bound)

    async def upload(self, local_path: str, path: str) -> None:
        self._check_open()
        await _off_loop(
            host_files.upload_into, self.root / "work", self.spec.workdir, local_path, path, self.uid
        )

    async def download(self, path: str, local_path: str) -> None:
        self._check_open()
        work, bound = self.root / "work", self._bound
        await _off_loop(outbound.download_from, work, self.spec.workdir, path, local_path, bound)

    @property
    def _bound(self) -> int:
        """The most one read_file or download brings out (outbound.Budget): the disk cap."""
        return self.spec.limits.disk_mb * 1024 * 1024

    # ------------------------------------------------------------------ lifecycle
    async def is_alive(self) -> bool:
        if self.closed or not (self.root / "work").is_dir():
            return False
        if self._desktop is not None and self._desktop.returncode is not None:
            return False
        return self._execs.warm_alive()

    async def close(self) -> None:
        """Kill everything the sandbox runs and delete its folder. Idempotent; safe to call
        from a cancelled task (kills are synchronous)."""
        if self.closed:
            return
        if self.desktop_helper is not None:
            self.desktop_helper.close()
        procs = self._execs.kill_all()
        try:
            # Killed above; closing each reads away what it left on stdout, without which a
            # process whose stdout nobody read to the end is never seen to be gone.
            for process in self._piped:
                await asyncio.shield(process.close())
            if self._bridge is not None:  # after the kills: nothing in the sandbox uses it any more
                await asyncio.shield(self._bridge.close())
            await self._execs.wait_gone(procs)
        finally:
            # Deleting the folder (50k files: ~1 s) and the cgroup runs in a worker thread.
            await asyncio.shield(asyncio.to_thread(self._remove))

    def _remove(self) -> None:
        """Unmount and delete the sandbox's folder and remove its cgroup (blocking)."""
        while self._mounts:
            mounts.detach(self._mounts.pop())
        if not safe_delete.remove_tree(self.root):
            log.warning("sandbox %s: its folder was not entirely deleted", self.root)
        for popen in self._dropped:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=5.0)
        if self.cgroup is not None:
            try:
                self.cgroup.remove()
            except OSError as exc:
                log.warning("sandbox %s: its cgroup was not removed: %s", self.root.name, exc)
        uids.give_back(self.uid)  # its processes are gone: the uid may serve another sandbox

    def _drop_parked(self) -> None:
        """Let go of the parked shell taken for a sandbox whose setup failed; its cgroup is the
        sandbox's (``_remove`` waits for the shell's exit, then removes it)."""
        shell, self._parked = self._parked, None
        if shell is not None:
            shell.drop()
            self._dropped.append(shell.popen)

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxError("the sandbox is closed")

    def __repr__(self) -> str:
        return f"<BubblewrapSandbox {self.root.name} uid={self.uid} closed={self.closed}>"


async def _off_loop(fn: Callable[..., T], *args: object) -> T:
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn, *args), TRANSFER_TIMEOUT_S)
    except TimeoutError:
        raise SandboxError(f"a file transfer took longer than {TRANSFER_TIMEOUT_S:g} s") from None


def _check_traversable(path: Path) -> None:
    """As root, sandboxes run as other uids, which must be able to reach their host folders."""
    for parent in [*reversed(path.parents), path]:
        if parent.exists() and not parent.stat().st_mode & 0o001:
            raise SandboxUnavailable(
                f"sandbox base_dir {path} is under {parent}, which other users cannot enter (mode "
                f"{parent.stat().st_mode & 0o777:o}); sandboxes run as their own uids: pick a base_dir like /tmp/rllm-sandboxes"
            )


def _new_uid() -> int | None:
    """As root, a uid of its own for a new sandbox, leased host-wide (None otherwise)."""
    return uids.take() if _is_root() else None


def _is_root() -> bool:
    return os.geteuid() == 0
