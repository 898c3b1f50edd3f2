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
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict, TypeVar, cast

from rllm.engine.sandbox import (
    desktop,
    host_files,
    mounts,
    network,
    outbound,
    parked,
    safe_delete,
    session_bridge,
    stale,
    uids,
)
from rllm.engine.sandbox.cgroups import CgroupHost, SandboxCgroup, detect
from rllm.sdk.desktop_channel import HelperChannel
from rllm.sdk.sandbox import (
    ExecResult,
    HarnessHookup,
    SandboxError,
    SandboxSpec,
    SandboxUnavailable,
    truncate_output,
)

CTL = "/.rllm"  # the sandbox's read-only view of its control folder (exec scripts)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
TRANSFER_TIMEOUT_S = 120.0  # one file transfer; a slower one fails rather than stalls the rollout
# Joins the cgroups named before "--" (its own pid, before anything else runs), then execs the rest.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
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

    def argv(self, spec: SandboxSpec, root: Path, nproc: int | None) -> list[str]:
        """The full command line (prlimit, then bwrap) that a command of this sandbox runs under
        (``nproc``: the process limit around bwrap; None when it is set inside instead)."""
        lim = spec.limits
        args = [
            "prlimit",
            f"--cpu={lim.cpu_s}",
            f"--as={lim.memory_mb * 1024 * 1024}",
            f"--fsize={lim.file_size_mb * 1024 * 1024}",
            *([f"--nproc={nproc}"] if nproc is not None else []),
            "--core=0",
            "--nofile=1024",
            "--",
            self.bwrap,
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
        ]
        # network=True still gets a network namespace of its own (--unshare-all): slirp4netns
        # gives it outbound NAT with the host's loopback cut off (see rllm.engine.sandbox.network).
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        args += ["--proc", "/proc", "--dev", "/dev"]
        # Every writable mount is sized: /tmp and /dev/shm here, the workdir on the host; the
        # root and /dev (tmpfs of half the host's RAM each) are made read-only below.
        args += ["--size", str(lim.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        if spec.desktop is not None:  # the sandbox's own X socket folder, never the host's
            args += desktop.exec_binds(root)
        args += ["--size", str(lim.shm_mb * 1024 * 1024), "--tmpfs", "/dev/shm"]
        # After the tmpfs mounts: a folder under /tmp (a venv in a checkout there) stays visible.
        for path in self.ro_binds:
            args += ["--ro-bind", path, path]
        args += ["--bind", str(root / "work"), spec.workdir, "--ro-bind", str(root / "ctl"), CTL]
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]
        args += ["--chdir", spec.workdir, "--clearenv"]
        base_env = {"PATH": PATH, "HOME": spec.workdir, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
        if spec.desktop is not None:
            base_env["DISPLAY"] = desktop.DISPLAY
        for key, value in {**base_env, **spec.env}.items():
            args += ["--setenv", key, value]
        return args


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
        self.started_parked = False  # whether its first bwrap was exec'd by a parked shell
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
        # RLIMIT_NPROC counts a uid's processes. As root, the sandbox's own uid: bwrap's two
        # processes count too. As a normal user, every process of that user would count, and
        # they come and go (zombies of earlier sandboxes wait for the host's init to reap them),
        # so a limit around bwrap could not be exact. Since Linux 5.14 the count is also kept per
        # user namespace: the limit is set inside the exec's namespace (the command and bwrap's
        # init there), where only that exec's processes count.
        self._inner_nproc: int | None = None
        if self.uid is not None:
            nproc: int | None = spec.limits.max_procs + 2
        elif _nproc_per_userns():
            nproc, self._inner_nproc = None, spec.limits.max_procs + 1
        else:
            nproc = spec.limits.max_procs + 2 + _processes_of(os.geteuid())
        argv = backend.argv(spec, self.root, nproc)
        self._user = _as_user(self.uid)
        self._launch = argv  # what runs once the cgroup is joined (a parked shell execs this)
        if self.cgroup is not None:
            # A shell joins the cgroup before anything else runs, then execs bwrap. cgroup v1 lets
            # a process move itself when it may write cgroup.procs, so it runs as the sandbox's
            # uid from the start; v2 asks for write access to the common ancestor, so there the
            # shell runs as root and setpriv drops to the uid (one exec more, ~1-5 ms).
            join = ["/bin/sh", "-c", _JOIN, "rllm-join", *self.cgroup.procs_files, "--"]
            if self.uid is not None and backend.cgroups.version == "v1":
                for procs in self.cgroup.procs_files:
                    os.chown(procs, self.uid, self.uid)
                argv = [*join, *argv]
            elif self.uid is not None:
                drop = ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--"]
                argv = [*join, *drop, *argv]
                self._launch = [*drop, *self._launch]
                self._user = _UserOptions()
            else:
                argv = [*join, *argv]
        self._argv = argv
        self._ids = itertools.count()
        self._warm: tuple[int, asyncio.subprocess.Process, int] | None = None
        self._refill: asyncio.Task[None] | None = None
        self._running: set[asyncio.subprocess.Process] = set()
        self._dying: list[int] = []  # host pids of killed namespaces' inits
        self._nets: dict[asyncio.subprocess.Process, network.Wiring] = {}  # networked bwraps' wiring
        self._lingering: network.Wiring | None = None  # the last ended exec's (network.py: draining)
        self._desktop: asyncio.subprocess.Process | None = None  # the desktop session's bwrap
        self._bridge: session_bridge.SessionBridge | None = None  # a command harness's gateway bridge
        self.desktop_helper: HelperChannel | None = None  # the session's input/screenshot helper
        self.closed = False

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
        if self._refill is not None:
            await self._refill
        if self._warm is None:
            self._warm = await self._spawn()

    async def _start_desktop(self) -> None:
        """Start the desktop session (a bwrap of this sandbox that lives until close) and return
        once its X server accepts clients and its apps are started."""
        self.desktop_helper = channel = await desktop.listen(self.root, self.uid, self.spec)
        number, proc, wake = await self._spawn(extra=desktop.session_binds(self.root))
        self._running.add(proc)  # killed with the sandbox, never discarded before
        self._desktop = proc
        script = desktop.session_script(self.spec, helper=channel.state == "new")
        (self.root / "ctl" / f"{number}.sh").write_text(script)
        _wake(wake)
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
        started = time.monotonic()
        spawned = await self._take_warm()
        number, proc, wake = spawned or await self._spawn()
        self._running.add(proc)
        try:
            (self.root / "ctl" / f"{number}.sh").write_text(_script(cmd, env or {}))
            if not _wake(wake) and spawned is not None:
                # The waiting bwrap died (e.g. killed by a limit): use a fresh one. If that one
                # dies too, bwrap itself failed; its exit code and message are the result.
                self._running.discard(proc)
                self._killed(proc)
                number, proc, wake = await self._spawn()
                self._running.add(proc)
                (self.root / "ctl" / f"{number}.sh").write_text(_script(cmd, env or {}))
                _wake(wake)
            result = await self._finish(proc, timeout)
            result.duration_s = time.monotonic() - started
            return result
        finally:
            self._killed(proc)  # no-op when it ended; on error or cancellation it must not live on
            self._running.discard(proc)
            with contextlib.suppress(FileNotFoundError):
                (self.root / "ctl" / f"{number}.sh").unlink()
            # Started after the command ended, so the spare never competes for its process budget.
            if not self.closed and (self._refill is None or self._refill.done()):
                self._refill = asyncio.create_task(self._keep_warm())

    async def _take_warm(self) -> tuple[int, asyncio.subprocess.Process, int] | None:
        if self._warm is None and self._refill is not None and not self._refill.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._refill)  # a cancelled exec leaves the spare to others
        spawned, self._warm = self._warm, None
        if spawned is not None and spawned[1].returncode is not None:
            os.close(spawned[2])
            self._killed(spawned[1])  # (only drops a networked one's wiring: it has ended)
            return None
        return spawned

    async def _spawn(self, extra: list[str] | None = None) -> tuple[int, asyncio.subprocess.Process, int]:
        """Start a bwrap that waits (on its stdin pipe) for its exec script, then runs it
        (``extra``: bwrap arguments for this one, e.g. the desktop session's own mounts)."""
        number = next(self._ids)
        if self._inner_nproc is not None:
            run = f"exec prlimit --nproc={self._inner_nproc} -- /bin/sh {CTL}/{number}.sh </dev/null"
        else:  # the script is read by this shell itself: one exec fewer on the warm path
            run = f"exec </dev/null; . {CTL}/{number}.sh"
        inner = f"read _ || exit 111; {run}"
        extra = extra or []
        argv, fds, net = [*self._argv, *extra], (), None
        if self._parked is not None:
            shell, self._parked = self._parked, None
            try:
                adopted = await shell.adopt()
            except BaseException:
                self._drop_parked(shell)
                raise
            if shell.launch([*self._launch, *extra, "/bin/sh", "-c", inner]):
                self.started_parked = True
                # Typed as asyncio's Process: AdoptedProcess has the part of it used here.
                return number, cast(asyncio.subprocess.Process, adopted), shell.wake
            self._drop_parked(shell)
        read_end, wake = os.pipe()
        if self.spec.network:
            net = network.Wiring(self.root / f"slirp-{number}.log")
            argv += net.bwrap_args()
            inner, fds = net.announce(inner), net.child_fds
        started = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *argv,
                "/bin/sh",
                "-c",
                inner,
                stdin=read_end,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                pass_fds=fds,
                # Not the host's environment: bwrap itself is the sandbox's pid 1, whose
                # /proc/1/environ the command can read (API keys would leak through it).
                env={"PATH": os.environ.get("PATH", PATH)},
                **_spawn_as(self._user),
            )
        )
        started.add_done_callback(lambda _: os.close(read_end))
        if net is not None:
            started.add_done_callback(lambda _: net.started())
        try:
            proc = await asyncio.shield(started)
            if net is not None:
                self._nets[proc] = net
                assert proc.stderr is not None
                await net.connect(proc.stderr)
        except BaseException:
            # Cancelled mid-creation, asyncio can wait forever for the half-made subprocess
            # (seen under load): the creation runs to its end and what it started is killed.
            os.close(wake)
            started.add_done_callback(_kill_if_started)
            if started.done() and not started.cancelled() and started.exception() is None:
                self._killed(started.result())
            if net is not None:
                net.close()
            raise
        return number, proc, wake

    async def _keep_warm(self) -> None:
        if self._warm is None and not self.closed:
            spawned = await self._spawn()
            if self.closed or self._warm is not None:
                os.close(spawned[2])
                self._killed(spawned[1])
                await spawned[1].wait()
            else:
                self._warm = spawned

    async def _finish(self, proc: asyncio.subprocess.Process, timeout: float) -> ExecResult:
        limit = self.spec.limits.output_bytes
        # Past this much output the command is killed; below it, it is only truncated.
        kill_after = max(limit * 16, 8 * 1024 * 1024)
        assert proc.stdout is not None and proc.stderr is not None
        out = asyncio.ensure_future(_read_capped(proc.stdout, limit, kill_after, proc))
        err = asyncio.ensure_future(_read_capped(proc.stderr, limit, kill_after, proc))
        timed_out = False
        try:
            async with asyncio.timeout(timeout):
                await proc.wait()
        except TimeoutError:
            timed_out = True
            self._killed(proc)
            await proc.wait()
        (out_bytes, out_total), (err_bytes, err_total) = await asyncio.gather(out, err)
        stdout, cut_out = truncate_output(out_bytes, limit, out_total)
        stderr, cut_err = truncate_output(err_bytes, limit, err_total)
        code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        return ExecResult(
            exit_code=128 - code if code < 0 else code,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            truncated=cut_out or cut_err,
        )

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
        return self._warm is None or self._warm[1].returncode is None

    async def close(self) -> None:
        """Kill everything the sandbox runs and delete its folder. Idempotent; safe to call
        from a cancelled task (kills are synchronous)."""
        if self.closed:
            return
        self.closed = True
        procs = set(self._running)
        self._drop_parked()
        if self.desktop_helper is not None:
            self.desktop_helper.close()
        if self._warm is not None:
            os.close(self._warm[2])
            procs.add(self._warm[1])
            self._warm = None
        for proc in procs:
            self._killed(proc)
        if self._lingering is not None:
            self._lingering.close()
        try:
            if self._bridge is not None:  # after the kills: nothing in the sandbox uses it any more
                await asyncio.shield(self._bridge.close())
            # A spare being started is let finish and killed (_keep_warm sees ``closed``), not
            # cancelled: a cancelled subprocess creation can hang asyncio.run's shutdown forever.
            if self._refill is not None and not self._refill.done():
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(self._refill), 30)
            for proc in procs:
                await proc.wait()
            # Killed commands' namespaces die asynchronously; close returns once they are gone.
            for pid in self._dying:
                await _namespace_gone(pid)
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

    def _drop_parked(self, shell: parked.Parked | None = None) -> None:
        """Let go of a parked shell not used; its cgroup is the sandbox's (``_remove`` waits
        for the shell's exit, then removes it)."""
        shell = shell or self._parked
        self._parked = None
        if shell is not None:
            shell.drop()
            self._dropped.append(shell.popen)

    def _killed(self, proc: asyncio.subprocess.Process) -> None:
        net = self._nets.pop(proc, None)
        if net is not None and proc.returncode is not None:  # ended by itself: its slirp4netns
            net, self._lingering = self._lingering, net  # drains until the next one ends
        if net is not None:
            net.close()  # slirp4netns exits with its exit fd closed; the child watcher reaps it
        inner = _kill(proc)
        if inner is not None:
            self._dying.append(inner)

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


