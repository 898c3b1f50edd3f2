"""The Docker sandbox: its container options always; the real thing only where an engine runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from rllm.engine.sandbox.docker import DEFAULT_IMAGE, DockerBackend, container_options
from rllm.sdk.sandbox import SandboxLimits, SandboxSpec, SandboxUnavailable


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


class _ArchiveContainer:
    """Just enough of a container for the transfer paths: ``get_archive`` serves one tar."""

    def __init__(self, archive: bytes) -> None:
        self.archive = archive

    def get_archive(self, path: str) -> tuple[list[bytes], dict[str, object]]:
        return [self.archive], {}


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
    sandbox = DockerSandbox(None, _ArchiveContainer(archive), SandboxSpec())
    local = tmp_path / "down"
    with pytest.raises(SandboxError, match="links or special files"):
        await sandbox.download("out", str(local))
    assert [p for p in local.rglob("*") if p.is_symlink()] == []
    assert (local / "a.txt").read_text() == "data\n" and (local / "a.txt").stat().st_mode & 0o7000 == 0
    linked = DockerSandbox(None, _ArchiveContainer(_tar([("link", "link", "/etc/passwd")])), SandboxSpec())
    with pytest.raises(SandboxError, match="regular file"):
        await linked.read_file("link")
