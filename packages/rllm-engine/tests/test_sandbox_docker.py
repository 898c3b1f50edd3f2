"""The Docker sandbox: its container options always; the real thing only where an engine runs."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import select
import shutil
import signal
from pathlib import Path

import pytest

from rllm.engine.sandbox.docker import DEFAULT_IMAGE, DockerBackend, container_options
from rllm.sdk.sandbox import DesktopSpec, SandboxLimits, SandboxSpec, SandboxUnavailable


def _engine_reason() -> str | None:
    try:
        DockerBackend().client()
    except SandboxUnavailable as exc:
        return f"no Docker engine here ({exc})"
    return None


NO_ENGINE = _engine_reason()
needs_engine = pytest.mark.skipif(NO_ENGINE is not None, reason=NO_ENGINE or "")


def test_container_options_enforce_the_spec() -> None:
    spec = SandboxSpec(limits=SandboxLimits(memory_mb=256, max_procs=32, cpu_s=7), env={"A": "1"})
    options = container_options(spec, DEFAULT_IMAGE)
    assert options["network_disabled"] is True and options["read_only"] is True
    assert options["mem_limit"] == options["memswap_limit"] == "256m" and options["pids_limit"] == 32
    assert options["cap_drop"] == ["ALL"] and "no-new-privileges" in options["security_opt"]
    assert {u["Name"]: u["Hard"] for u in options["ulimits"]}["cpu"] == 7
    assert set(options["tmpfs"]) == {"/tmp", "/work"} and options["environment"]["A"] == "1"
    assert options["tmpfs"]["/work"].startswith("size=1024m") and options["shm_size"] == "64m"
    assert options["nano_cpus"] == 1_000_000_000
    assert (
        container_options(SandboxSpec(network=True, image="alpine"), DEFAULT_IMAGE)["network_disabled"]
        is False
    )


@pytest.mark.skipif(NO_ENGINE is None, reason="a Docker engine is reachable here")
async def test_refuses_clearly_without_an_engine() -> None:
    with pytest.raises(SandboxUnavailable, match="Docker engine"):
        await DockerBackend().create(SandboxSpec())


@needs_engine
async def test_exec_files_limits_and_cleanup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret-0815")
    sandbox = await DockerBackend().create(SandboxSpec(setup="echo set > up.txt"))
    try:
        assert (await sandbox.exec("cat up.txt")).stdout == "set\n"
        assert "sk-host-secret-0815" not in (await sandbox.exec("env")).stdout
        assert not (
            await sandbox.exec("python3 -c \"import urllib.request as u; u.urlopen('http://example.com')\"")
        ).ok
        slow = await sandbox.exec("sleep 60", timeout=1)
        assert slow.timed_out
        flood = await sandbox.exec("yes", timeout=30)
        assert flood.truncated
        await sandbox.write_file("d/x.txt", "hello")
        assert await sandbox.read_file("d/x.txt") == b"hello"
        await sandbox.download("d", str(tmp_path / "out"))
        assert (tmp_path / "out" / "x.txt").read_text() == "hello"
        assert not (await sandbox.exec("touch /usr/evil")).ok
    finally:
        await sandbox.close()
    assert not await sandbox.is_alive()


class _TarExecAPI:
    """Just enough of the Docker API for the transfer paths: every exec prints one tar, base64'd
    (what the container's ``tar | base64`` would)."""

    def __init__(self, archive: bytes) -> None:
        self.archive = archive

    def exec_create(self, container: str, cmd: list[str], **_: object) -> dict[str, str]:
        return {"Id": "x"}

    def exec_start(self, exec_id: str, **_: object) -> list[tuple[bytes | None, bytes | None]]:
        import base64

        return [(base64.b64encode(self.archive), None)]

    def exec_inspect(self, exec_id: str) -> dict[str, object]:
        return {"ExitCode": 0, "Running": False}


class _TarClient:
    def __init__(self, archive: bytes) -> None:
        self.api = _TarExecAPI(archive)


class _Container:
    id = "c"


def _tar(entries: list[tuple[str, str, bytes | str]]) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, data in entries:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "file":
                raw = data if isinstance(data, bytes) else data.encode()
                info.size, info.mode = len(raw), 0o4755  # setuid must not survive onto the host
                tar.addfile(info, io.BytesIO(raw))
            else:
                info.type = tarfile.SYMTYPE if kind == "link" else tarfile.LNKTYPE
                info.linkname = str(data)
                tar.addfile(info)
    return buffer.getvalue()


async def test_transfers_never_create_links_or_follow_them(tmp_path: Path) -> None:
    from rllm.engine.sandbox.docker import DockerSandbox
    from rllm.sdk.sandbox import SandboxError

    archive = _tar(
        [
            ("out", "dir", ""),
            ("out/sub", "dir", ""),
            ("out/a.txt", "file", "data\n"),
            ("out/inner", "link", "sub"),  # inside the target: the "data" tar filter would make it
            ("out/hard", "hard", "out/a.txt"),
        ]
    )
    sandbox = DockerSandbox(_TarClient(archive), _Container(), SandboxSpec())
    local = tmp_path / "down"
    with pytest.raises(SandboxError, match="links or special files"):
        await sandbox.download("out", str(local))
    assert [p for p in local.rglob("*") if p.is_symlink()] == []
    assert (local / "a.txt").read_text() == "data\n" and (local / "a.txt").stat().st_mode & 0o7000 == 0
    linked = DockerSandbox(_TarClient(_tar([("link", "link", "/etc/passwd")])), _Container(), SandboxSpec())
    with pytest.raises(SandboxError, match="regular file"):
        await linked.read_file("link")


def test_desktop_container_options_keep_the_display_private(tmp_path: Path) -> None:
    from rllm.engine.sandbox import docker_desktop

    desktop = DesktopSpec(width=320, height=240)
    spec = SandboxSpec(desktop=desktop, env={"DISPLAY": "host:0"}, limits=SandboxLimits(memory_mb=300))
    options = container_options(spec, DEFAULT_IMAGE, desktop_root=tmp_path)
    # its own X socket folder (a tmpfs), no bind of the host's, and its own display whatever the env
    assert options["tmpfs"]["/tmp/.X11-unix"] == "size=1m,mode=1777"
    assert options["volumes"] == {str(tmp_path / "helper"): {"bind": "/tmp/.rllm-helper", "mode": "ro"}}
    assert options["environment"]["DISPLAY"] == ":0" and options["ipc_mode"] == "private"
    assert "network_mode" not in options and "devices" not in options and "privileged" not in options
    # the sandbox's confinement holds for a desktop too
    assert options["network_disabled"] is True and options["read_only"] is True
    assert options["cap_drop"] == ["ALL"] and "no-new-privileges" in options["security_opt"]
    assert options["mem_limit"] == options["memswap_limit"] == "300m"
    assert set(options["tmpfs"]) == {"/tmp", "/work", "/tmp/.X11-unix"}
    # the image: the spec's, else the desktop's, else the backend's desktop image
    assert options["image"] == docker_desktop.IMAGE
    own = SandboxSpec(desktop=DesktopSpec(image="mine/desk"))
    assert container_options(own, DEFAULT_IMAGE, desktop_root=tmp_path)["image"] == "mine/desk"
    named = SandboxSpec(desktop=DesktopSpec(image="mine/desk"), image="other")
    assert container_options(named, DEFAULT_IMAGE, desktop_root=tmp_path)["image"] == "other"
    assert "volumes" not in container_options(SandboxSpec(), DEFAULT_IMAGE)


async def test_a_missing_desktop_image_is_named_with_how_to_build_it(tmp_path: Path) -> None:
    from fake_docker import FakeDockerClient

    from rllm.sdk.sandbox import SandboxError

    client = FakeDockerClient(tmp_path, missing_images=frozenset({"rllm-desktop"}))
    with pytest.raises(SandboxError, match=r"docker build -t rllm-desktop cookbooks/desktop"):
        await DockerBackend(client=client).create(SandboxSpec(desktop=DesktopSpec()))
    folder = client.runs[0]["volumes"]  # the helper's host folder went with the failed start
    assert not any(Path(source).exists() for source in folder)


needs_desktop = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("bwrap", "Xvfb", "evilwm", "xdotool", "xwd", "xwdtopnm")),
    reason="apt-get install bubblewrap xvfb evilwm xdotool x11-apps netpbm",
)


