"""The Docker sandbox (``pip install 'rllm-engine[docker]'``, needs a Docker engine).

One container per sandbox, from ``spec.image`` (default ``python:3.11-slim``), kept alive by
``sleep infinity``: a read-only root filesystem, tmpfs workdir (``disk_mb``), /tmp (``tmp_mb``)
and /dev/shm (``shm_mb``), every capability dropped, no new privileges, no network unless the
spec allows it, and the spec's limits as Docker limits (memory, pids, CPUs) and ulimits (CPU
seconds, file size, open files). Transfers follow the local sandbox's rules: only regular files
are read, downloads never create links on the host (``host_files.extract_tar``). Each exec gets a
wall clock twice over: ``timeout -s KILL`` inside the container and the caller's deadline
outside. Unlike the local backend, processes an exec leaves in the background keep running
until the sandbox is closed (the container is removed with everything in it). The blocking
Docker SDK runs in worker threads.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import tarfile
import time
from pathlib import Path
from typing import Any

from rllm.engine.sandbox import host_files
from rllm.engine.sandbox.pool import prepare
from rllm.sdk.sandbox import ExecResult, SandboxError, SandboxSpec, SandboxUnavailable, truncate_output

DEFAULT_IMAGE = "python:3.11-slim"


def container_options(spec: SandboxSpec, image: str) -> dict[str, Any]:
    """The ``containers.run`` keyword arguments that enforce ``spec``."""
    from docker.types import Ulimit

    lim = spec.limits
    return {
        "image": spec.image or image,
        "command": ["sleep", "infinity"],
        "detach": True,
        "network_disabled": not spec.network,
        "mem_limit": f"{lim.memory_mb}m",
        "memswap_limit": f"{lim.memory_mb}m",  # no swap beyond the memory limit
        "pids_limit": lim.max_procs,
        "nano_cpus": int(lim.cpus * 1e9),
        "shm_size": f"{lim.shm_mb}m",
        "ulimits": [
            Ulimit(name="cpu", soft=lim.cpu_s, hard=lim.cpu_s),
            Ulimit(name="fsize", soft=lim.file_size_mb * 1024 * 1024, hard=lim.file_size_mb * 1024 * 1024),
            Ulimit(name="nofile", soft=1024, hard=1024),
            Ulimit(name="core", soft=0, hard=0),
        ],
        "read_only": True,
        "tmpfs": {"/tmp": f"size={lim.tmp_mb}m", spec.workdir: f"size={lim.disk_mb}m,exec"},
        "working_dir": spec.workdir,
        "environment": {"HOME": spec.workdir, **spec.env},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "labels": {"rllm.sandbox": "1"},
    }


class DockerBackend:
    """Creates :class:`DockerSandbox` es through ``client`` (default: ``docker.from_env()``)."""

    name = "docker"

    def __init__(self, *, image: str = DEFAULT_IMAGE, client: Any = None) -> None:
        self.image = image
        self._client = client

    def client(self) -> Any:
        if self._client is None:
            try:
                import docker
            except ImportError:
                raise SandboxUnavailable(
                    "the docker sandbox needs the docker SDK: pip install 'rllm-engine[docker]'"
                ) from None
            try:
                self._client = docker.from_env()
                self._client.ping()
            except Exception as exc:
                self._client = None
                raise SandboxUnavailable(f"no Docker engine reachable: {exc}") from None
        return self._client

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        if spec.desktop is not None:
            raise SandboxUnavailable(
                f"the {self.name} sandbox has no desktop support yet (SandboxSpec.desktop); use the bubblewrap backend"
            )
        client = await asyncio.to_thread(self.client)
        options = container_options(spec, self.image)
        try:
            container = await asyncio.to_thread(client.containers.run, **options)
        except Exception as exc:
            raise SandboxError(f"docker could not start a {options['image']} container: {exc}") from exc
        return await prepare(DockerSandbox(client, container, spec), spec)


class DockerSandbox:
    def __init__(self, client: Any, container: Any, spec: SandboxSpec) -> None:
        self.client, self.container, self.spec = client, container, spec
        self.closed = False

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.spec.workdir, path))

    async def exec(
        self, cmd: str | list[str], timeout: float | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        if self.closed:
            raise SandboxError("the sandbox is closed")
        timeout = self.spec.limits.exec_timeout_s if timeout is None else timeout
        argv = [
            "timeout",
            "-s",
            "KILL",
            f"{timeout:g}",
            *(["/bin/sh", "-c", cmd] if isinstance(cmd, str) else cmd),
        ]
        started = time.monotonic()
        try:
            code, out, err, totals = await asyncio.wait_for(
                asyncio.to_thread(self._run, argv, env or {}), timeout + 10
            )
        except TimeoutError:
            code, out, err, totals = 137, b"", b"", (0, 0)
        limit = self.spec.limits.output_bytes
        stdout, cut_out = truncate_output(out, limit, totals[0])
        stderr, cut_err = truncate_output(err, limit, totals[1])
        return ExecResult(
            exit_code=code,
            stdout=stdout,
            stderr=stderr,
            timed_out=code == 137 and time.monotonic() - started >= timeout,
            truncated=cut_out or cut_err,
            duration_s=time.monotonic() - started,
        )

    def _run(self, argv: list[str], env: dict[str, str]) -> tuple[int, bytes, bytes, tuple[int, int]]:
        api, limit = self.client.api, self.spec.limits.output_bytes
        exec_id = api.exec_create(self.container.id, argv, environment=env, workdir=self.spec.workdir)["Id"]
        kept, totals = [bytearray(), bytearray()], [0, 0]
        for chunks in api.exec_start(exec_id, stream=True, demux=True):
            for i, chunk in enumerate(chunks):
                if chunk:
                    totals[i] += len(chunk)
                    if len(kept[i]) < limit:
                        kept[i] += chunk[: limit - len(kept[i])]
            if sum(totals) > max(limit * 16, 8 * 1024 * 1024):
                break  # flooding: stop reading; its wall clock ends it
        code = api.exec_inspect(exec_id).get("ExitCode")
        return (137 if code is None else int(code)), bytes(kept[0]), bytes(kept[1]), (totals[0], totals[1])

    async def write_file(self, path: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        target = self._path(path)
        parent = posixpath.dirname(target)
        await self.exec(["mkdir", "-p", parent])
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(posixpath.basename(target))
            info.size, info.mode = len(raw), 0o644
            tar.addfile(info, io.BytesIO(raw))
        if not await asyncio.to_thread(self.container.put_archive, parent, archive.getvalue()):
            raise SandboxError(f"could not write {path!r} into the container")

    async def read_file(self, path: str) -> bytes:
        with await self._archive(path) as tar:
            member = tar.next()
            # Regular files only: a link is not followed (not even within the archive).
            handle = tar.extractfile(member) if member is not None and member.isreg() else None
            if handle is None:
                raise SandboxError(
                    f"read_file {path!r}: not a regular file in the sandbox (links are not followed)"
                )
            return handle.read()

    async def upload(self, local_path: str, path: str) -> None:
        source, target = Path(local_path), self._path(path)
        if not source.exists():
            raise SandboxError(f"upload: no local file or folder {local_path!r}")
        await self.exec(["mkdir", "-p", posixpath.dirname(target)])
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.add(source, arcname=posixpath.basename(target))
        await asyncio.to_thread(self.container.put_archive, posixpath.dirname(target), archive.getvalue())

    async def download(self, path: str, local_path: str) -> None:
        with await self._archive(path) as tar:
            await asyncio.to_thread(
                host_files.extract_tar, tar, posixpath.basename(self._path(path)), local_path, path
            )

    async def _archive(self, path: str) -> tarfile.TarFile:
        try:
            stream, _ = await asyncio.to_thread(self.container.get_archive, self._path(path))
            data = await asyncio.to_thread(lambda: b"".join(stream))
        except Exception as exc:
            raise SandboxError(f"no file or folder {path!r} in the sandbox: {exc}") from None
        return tarfile.open(fileobj=io.BytesIO(data))

    async def is_alive(self) -> bool:
        if self.closed:
            return False
        try:
            await asyncio.to_thread(self.container.reload)
        except Exception:
            return False
        return self.container.status == "running"

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await asyncio.shield(asyncio.to_thread(self.container.remove, force=True))
        except Exception:  # already gone: nothing left to release
            pass
