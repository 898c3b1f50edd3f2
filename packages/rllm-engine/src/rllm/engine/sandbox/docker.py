"""The Docker sandbox (``pip install 'rllm-engine[docker]'``, needs a Docker engine).

One container per sandbox, from ``spec.image`` (default ``python:3.11-slim``), kept alive by
``sleep infinity``: a read-only root filesystem, tmpfs workdir (``disk_mb``), /tmp (``tmp_mb``)
and /dev/shm (``shm_mb``), every capability dropped, no new privileges, no network unless the
spec allows it, and the spec's limits as Docker limits (memory, pids, CPUs) and ulimits (CPU
seconds, file size, open files). Transfers follow the local sandbox's rules: only regular files
are read, downloads never create links on the host (``host_files.extract_tar``). Each exec gets a
wall clock twice over: ``timeout -s KILL`` inside the container and the caller's deadline
outside. Unlike the local backend, processes an exec leaves in the background keep running
until the sandbox is closed (the container is removed with everything in it). Files go in and
out through execs (``tar`` and ``base64`` in the container): Docker's archive API does not reach
tmpfs mounts. A spec with a desktop gets one (``docker_desktop``). The blocking Docker SDK runs
in worker threads.
"""

from __future__ import annotations

import asyncio
import base64
import io
import posixpath
import shutil
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

from rllm.engine.sandbox import docker_desktop, host_files
from rllm.engine.sandbox.pool import prepare
from rllm.sdk.desktop_channel import HelperChannel
from rllm.sdk.sandbox import ExecResult, SandboxError, SandboxSpec, SandboxUnavailable, truncate_output

DEFAULT_IMAGE = "python:3.11-slim"
ARG_CHUNK = 96 * 1024  # base64 characters per exec argument (Linux takes 128 KiB in one)


def container_options(
    spec: SandboxSpec,
    image: str,
    *,
    desktop_image: str = docker_desktop.IMAGE,
    desktop_root: Path | None = None,
) -> dict[str, Any]:
    """The ``containers.run`` keyword arguments that enforce ``spec`` (a desktop spec's also its
    display and the helper's folder in ``desktop_root``: ``docker_desktop``)."""
    from docker.types import Ulimit

    lim = spec.limits
    if spec.desktop is not None:
        image = spec.image or spec.desktop.image or desktop_image
    options = {
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
    if spec.desktop is not None:
        if desktop_root is None:
            raise SandboxError("a desktop container needs its host folder (docker_desktop.make_root)")
        extra = docker_desktop.options(desktop_root)
        for key, value in extra.items():
            options[key] = {**options[key], **value} if isinstance(value, dict) and key in options else value
    return options


class DockerBackend:
    """Creates :class:`DockerSandbox` es through ``client`` (default: ``docker.from_env()``)."""

    name = "docker"

    def __init__(
        self, *, image: str = DEFAULT_IMAGE, desktop_image: str = docker_desktop.IMAGE, client: Any = None
    ) -> None:
        self.image, self.desktop_image = image, desktop_image
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
        client = await asyncio.to_thread(self.client)
        root = docker_desktop.make_root() if spec.desktop is not None else None
        options = container_options(spec, self.image, desktop_image=self.desktop_image, desktop_root=root)
        try:
            container = await asyncio.to_thread(client.containers.run, **options)
        except Exception as exc:
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)
            hint = f" ({docker_desktop.BUILD_HINT})" if options["image"] == docker_desktop.IMAGE else ""
            raise SandboxError(f"docker could not start a {options['image']} container: {exc}{hint}") from exc
        sandbox = await prepare(DockerSandbox(client, container, spec, desktop_root=root), spec)
        if root is not None:
            try:
                sandbox.desktop_session = await docker_desktop.start(sandbox, root)
            except BaseException:
                await sandbox.close()
                raise
        return sandbox