@needs_desktop
@pytest.mark.timeout(120)
async def test_a_warm_docker_desktop_takes_clicks_and_text_through_its_helper(tmp_path: Path) -> None:
    """Through the fake engine (its execs are bwrap sandboxes made from the container's options):
    the files and the app start, the helper round trip works, the display is the container's."""
    from fake_docker import FakeDockerClient
    from sandbox_helpers import within
    from test_sandbox_desktop import form_spec, saved_state, wait_for_form

    from rllm.engine.sandbox import WarmPool
    from rllm.sdk.desktop import Desktop

    client = FakeDockerClient(tmp_path)
    host_sockets = set(os.listdir("/tmp/.X11-unix")) if os.path.isdir("/tmp/.X11-unix") else set()
    pool = WarmPool(DockerBackend(client=client), size=1)
    spec = form_spec(width=360, height=260)
    pool.schedule([spec])
    await pool.ready()
    sandbox = await pool.acquire(spec)
    assert pool.stats["warm"] == 1
    try:
        assert await sandbox.is_alive()
        assert sandbox.desktop_helper is not None and sandbox.desktop_helper.state == "ready"
        desktop = Desktop(sandbox)
        form = await wait_for_form(sandbox)
        await desktop.click(*form["entry"])
        await desktop.type_text("dock é")
        await desktop.click(*form["button"])
        async with within(30, "the app saving"):
            state = await saved_state(sandbox, clicks=1)
        assert state["saved"] == "dock é"
        assert (await desktop.cursor()) == tuple(form["button"])
        shot = await desktop.screenshot()
        from PIL import Image

        assert Image.open(io.BytesIO(shot)).size == (360, 260)
        result = await sandbox.exec('echo "$DISPLAY"; ls -A /tmp/.X11-unix')
        assert result.stdout.split() == [":0", "X0"]
        host_now = set(os.listdir("/tmp/.X11-unix")) if os.path.isdir("/tmp/.X11-unix") else set()
        assert host_now == host_sockets  # the container's X0 is not on the host
        (options,) = client.runs
        assert options["network_disabled"] and options["read_only"] and options["cap_drop"] == ["ALL"]
        assert options["mem_limit"] == f"{spec.limits.memory_mb}m"
        root = sandbox.desktop_root
        assert root is not None and root.stat().st_mode & 0o777 == 0o700
        assert len(x_servers("360x260x24")) == 1
        # a desktop whose session ended is not alive (the warm pool replaces it)
        assert sandbox.desktop_session is not None
        session = client.api.procs[sandbox.desktop_session]
        os.killpg(session.pid, signal.SIGKILL)
        session.wait()
        assert not await sandbox.is_alive()
    finally:
        await sandbox.close()
        await pool.close()
    # close() kills the X server; the kernel ends it a moment later (CI saw it still listed once):
    # wait on each one's exit itself (a pidfd), then nothing of that screen may be left.
    for pid in x_servers("360x260x24"):
        assert await asyncio.to_thread(exits_within, pid, 30.0), f"X server {pid} outlived close()"
    assert x_servers("360x260x24") == []
    assert not root.exists() and not await sandbox.is_alive()


