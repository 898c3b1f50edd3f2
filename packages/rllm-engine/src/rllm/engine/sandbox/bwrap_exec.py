"""The bwraps a local sandbox runs its commands in (:mod:`rllm.engine.sandbox.bubblewrap`).

Every exec runs in a fresh bwrap (a fresh PID namespace over the sandbox's files), so nothing it
starts outlives it: when the command ends, the kernel kills the rest of its namespace. A bwrap is
started ahead and blocked on a pipe (``read _`` in its shell), so an exec only writes its script
into the control folder and wakes it (the warm path); the next spare is started once the
command has ended, so it never competes for the command's process budget. The sandbox's first
bwrap may be exec'd by a shell parked in a fresh cgroup (:mod:`rllm.engine.sandbox.parked`).
Output past a cap kills the command; the wall clock kills it too; at close every bwrap is killed
at once and their namespaces waited for, so closing returns once nothing of the sandbox runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import cast

from rllm.engine.sandbox import network, parked
from rllm.engine.sandbox.bwrap_command import CTL, PATH, BwrapCommand, spawn_as
from rllm.sdk.sandbox import ExecResult, SandboxError, SandboxSpec, truncate_output

Spawned = tuple[int, asyncio.subprocess.Process, int]  # (script number, the bwrap, its wake fd)


class BwrapExecs:
    """Starts, wakes, reads and kills the bwraps of one sandbox (host folder ``root``).

    ``parked``: a shell parked in the sandbox's cgroup for its first bwrap (None: none); one not
    used is dropped and its process added to ``dropped``, for the sandbox to wait on at close."""

    def __init__(
        self,
        root: Path,
        spec: SandboxSpec,
        command: BwrapCommand,
        parked_shell: parked.Parked | None,
        dropped: list[subprocess.Popen[bytes]],
    ) -> None:
        self.root, self.spec, self.command = root, spec, command
        self._parked = parked_shell
        self._dropped = dropped
        self.started_parked = False  # whether the first bwrap was exec'd by a parked shell
        self._ids = itertools.count()
        self._warm: Spawned | None = None
        self._refill: asyncio.Task[None] | None = None
        self._running: set[asyncio.subprocess.Process] = set()
        self._dying: list[int] = []  # host pids of killed namespaces' inits
        self._nets: dict[asyncio.subprocess.Process, network.Wiring] = {}  # networked bwraps' wiring
        self._lingering: network.Wiring | None = None  # the last ended exec's (network.py: draining)
        self.closed = False

    # ------------------------------------------------------------------ commands
    async def run(self, cmd: str | list[str], timeout: float, env: dict[str, str]) -> ExecResult:
        """Run ``cmd`` (a shell string or argv) in a fresh bwrap with ``env`` added."""
        started = time.monotonic()
        spawned = await self._take_warm()
        number, proc, wake = spawned or await self.spawn()
        self._running.add(proc)
        try:
            self._write_script(number, _script(cmd, env))
            if not _wake(wake) and spawned is not None:
                # The waiting bwrap died (e.g. killed by a limit): use a fresh one. If that one
                # dies too, bwrap itself failed; its exit code and message are the result.
                self._running.discard(proc)
                self.killed(proc)
                number, proc, wake = await self.spawn()
                self._running.add(proc)
                self._write_script(number, _script(cmd, env))
                _wake(wake)
            result = await self._finish(proc, timeout)
            result.duration_s = time.monotonic() - started
            return result
        finally:
            self.killed(proc)  # no-op when it ended; on error or cancellation it must not live on
            self._running.discard(proc)
            with contextlib.suppress(FileNotFoundError):
                (self.root / "ctl" / f"{number}.sh").unlink()
            # Started after the command ended, so the spare never competes for its process budget.
            if not self.closed and (self._refill is None or self._refill.done()):
                self._refill = asyncio.create_task(self._keep_warm())

    async def start_resident(self, extra: list[str], script: str) -> asyncio.subprocess.Process:
        """A bwrap with the ``extra`` arguments running ``script`` until the sandbox closes (the
        desktop session)."""
        number, proc, wake = await self.spawn(extra=extra)
        self._running.add(proc)  # killed with the sandbox, never discarded before
        self._write_script(number, script)
        _wake(wake)
        return proc

    async def start_piped(
        self, cmd: str | list[str], env: dict[str, str], extra: list[str] | None = None
    ) -> asyncio.subprocess.Process:
        """A fresh bwrap (with the ``extra`` arguments) running ``cmd`` with its stdin, stdout and
        stderr piped to the host, until it exits or the sandbox closes (a long-running server the
        host talks to). Never the warm spare: its stdin is the wake pipe, not the host's."""
        self._check_not_closed()
        _, proc, _ = await self.spawn(extra=extra, piped=_script(cmd, env))
        self._running.add(proc)  # killed with the sandbox at close
        return proc

    def forget(self, proc: asyncio.subprocess.Process) -> None:
        """``proc`` (a piped process that has ended or was killed) is no longer the sandbox's to kill."""
        self.killed(proc)
        self._running.discard(proc)

    def _check_not_closed(self) -> None:
        if self.closed:
            raise SandboxError("the sandbox is closed")

    async def ready(self) -> None:
        """Have a spare bwrap waiting for the first exec."""
        if self._refill is not None:
            await self._refill
        if self._warm is None:
            self._warm = await self.spawn()

    def warm_alive(self) -> bool:
        return self._warm is None or self._warm[1].returncode is None

    def _write_script(self, number: int, script: str) -> None:
        (self.root / "ctl" / f"{number}.sh").write_text(script)

    async def _take_warm(self) -> Spawned | None:
        if self._warm is None and self._refill is not None and not self._refill.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._refill)  # a cancelled exec leaves the spare to others
        spawned, self._warm = self._warm, None
        if spawned is not None and spawned[1].returncode is not None:
            os.close(spawned[2])
            self.killed(spawned[1])  # (only drops a networked one's wiring: it has ended)
            return None
        return spawned

    async def spawn(self, extra: list[str] | None = None, piped: str | None = None) -> Spawned:
        """Start a bwrap that waits (on its stdin pipe) for its exec script, then runs it
        (``extra``: bwrap arguments for this one, e.g. the desktop session's own mounts).
        ``piped``: the script to run at once instead, with stdin a pipe from the host (the wake
        fd returned is then -1)."""
        number = next(self._ids)
        if piped is not None:
            self._write_script(number, piped)
            nproc = self.command.inner_nproc
            limit = f"prlimit --nproc={nproc} -- " if nproc is not None else ""
            inner = f"exec {limit}/bin/sh {CTL}/{number}.sh"
        elif self.command.inner_nproc is not None:
            run = f"exec prlimit --nproc={self.command.inner_nproc} -- /bin/sh {CTL}/{number}.sh </dev/null"
            inner = f"read _ || exit 111; {run}"
        else:  # the script is read by this shell itself: one exec fewer on the warm path
            inner = f"read _ || exit 111; exec </dev/null; . {CTL}/{number}.sh"
        extra = extra or []
        argv, fds, net = [*self.command.argv, *extra], (), None
        if self._parked is not None and piped is None:
            shell, self._parked = self._parked, None
            try:
                adopted = await shell.adopt()
            except BaseException:
                self.drop_parked(shell)
                raise
            if shell.launch([*self.command.launch, *extra, "/bin/sh", "-c", inner]):
                self.started_parked = True
                # Typed as asyncio's Process: AdoptedProcess has the part of it used here.
                return number, cast(asyncio.subprocess.Process, adopted), shell.wake
            self.drop_parked(shell)
        read_end, wake = os.pipe() if piped is None else (-1, -1)
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
                stdin=read_end if piped is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                pass_fds=fds,
                # Not the host's environment: bwrap itself is the sandbox's pid 1, whose
                # /proc/1/environ the command can read (API keys would leak through it).
                env={"PATH": os.environ.get("PATH", PATH)},
                **spawn_as(self.command.user),
            )
        )
        if piped is None:
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
            if wake >= 0:
                os.close(wake)
            started.add_done_callback(_kill_if_started)
            if started.done() and not started.cancelled() and started.exception() is None:
                self.killed(started.result())
            if net is not None:
                net.close()
            raise
        return number, proc, wake

    async def _keep_warm(self) -> None:
        if self._warm is None and not self.closed:
            spawned = await self.spawn()
            if self.closed or self._warm is not None:
                os.close(spawned[2])
                self.killed(spawned[1])
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
            self.killed(proc)
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

    # ------------------------------------------------------------------ ending
    def kill_all(self) -> set[asyncio.subprocess.Process]:
        """Kill every bwrap of the sandbox at once (synchronous: safe from a cancelled task) and
        start no spare any more; the killed, for :meth:`wait_gone`."""
        self.closed = True
        procs = set(self._running)
        self.drop_parked()
        if self._warm is not None:
            os.close(self._warm[2])
            procs.add(self._warm[1])
            self._warm = None
        for proc in procs:
            self.killed(proc)
        if self._lingering is not None:
            self._lingering.close()
        return procs

    async def wait_gone(self, procs: set[asyncio.subprocess.Process]) -> None:
        """Return once the killed bwraps, any spare being started and their namespaces are gone."""
        # A spare being started is let finish and killed (_keep_warm sees ``closed``), not
        # cancelled: a cancelled subprocess creation can hang asyncio.run's shutdown forever.
        if self._refill is not None and not self._refill.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._refill), 30)
        for proc in procs:
            await proc.wait()
        # Killed commands' namespaces die asynchronously; this returns once they are gone.
        for pid in self._dying:
            await _namespace_gone(pid)

    def drop_parked(self, shell: parked.Parked | None = None) -> None:
        """Let go of a parked shell not used; its cgroup is the sandbox's (which waits for the
        shell's exit, then removes it)."""
        shell = shell or self._parked
        self._parked = None
        if shell is not None:
            shell.drop()
            self._dropped.append(shell.popen)

    def killed(self, proc: asyncio.subprocess.Process) -> None:
        net = self._nets.pop(proc, None)
        if net is not None and proc.returncode is not None:  # ended by itself: its slirp4netns
            net, self._lingering = self._lingering, net  # drains until the next one ends
        if net is not None:
            net.close()  # slirp4netns exits with its exit fd closed; the child watcher reaps it
        inner = _kill(proc)
        if inner is not None:
            self._dying.append(inner)


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
