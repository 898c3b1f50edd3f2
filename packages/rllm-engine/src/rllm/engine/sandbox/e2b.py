"""A hosted sandbox: E2B, over its official SDK (``pip install 'rllm-engine[e2b]'``, ``E2B_API_KEY``).

One E2B sandbox (a microVM from ``spec.image`` as the template, default ``base``) per rollout.
The network follows ``spec.network`` (``allow_internet_access``); the spec's per-process limits
are applied with ``ulimit`` in front of every command, the wall clock is the SDK's command
timeout, and output is cut to ``output_bytes`` here. Connection options (``api_key``,
``domain``, ``api_url``, ``sandbox_url``, ``request_timeout``) go to the SDK unchanged, which is
how the contract tests point it at a loopback fake. Like Docker, processes an exec starts in the
background live until ``close`` (the sandbox is killed).
"""

from __future__ import annotations

import asyncio
import posixpath
import shlex
import time
from pathlib import Path
from typing import Any

from rllm.engine.sandbox import host_files
from rllm.engine.sandbox.outbound import ENTRY_BYTES, Budget
from rllm.engine.sandbox.pool import prepare
from rllm.sdk.sandbox import ExecResult, SandboxError, SandboxSpec, SandboxUnavailable, truncate_output

DEFAULT_TEMPLATE = "base"


def limited(cmd: str | list[str], spec: SandboxSpec) -> str:
    """``cmd`` as a shell line behind the spec's per-process limits."""
    lim = spec.limits
    body = cmd if isinstance(cmd, str) else shlex.join(cmd)
    limits = (
        f"ulimit -t {lim.cpu_s} -v {lim.memory_mb * 1024} -u {lim.max_procs} "
        f"-f {lim.file_size_mb * 1024} -c 0"  # bash counts -v and -f in KiB
    )
    return f"{limits} && {body}"


class E2BBackend:
    """Creates :class:`E2BSandbox` es; ``lifetime_s`` is the service-side kill timer."""

    name = "e2b"

    def __init__(
        self, *, template: str = DEFAULT_TEMPLATE, lifetime_s: int = 3600, **connection: Any
    ) -> None:
        self.template, self.lifetime_s, self.connection = template, lifetime_s, connection

    async def create(self, spec: SandboxSpec) -> E2BSandbox:
        if spec.desktop is not None:
            raise SandboxUnavailable(
                f"the {self.name} sandbox has no desktop support yet (SandboxSpec.desktop); use the bubblewrap backend"
            )
        try:
            from e2b import AsyncSandbox
        except ImportError:
            raise SandboxUnavailable(
                "the e2b sandbox needs its SDK: pip install 'rllm-engine[e2b]'"
            ) from None
        try:
            remote = await AsyncSandbox.create(
                template=spec.image or self.template,
                timeout=self.lifetime_s,
                envs=dict(spec.env),
                allow_internet_access=spec.network,
                **self.connection,
            )
        except Exception as exc:
            raise SandboxError(f"e2b could not create a sandbox: {exc}") from exc
        sandbox = E2BSandbox(remote, spec)
        try:
            made = await sandbox._run(f"mkdir -p {shlex.quote(spec.workdir)}", 60, {}, "/", user="root")
            if made.exit_code == 0:
                await sandbox._run(
                    f"chown user {shlex.quote(spec.workdir)} || true", 60, {}, "/", user="root"
                )
        except BaseException:
            await sandbox.close()
            raise
        return await prepare(sandbox, spec)


