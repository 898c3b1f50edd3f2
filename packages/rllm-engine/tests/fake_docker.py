"""``FakeDockerClient``: a FAKE of ``docker.DockerClient`` for the Docker backend's tests, where no
Docker engine runs. It is not Docker: it records each container's ``containers.run`` options
(``FakeDockerClient.runs``) and runs each ``docker exec`` of a container as a local bubblewrap
sandbox built from those options, so they are exercised, not only read: the root read-only when
``read_only``, each ``tmpfs`` path a host folder of the container's shared by its execs, the
``volumes`` bound with their mode, no network namespace shared with the host when
``network_disabled``, capabilities dropped when ``cap_drop`` says ALL, the environment cleared to
the options' and the exec's. The image is not used (every container sees the host's system,
read-only), nor are the memory, pids and CPU limits (they are only recorded). Like Docker's, the
archive API does not reach tmpfs mounts (moby#22020): ``put_archive``/``get_archive`` there fail.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class FakeDockerError(Exception):
    """What the fake raises where the Docker SDK raises its APIError."""


class FakeContainer:
    def __init__(self, options: dict[str, Any], folder: Path) -> None:
        self.id = uuid.uuid4().hex
        self.options, self.folder, self.status = options, folder, "running"
        self.tmpfs: dict[str, Path] = {}
        for n, (path, opts) in enumerate(sorted(options.get("tmpfs", {}).items())):
            host = folder / f"tmpfs{n}"
            host.mkdir(parents=True)
            mode = next((o.split("=", 1)[1] for o in opts.split(",") if o.startswith("mode=")), None)
            if mode is not None:
                os.chmod(host, int(mode, 8))
            self.tmpfs[path] = host
        self.procs: list[subprocess.Popen[bytes]] = []

    def reload(self) -> None:
        pass

    def remove(self, force: bool = False) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # bwrap's --die-with-parent takes its sandbox
            proc.wait()
        self.status = "removed"
        shutil.rmtree(self.folder, ignore_errors=True)

    def put_archive(self, path: str, data: bytes) -> bool:
        raise FakeDockerError(f"the archive API does not reach the tmpfs at {path} (moby#22020)")

    def get_archive(self, path: str) -> tuple[list[bytes], dict[str, Any]]:
        raise FakeDockerError(f"the archive API does not reach the tmpfs at {path} (moby#22020)")

    def bwrap(self, argv: list[str], env: dict[str, str], workdir: str) -> list[str]:
        """The bubblewrap command line that runs ``argv`` as an exec of this container."""
        o = self.options
        args = ["bwrap", "--die-with-parent", "--ro-bind" if o["read_only"] else "--bind", "/", "/"]
        args += ["--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        if o["network_disabled"]:
            args.append("--unshare-net")
        for path, host in sorted(self.tmpfs.items(), key=lambda item: item[0].count("/")):
            args += ["--bind", str(host), path]
        for source, bind in o.get("volumes", {}).items():
            args += ["--ro-bind" if bind["mode"] == "ro" else "--bind", source, bind["bind"]]
        if "ALL" in o["cap_drop"]:
            args += ["--cap-drop", "ALL"]
        args.append("--clearenv")
        for key, value in {"PATH": PATH, **o["environment"], **env}.items():
            args += ["--setenv", key, value]
        return [*args, "--chdir", workdir, "--", *argv]


class _Containers:
    def __init__(self, client: FakeDockerClient) -> None:
        self.client = client

    def run(self, **options: Any) -> FakeContainer:
        self.client.runs.append(options)
        if options["image"] in self.client.missing_images:
            raise FakeDockerError(f"404 Client Error: pull access denied for {options['image']}")
        assert options["detach"] and options["command"] == ["sleep", "infinity"]
        container = FakeContainer(options, self.client.base / uuid.uuid4().hex)
        self.client.made[container.id] = container
        return container


class _API:
    def __init__(self, client: FakeDockerClient) -> None:
        self.client = client
        self.execs: dict[str, tuple[FakeContainer, list[str]]] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def exec_create(
        self, container: str, cmd: list[str], environment: dict[str, str] | None = None, workdir: str = "/"
    ) -> dict[str, str]:
        box = self.client.made[container]
        if box.status != "running":
            raise FakeDockerError(f"container {container} is not running")
        exec_id = uuid.uuid4().hex
        self.execs[exec_id] = (box, box.bwrap(cmd, environment or {}, workdir))
        return {"Id": exec_id}

    def exec_start(
        self, exec_id: str, stream: bool = False, demux: bool = False
    ) -> Iterator[tuple[bytes | None, bytes | None]]:
        assert stream and demux  # what the backend uses
        box, argv = self.execs[exec_id]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        box.procs.append(proc)
        self.procs[exec_id] = proc
        return _chunks(proc)

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        code = self.procs[exec_id].poll()
        return {"Running": code is None, "ExitCode": code}


def _chunks(proc: subprocess.Popen[bytes]) -> Iterator[tuple[bytes | None, bytes | None]]:
    """(stdout, stderr) chunks until both end, as the SDK's demuxed stream; then the exit."""
    assert proc.stdout is not None and proc.stderr is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, 0)
        selector.register(proc.stderr, selectors.EVENT_READ, 1)
        while selector.get_map():
            for key, _ in selector.select():
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                yield (data, None) if key.data == 0 else (None, data)
    proc.wait()


class FakeDockerClient:
    """A fake ``docker.DockerClient`` (see the module): ``runs`` holds every ``containers.run``'s
    options; an image in ``missing_images`` cannot be pulled."""

    def __init__(self, base: Path, missing_images: frozenset[str] = frozenset()) -> None:
        self.base, self.missing_images = base, set(missing_images)
        self.runs: list[dict[str, Any]] = []
        self.made: dict[str, FakeContainer] = {}
        self.containers = _Containers(self)
        self.api = _API(self)

    def ping(self) -> bool:
        return True