async def _read_capped(
    stream: asyncio.StreamReader, limit: int, kill_after: int, proc: asyncio.subprocess.Process
) -> tuple[bytes, int]:
    kept, total = bytearray(), 0
    while chunk := await stream.read(65536):
        total += len(chunk)
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
        if total > kill_after:
            _kill(proc)
    return bytes(kept), total


def _script(cmd: str | list[str], env: dict[str, str]) -> str:
    lines = [f"export {_env_name(k)}={shlex.quote(v)}" for k, v in env.items()]
    body = cmd if isinstance(cmd, str) else shlex.join(cmd)
    lines.append(f"exec /bin/sh -c {shlex.quote(body)}")
    return "\n".join(lines) + "\n"


def _env_name(name: str) -> str:
    if not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise SandboxError(f"env: {name!r} is not a valid variable name")
    return name


def _kill_if_started(started: asyncio.Future[asyncio.subprocess.Process]) -> None:
    if not started.cancelled() and started.exception() is None:
        _kill(started.result())


def _wake(wake: int) -> bool:
    """Let a waiting bwrap run its script; False when it is already gone."""
    try:
        os.write(wake, b"go\n")
        return True
    except BrokenPipeError:
        return False
    finally:
        os.close(wake)


def _kill(proc: asyncio.subprocess.Process) -> int | None:
    """SIGKILL a running bwrap; returns the host pid of its namespace's init, to wait on."""
    if proc.returncode is not None:
        return None
    inner = None
    with (
        contextlib.suppress(OSError, ValueError, IndexError),
        open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f,
    ):
        inner = int(f.read().split()[0])
    # The group is bwrap's (its own session); die-with-parent takes the namespace down with it.
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill()
    return inner