class E2BSandbox:
    def __init__(self, remote: Any, spec: SandboxSpec) -> None:
        self.remote, self.spec = remote, spec
        self.closed = False

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.spec.workdir, path))

    async def exec(
        self, cmd: str | list[str], timeout: float | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        if self.closed:
            raise SandboxError("the sandbox is closed")
        timeout = self.spec.limits.exec_timeout_s if timeout is None else timeout
        return await self._run(limited(cmd, self.spec), timeout, env or {}, self.spec.workdir)

    async def _run(
        self, line: str, timeout: float, env: dict[str, str], cwd: str, user: str | None = None
    ) -> ExecResult:
        from e2b.exceptions import TimeoutException
        from e2b.sandbox.commands.command_handle import CommandExitException

        started = time.monotonic()
        timed_out = False
        try:
            kwargs = {"user": user} if user else {}
            result = await self.remote.commands.run(line, envs=env, cwd=cwd, timeout=timeout, **kwargs)
            code, out, err = result.exit_code, result.stdout, result.stderr
        except CommandExitException as exc:
            code, out, err = exc.exit_code, exc.stdout, exc.stderr
        except TimeoutException as exc:
            code, out, err, timed_out = 137, "", str(exc), True
        limit = self.spec.limits.output_bytes
        stdout, cut_out = truncate_output(out.encode(), limit)
        stderr, cut_err = truncate_output(err.encode(), limit)
        return ExecResult(
            exit_code=code,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            truncated=cut_out or cut_err,
            duration_s=time.monotonic() - started,
        )

    # The same transfer rules as the local sandbox: only regular files are read (a FIFO would
    # stall the service's file call), a write replaces a link or refuses a special file instead
    # of going through it, nothing a download writes on the host is a symbolic link or leaves
    # ``local_path`` (host_files.save_local), and one transfer brings out at most ``disk_mb``
    # (outbound.Budget: apparent sizes, as listed before anything is read; zero blocks are
    # written as holes and a hard-linked file is fetched once, its other names linked to it).
    async def write_file(self, path: str, data: bytes | str) -> None:
        target = shlex.quote(self._path(path))
        check = await self._run(
            f"if [ -L {target} ]; then rm -f {target}; elif [ -e {target} ] && [ ! -f {target} ]; "
            f"then exit 3; fi",
            60,
            {},
            "/",
        )
        if check.exit_code != 0:
            raise SandboxError(f"write_file {path!r}: not a regular file in the sandbox; refused")
        await self.remote.files.write(self._path(path), data)

    async def read_file(self, path: str) -> bytes:
        budget = Budget(self.spec.limits.disk_mb * 1024 * 1024, path, "read_file")
        return await self._read(path, budget)

    async def _read(self, path: str, budget: Budget, counted: int = 0) -> bytes:
        """The regular file ``path``, its size counted in ``budget`` before it is fetched and its
        growth after (``counted``: bytes of it the budget already holds, from a listing)."""
        target = shlex.quote(self._path(path))
        check = await self._run(f"[ -f {target} ] && [ ! -L {target} ] && stat -c %s {target}", 60, {}, "/")
        if check.exit_code != 0 or not check.stdout.strip().isdigit():
            raise SandboxError(
                f"read_file {path!r}: no regular file of that name in the sandbox (links are not followed)"
            )
        budget.take(max(0, int(check.stdout) - counted))
        counted = max(counted, int(check.stdout))
        try:
            data = bytes(await self.remote.files.read(self._path(path), format="bytes"))
        except Exception as exc:
            raise SandboxError(f"no file {path!r} in the sandbox: {exc}") from None
        budget.take(max(0, len(data) - counted))
        return data

    async def upload(self, local_path: str, path: str) -> None:
        source = Path(local_path)
        if not source.exists():
            raise SandboxError(f"upload: no local file or folder {local_path!r}")
        files = [source] if source.is_file() else [p for p in sorted(source.rglob("*")) if p.is_file()]
        for file in files:
            rel = path if file == source else posixpath.join(path, file.relative_to(source).as_posix())
            await self.write_file(rel, file.read_bytes())

    async def download(self, path: str, local_path: str) -> None:
        root = self._path(path)
        # NUL-separated (a file name may hold a newline); type, size, inode and link count, links
        # never followed.
        listing = await self._run(f"find {shlex.quote(root)} -printf '%y %s %i %n %P\\0'", 600, {}, "/")
        if listing.exit_code != 0:
            raise SandboxError(f"download: no file or folder {path!r} in the sandbox")
        if listing.truncated:
            raise SandboxError(f"download {path!r}: too many entries to list (over output_bytes)")
        budget = Budget(self.spec.limits.disk_mb * 1024 * 1024, path, "download")
        refused: list[str] = []
        copied: dict[str, str] = {}  # inode -> where this download wrote it (several links)
        for entry in listing.stdout.split("\0"):
            if not entry:
                continue
            kind, size, inode, links, rel = entry.split(" ", 4)
            first = copied.get(inode) if kind == "f" and int(links) > 1 else None
            if kind == "d":
                budget.take(ENTRY_BYTES)
                await asyncio.to_thread(host_files.make_local_dir, local_path, rel)
            elif first is not None:
                budget.take(ENTRY_BYTES)
                await asyncio.to_thread(host_files.link_local, local_path, rel, first)
            elif kind == "f":
                budget.take(ENTRY_BYTES + int(size))
                data = await self._read(posixpath.join(root, rel) if rel else root, budget, int(size))
                await asyncio.to_thread(host_files.save_local, local_path, rel, data)
                if int(links) > 1 and rel:
                    copied[inode] = rel
            else:
                refused.append(rel or path)
        if refused:
            raise host_files.refused_error(path, refused)

    async def is_alive(self) -> bool:
        if self.closed:
            return False
        try:
            return bool(await self.remote.is_running())
        except Exception:
            return False

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self.remote.kill()
        except Exception:  # already gone on the service side: nothing left to release
            pass