class DockerSandbox:
    def __init__(
        self, client: Any, container: Any, spec: SandboxSpec, *, desktop_root: Path | None = None
    ) -> None:
        self.client, self.container, self.spec = client, container, spec
        self.closed = False
        self.desktop_root = desktop_root  # the host folder of a desktop's helper socket
        self.desktop_session: str | None = None  # the desktop session's exec id
        self.desktop_helper: HelperChannel | None = None  # the session's input/screenshot helper

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

    def _run(
        self, argv: list[str], env: dict[str, str], limit: int | None = None
    ) -> tuple[int, bytes, bytes, tuple[int, int]]:
        api, limit = self.client.api, limit or self.spec.limits.output_bytes
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
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(posixpath.basename(target))
            info.size, info.mode = len(raw), 0o644
            tar.addfile(info, io.BytesIO(raw))
        await self._put_tar(posixpath.dirname(target), archive.getvalue(), path)

    async def _put_tar(self, parent: str, archive: bytes, what: str) -> None:
        """Unpack ``archive`` in ``parent`` through execs (base64 in arguments): Docker's archive
        API works on the image's layer under a tmpfs mount, not the tmpfs (moby#22020), and the
        workdir and /tmp are tmpfs mounts."""
        staged = f"/tmp/.rllm-put-{uuid.uuid4().hex}"
        encoded = base64.b64encode(archive).decode()
        try:
            for start in range(0, len(encoded), ARG_CHUNK):
                piece = encoded[start : start + ARG_CHUNK]
                await self._checked(["/bin/sh", "-c", 'printf %s "$1" >> "$2"', "sh", piece, staged], what)
            unpack = 'mkdir -p "$2" && base64 -d "$1" | tar -x --no-same-owner -C "$2"'
            await self._checked(["/bin/sh", "-c", unpack, "sh", staged, parent], what)
        finally:
            await self.exec(["rm", "-f", staged])

    async def _checked(self, argv: list[str], what: str) -> None:
        result = await self.exec(argv)
        if not result.ok:
            raise SandboxError(f"could not write {what!r} into the container: {result.stderr.strip()[-300:]}")

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
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.add(source, arcname=posixpath.basename(target))
        await self._put_tar(posixpath.dirname(target), archive.getvalue(), path)

    async def download(self, path: str, local_path: str) -> None:
        with await self._archive(path) as tar:
            await asyncio.to_thread(
                host_files.extract_tar, tar, posixpath.basename(self._path(path)), local_path, path
            )

    async def _archive(self, path: str) -> tarfile.TarFile:
        """``path`` as a tar made in the container (through an exec, as ``_put_tar``); links are
        archived as links, never followed."""
        if self.closed:
            raise SandboxError("the sandbox is closed")
        target = self._path(path)
        pack = 'cd "$1" && { tar -c -- "$2" || echo rllm-tar-failed >&2; } | base64'
        timeout = self.spec.limits.exec_timeout_s
        argv = ["timeout", "-s", "KILL", f"{timeout:g}", "/bin/sh", "-c", pack, "sh"]
        argv += [posixpath.dirname(target), posixpath.basename(target)]
        cap = self.spec.limits.disk_mb * 1024 * 1024 * 4 // 3 + 4096  # the workdir's size, base64'd
        try:
            code, out, err, totals = await asyncio.wait_for(
                asyncio.to_thread(self._run, argv, {}, cap), timeout + 10
            )
        except TimeoutError:
            raise SandboxError(f"reading {path!r} from the sandbox timed out") from None
        if totals[0] > len(out):
            raise SandboxError(f"{path!r} is larger than the sandbox's disk ({self.spec.limits.disk_mb} MiB)")
        if code != 0 or b"rllm-tar-failed" in err:
            why = err.decode(errors="replace").replace("rllm-tar-failed", "").strip()[-300:]
            raise SandboxError(f"no file or folder {path!r} in the sandbox: {why or f'exit {code}'}")
        return tarfile.open(fileobj=io.BytesIO(base64.b64decode(out)))

    async def is_alive(self) -> bool:
        if self.closed:
            return False
        try:
            await asyncio.to_thread(self.container.reload)
        except Exception:
            return False
        if self.container.status != "running":
            return False
        return self.desktop_session is None or await docker_desktop.alive(self, self.desktop_session)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.desktop_helper is not None:
            self.desktop_helper.close()
        try:
            await asyncio.shield(asyncio.to_thread(self.container.remove, force=True))
        except Exception:  # already gone: nothing left to release
            pass
        if self.desktop_root is not None:
            shutil.rmtree(self.desktop_root, ignore_errors=True)
