"""The E2B backend: contract-tested against a loopback fake speaking the SDK's wire types
(rllm.testing.e2b, each fake microVM a real bubblewrap sandbox); the live test runs only with
E2B_API_KEY."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sandbox_helpers import needs_bwrap

from rllm.engine.sandbox.e2b import E2BBackend, limited
from rllm.sdk.sandbox import SandboxAgentError, SandboxError, SandboxLimits, SandboxSpec

pytest.importorskip("e2b", reason="the e2b SDK is not installed (rllm-engine[e2b])")


def test_limits_go_in_front_of_every_command() -> None:
    line = limited(["echo", "a b"], SandboxSpec(limits=SandboxLimits(cpu_s=3, memory_mb=100, max_procs=9)))
    assert line == "ulimit -t 3 -v 102400 -u 9 -f 262144 -c 0 && echo 'a b'"


@needs_bwrap
async def test_contract_against_the_wire_fake(tmp_path: Path) -> None:
    from rllm.engine.sandbox import BubblewrapBackend
    from rllm.testing.e2b import FakeE2B

    bwrap = BubblewrapBackend()
    async with FakeE2B(lambda: bwrap.create(SandboxSpec(workdir="/work"))) as fake:
        backend = E2BBackend(api_key="e2b_" + "0" * 40, api_url=fake.url, sandbox_url=fake.url)
        spec = SandboxSpec(
            files={"a.txt": "A\n"}, setup="echo set > up.txt", limits=SandboxLimits(output_bytes=64)
        )
        sandbox = await backend.create(spec)
        try:
            sent = fake.created[0]
            assert sent.template_id == "base" and sent.allow_internet_access is False
            assert (await sandbox.exec("cat up.txt a.txt; echo $X", env={"X": "1"})).stdout == "set\nA\n1\n"
            failed = await sandbox.exec("echo oops >&2; exit 3")
            assert failed.exit_code == 3 and failed.stderr == "oops\n" and not failed.ok
            slow = await sandbox.exec("sleep 30", timeout=1)
            assert slow.timed_out and not slow.ok
            flood = await sandbox.exec("seq 1000")
            assert flood.truncated and "output truncated" in flood.stdout
            await sandbox.write_file("d/x.bin", b"\x00\x01")
            assert await sandbox.read_file("d/x.bin") == b"\x00\x01"
            (tmp_path / "up" / "sub").mkdir(parents=True)
            (tmp_path / "up" / "sub" / "y.txt").write_text("Y")
            await sandbox.upload(str(tmp_path / "up"), "tree")
            await sandbox.download("tree", str(tmp_path / "down"))
            assert (tmp_path / "down" / "sub" / "y.txt").read_text() == "Y"
            assert await sandbox.is_alive()
        finally:
            await sandbox.close()
        assert fake.killed == ["fake0"] and not await sandbox.is_alive()


@pytest.mark.live
@pytest.mark.skipif(
    not os.environ.get("E2B_API_KEY"), reason="set E2B_API_KEY to run against the real E2B service"
)
async def test_live_e2b() -> None:
    sandbox = await E2BBackend().create(SandboxSpec(setup="echo live > up.txt"))
    try:
        assert (await sandbox.exec("cat up.txt")).stdout == "live\n"
        assert not (await sandbox.exec("curl -sm 5 https://example.com")).ok  # network off by default
    finally:
        await sandbox.close()


@needs_bwrap
async def test_transfers_follow_the_local_sandboxs_rules(tmp_path: Path) -> None:
    """Links, FIFOs and a newline in a name, against the fake: nothing reaches the host, nothing hangs."""
    from rllm.engine.sandbox import BubblewrapBackend
    from rllm.testing.e2b import FakeE2B

    host = tmp_path / "host"
    host.mkdir()
    bwrap = BubblewrapBackend()
    async with FakeE2B(lambda: bwrap.create(SandboxSpec(workdir="/work"))) as fake:
        backend = E2BBackend(api_key="e2b_" + "0" * 40, api_url=fake.url, sandbox_url=fake.url)
        sandbox = await backend.create(SandboxSpec())
        try:
            made = await sandbox.exec(
                f"mkdir -p out/sub && echo data > out/sub/a.txt && ln -s {host} out/h && mkfifo out/f "
                "&& printf x > \"$(printf 'out/new\\nline')\" && mkfifo fifo && ln -s /etc/hostname link && echo ok"
            )
            assert made.stdout == "ok\n", made
            with pytest.raises(SandboxError, match="regular file"):
                await sandbox.read_file("fifo")
            with pytest.raises(SandboxError, match="regular file"):
                await sandbox.read_file("link")
            with pytest.raises(SandboxError, match="regular file"):
                await sandbox.write_file("fifo", "x")
            await sandbox.write_file("link", "replaced")  # the link is replaced, not written through
            assert (await sandbox.exec("test -L link || cat link")).stdout == "replaced"
            local = tmp_path / "down"
            with pytest.raises(
                SandboxError, match=r"links or special files.*out/h|links or special files.*f"
            ):
                await sandbox.download("out", str(local))
            assert [p for p in local.rglob("*") if p.is_symlink()] == []
            assert (local / "sub" / "a.txt").read_text() == "data\n"
            assert (local / "new\nline").read_text() == "x"
            assert list(host.iterdir()) == []
        finally:
            await sandbox.close()


@needs_bwrap
async def test_a_download_brings_out_the_disk_files_take_and_no_more_than_disk_mb(tmp_path: Path) -> None:
    from rllm.engine.sandbox import BubblewrapBackend
    from rllm.testing.e2b import FakeE2B

    bwrap = BubblewrapBackend()
    async with FakeE2B(lambda: bwrap.create(SandboxSpec(workdir="/work"))) as fake:
        backend = E2BBackend(api_key="e2b_" + "0" * 40, api_url=fake.url, sandbox_url=fake.url)
        sandbox = await backend.create(SandboxSpec(limits=SandboxLimits(disk_mb=32)))
        try:
            made = await sandbox.exec(
                "mkdir out && head -c 1048576 /dev/urandom > out/data && "
                "for i in $(seq 1 20); do ln out/data out/link$i; done && "
                "truncate -s 24M out/sparse && printf tail >> out/sparse && truncate -s 64M big.bin && echo made"
            )
            assert made.stdout == "made\n", made
            local = tmp_path / "down"
            await sandbox.download("out", str(local))
            assert (local / "link20").read_bytes() == (local / "data").read_bytes()
            assert (local / "link20").stat().st_ino == (local / "data").stat().st_ino  # fetched once
            sparse = local / "sparse"
            assert sparse.stat().st_size == 24 * 2**20 + 4 and sparse.read_bytes()[-4:] == b"tail"
            on_disk = sum(p.stat().st_blocks * 512 for p in local.iterdir() if p.name in ("data", "sparse"))
            assert on_disk < 3 * 2**20, on_disk  # the zeros are holes on the host too
            refused = r"big\.bin.*more than 32 MiB would leave the sandbox"
            with pytest.raises(SandboxAgentError, match=refused):
                await sandbox.read_file("big.bin")
            with pytest.raises(SandboxAgentError, match=refused):
                await sandbox.download("big.bin", str(tmp_path / "big.bin"))
            assert not (tmp_path / "big.bin").exists()
        finally:
            await sandbox.close()