async def _namespace_gone(pid: int, timeout_s: float = 10.0) -> None:
    """Wait until a killed namespace's init has exited: the kernel lets it exit only after every
    other process of its PID namespace is gone. (No event exists for another process's exit.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except (OSError, IndexError):
            return
        await asyncio.sleep(0.005)


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


class _UserOptions(TypedDict, total=False):
    """The create_subprocess_exec keywords that run a process as another user."""

    user: int
    group: int
    extra_groups: list[int]


def _as_user(uid: int | None) -> _UserOptions:
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


def _spawn_as(user: _UserOptions) -> dict[str, Any]:
    """``user`` as create_subprocess_exec keywords the running loop accepts: uvloop (the rollout
    worker processes' loop) refuses user/group/extra_groups, so there the child drops to the
    uid itself between fork and exec."""
    if not user or type(asyncio.get_running_loop()).__module__.startswith("asyncio"):
        return dict(user)
    uid = user.get("user", os.geteuid())
    gid = user.get("group", uid)

    def drop() -> None:  # runs in the forked child, before exec: the order matters (groups first)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return {"preexec_fn": drop}


def _nproc_per_userns() -> bool:
    """Whether RLIMIT_NPROC is counted per user namespace (Linux 5.14's ucounts)."""
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


def _processes_of(uid: int) -> int:
    """How many processes ``uid`` runs now (RLIMIT_NPROC counts them all, not just the sandbox's)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += 1
    return count