def x_servers(screen: str) -> list[int]:
    """Host pids of X servers (not the shells or bwraps whose command lines name them) of ``screen``."""
    from sandbox_helpers import host_processes_with

    found = []
    for pid in host_processes_with(screen):
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if comm == "Xvfb" and state not in ("Z", "X"):  # an exited one not yet reaped is gone
            found.append(pid)
    return found


def exits_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` has exited or does within ``seconds`` (its pidfd turns readable)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="apt-get install bubblewrap")
async def test_files_reach_the_tmpfs_workdir_through_exec(tmp_path: Path) -> None:
    # The fake's archive API, as Docker's, does not reach tmpfs mounts: transfers must use execs.
    from fake_docker import FakeDockerClient

    from rllm.engine.sandbox.docker import ARG_CHUNK
    from rllm.sdk.sandbox import SandboxError

    big = os.urandom(ARG_CHUNK)  # more than one argument's worth once base64'd
    sandbox = await DockerBackend(client=FakeDockerClient(tmp_path)).create(
        SandboxSpec(files={"a/b.txt": "hi\n"}, setup="cat a/b.txt > seen.txt")
    )
    try:
        assert await sandbox.read_file("seen.txt") == b"hi\n"
        await sandbox.write_file("deep/big.bin", big)
        digest = (await sandbox.exec("sha256sum deep/big.bin")).stdout.split()[0]
        assert digest == hashlib.sha256(big).hexdigest()
        local = tmp_path / "up"
        (local / "sub").mkdir(parents=True)
        (local / "sub" / "c.txt").write_text("up\n")
        await sandbox.upload(str(local), "in")
        assert (await sandbox.exec("cat in/sub/c.txt")).stdout == "up\n"
        await sandbox.download("deep", str(tmp_path / "down"))
        assert (tmp_path / "down" / "big.bin").read_bytes() == big
        with pytest.raises(SandboxError, match="no file or folder 'nowhere'"):
            await sandbox.read_file("nowhere")
        assert (await sandbox.exec("ln -s /etc/passwd link")).ok
        with pytest.raises(SandboxError, match="regular file"):
            await sandbox.read_file("link")
    finally:
        await sandbox.close()
