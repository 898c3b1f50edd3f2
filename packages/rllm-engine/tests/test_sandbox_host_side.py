"""The host side of the bubblewrap sandbox under attack: file transfers on paths the agent
controls (links, a swap race while a command runs, FIFOs, sockets, devices), the verifier and
the test runner that use them, and the sandbox's own lifecycle (setup visibility, close, exit).
Each test mounts the attack through the public API and proves the host was not reached."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sandbox_helpers import needs_bwrap

from rllm.engine import RolloutConfig, RolloutEngine
from rllm.engine.sandbox import BubblewrapBackend, BubblewrapSandbox, SandboxProvider
from rllm.sdk import rollout
from rllm.sdk.sandbox import SandboxAgentError, SandboxError, SandboxLimits, SandboxSpec, needs_sandbox
from rllm.sdk.task_dir import TaskDirError, load_task_dir, run_verifier, task_sandbox_spec
from rllm.testing import wait_until
from rllm.types import ConfigError, Task

pytestmark = [needs_bwrap, pytest.mark.timeout(180)]


@pytest.fixture
async def sandbox() -> AsyncIterator[BubblewrapSandbox]:
    sb = await BubblewrapBackend().create(SandboxSpec())
    try:
        yield sb
    finally:
        await sb.close()


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host folder the agent must not reach (its files named in the attacks' links)."""
    folder = tmp_path / "host"
    folder.mkdir()
    (folder / "victim.txt").write_text("host content\n")
    (folder / "victim.txt").chmod(0o600)
    (folder / "secret.txt").write_text("HOST-SECRET-4711\n")
    return folder


def unblocker(fifo: Path, after_s: float = 15.0) -> threading.Timer:
    """On old code a transfer blocks the event loop on ``fifo`` for ever (no asyncio timeout can
    fire); this opens the other end after ``after_s`` so the test fails instead of hanging."""

    def release() -> None:
        for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
            try:
                os.close(os.open(fifo, flags))
            except OSError:
                pass

    timer = threading.Timer(after_s, release)
    timer.start()
    return timer


# ------------------------------------------------------------------ class 1: links


async def test_upload_into_a_folder_never_writes_through_the_agents_links(
    sandbox: BubblewrapSandbox, host: Path, tmp_path: Path
) -> None:
    await sandbox.exec(f"mkdir -p d && ln -s {host}/victim.txt d/f.txt && ln -s {host} d/sub")
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "f.txt").write_text("uploaded\n")
    (source / "sub" / "x.txt").write_text("uploaded\n")
    try:
        await sandbox.upload(str(source), "d")
    except SandboxError:
        pass  # refusing is fine too; what matters is below
    assert (host / "victim.txt").read_text() == "host content\n"
    assert stat.S_IMODE((host / "victim.txt").stat().st_mode) == 0o600
    assert not (host / "x.txt").exists()
    # Control: the upload itself worked; the links were replaced, not followed.
    assert (
        await sandbox.exec("cat d/f.txt; test -L d/f.txt || echo not-a-link")
    ).stdout == "uploaded\nnot-a-link\n"


async def test_download_never_creates_links_on_the_host(
    sandbox: BubblewrapSandbox, host: Path, tmp_path: Path
) -> None:
    await sandbox.exec(
        f"mkdir -p out/deep && echo data > out/a.txt && ln -s {host} out/h && ln -s /etc out/deep/etc"
    )
    local = tmp_path / "local"
    with pytest.raises(SandboxError, match=r"links or special files.*out/deep/etc.*out/h"):
        await sandbox.download("out", str(local))
    links = [p for p in local.rglob("*") if p.is_symlink()]
    assert links == []
    assert (local / "a.txt").read_text() == "data\n"  # the regular files were copied
    # A second download into the same place (the attack's second step) still writes nothing out.
    with pytest.raises(SandboxError):
        await sandbox.download("out", str(local))
    assert sorted(p.name for p in host.iterdir()) == ["secret.txt", "victim.txt"]


async def test_a_link_in_any_component_is_refused_and_a_loop_is_a_sandbox_error(
    sandbox: BubblewrapSandbox, host: Path
) -> None:
    await sandbox.exec(f"ln -s {host} lnk && mkdir -p real && ln -s ../lnk real/up && ln -s loop loop")
    for path in ("lnk/secret.txt", "real/up/secret.txt", f"{sandbox.spec.workdir}/lnk/secret.txt"):
        with pytest.raises(SandboxError):
            await sandbox.read_file(path)
        with pytest.raises(SandboxError):
            await sandbox.write_file(path.replace("secret", "planted"), "x")
    assert not (host / "planted.txt").exists()
    with pytest.raises(SandboxError, match="link"):
        await sandbox.read_file("loop/x")
    with pytest.raises(SandboxError, match="link"):
        await sandbox.read_file("loop")
    with pytest.raises(SandboxError, match="link"):
        await sandbox.write_file("loop/x", "x")


# ------------------------------------------------------------------ class 2: races


async def test_swapping_a_folder_for_a_link_while_a_command_runs_never_reaches_the_host(
    sandbox: BubblewrapSandbox, host: Path
) -> None:
    swapper = textwrap.dedent(f"""
        import os
        os.mkdir("d"); os.symlink({str(host)!r}, "evil")
        open("d/secret.txt", "w").write("sandbox\\n")
        open("started", "w").close()
        while True:
            os.rename("d", "real"); os.rename("evil", "d"); os.rename("d", "evil"); os.rename("real", "d")
    """)
    await sandbox.write_file("swap.py", swapper)
    running = asyncio.create_task(sandbox.exec(["python3", "swap.py"], timeout=150))
    try:
        await wait_until(lambda: (sandbox.root / "work" / "started").exists(), 30, "the swapper")
        seen: set[bytes] = set()
        for _ in range(2000):  # bounded: each try is one chance for the race
            try:
                seen.add(await sandbox.read_file("d/secret.txt"))
            except (SandboxError, OSError):  # refused (the error class is another test's concern)
                pass
        assert b"HOST-SECRET-4711\n" not in seen
        assert b"sandbox\n" in seen  # control: the real folder was read whenever it was there
        # Writes last: one landing while ``d`` is missing makes a real ``d``, which ends the swaps.
        written = 0
        for _ in range(2000):
            try:
                await sandbox.write_file("d/pwn.txt", "agent")
                written += 1
            except (SandboxError, OSError):
                pass
            assert not (host / "pwn.txt").exists(), "a write went through the swapped-in link"
        assert written > 0
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


# ------------------------------------------------------------------ class 3: special files


async def test_fifos_sockets_and_devices_are_refused_without_blocking(sandbox: BubblewrapSandbox) -> None:
    made = await sandbox.exec(
        "mkfifo f && python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")' && echo ok"
    )
    assert made.stdout == "ok\n", made
    fifo = sandbox.root / "work" / "f"
    timer = unblocker(fifo)
    try:
        with pytest.raises(SandboxError, match="FIFO"):
            await sandbox.read_file("f")
        with pytest.raises(SandboxError):
            await sandbox.read_file("sock")
        with pytest.raises(SandboxError):
            await sandbox.download("f", str(sandbox.root / "unused"))
        # A write replaces the FIFO with a regular file instead of blocking on it.
        await sandbox.write_file("f", "now a file")
    finally:
        timer.cancel()
    assert (await sandbox.exec("test -f f && cat f")).stdout == "now a file"
    if os.geteuid() == 0:  # only root can make a device node (the agent cannot)
        os.mknod(sandbox.root / "work" / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        with pytest.raises(SandboxError):
            await sandbox.read_file("null")


async def test_the_verifier_clears_what_the_agent_left_and_never_blocks(tmp_path: Path) -> None:
    task_dir = tmp_path / "task"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "instruction.md").write_text("Do nothing.\n")
    (task_dir / "tests" / "test.sh").write_text("test ! -e .rllm-tests/sub/planted && echo clean\n")
    task = load_task_dir(task_dir)
    sandbox = await BubblewrapBackend().create(SandboxSpec())
    try:
        # The agent plants a FIFO where the verifier script goes and makes the folder read-only.
        await sandbox.exec(
            "mkdir -p .rllm-tests/sub && echo x > .rllm-tests/sub/planted && mkfifo .rllm-tests/test.sh "
            "&& chmod 555 .rllm-tests/sub .rllm-tests"
        )
        timer = unblocker(sandbox.root / "work" / ".rllm-tests" / "test.sh")
        try:
            verdict = await run_verifier(sandbox, task)
        finally:
            timer.cancel()
        assert verdict.ok and verdict.stdout == "clean\n", verdict
    finally:
        await sandbox.close()


async def test_deepcoder_test_runner_survives_a_program_that_plants_a_fifo() -> None:
    from rllm_cookbook_deepcoder import SANDBOX, run_hidden_tests

    # Passes test 0, then puts a FIFO where the next test's input goes (and a link for the one after).
    code = textwrap.dedent("""
        import os, sys
        print(sys.stdin.read().strip())
        for name in (".hidden/1.in", ".hidden/2.in"):
            if os.path.lexists(name):
                os.remove(name)
        os.mkfifo(".hidden/1.in")
        os.symlink("/etc/passwd", ".hidden/2.in")
    """)
    tests = [
        {"input": "a\n", "output": "a\n"},
        {"input": "b\n", "output": "b\n"},
        {"input": "c\n", "output": "c\n"},
    ]
    sandbox = await BubblewrapBackend().create(SANDBOX)
    timer = unblocker(sandbox.root / "work" / ".hidden" / "1.in")
    try:
        report = await run_hidden_tests(sandbox, code, tests)
    finally:
        timer.cancel()
        await sandbox.close()
    assert report["passed"] == 1 and not report["all_passed"], report


# ------------------------------------------------------------------ class 4: sizes that are not disk


def allocated(folder: Path) -> int:
    """Bytes ``folder``'s files take on the host's disk, each inode counted once (as ``du``)."""
    seen, total = set(), 0
    for path in [folder, *folder.rglob("*")]:
        st = path.lstat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


async def test_hard_links_and_sparse_files_leave_the_sandbox_as_what_they_take(tmp_path: Path) -> None:
    # 1 MiB of data under 144 names and a 48 MiB file of one page: about 1 MiB of the agent's
    # disk, which a name-by-name copy turned into 192 MiB on the host's.
    sandbox = await BubblewrapBackend().create(SandboxSpec(limits=SandboxLimits(disk_mb=64)))
    try:
        made = await sandbox.exec(
            "mkdir out && head -c 1048576 /dev/urandom > out/data && "
            "for i in $(seq 1 143); do ln out/data out/link$i; done && "
            "truncate -s 48M out/sparse && printf tail >> out/sparse && echo made"
        )
        assert made.stdout == "made\n", made
        local = tmp_path / "local"
        await sandbox.download("out", str(local))
        data = (local / "data").read_bytes()
        assert len(data) == 1 << 20 and (local / "link143").read_bytes() == data
        assert (local / "link143").stat().st_ino == (local / "data").stat().st_ino  # one copy
        sparse = local / "sparse"
        assert sparse.stat().st_size == 48 * 2**20 + 4
        with sparse.open("rb") as f:
            f.seek(-4, os.SEEK_END)
            assert f.read() == b"tail"
        assert allocated(local) < 3 * 2**20, allocated(local)  # the data, once, and a few blocks
        single = tmp_path / "single"
        await sandbox.download("out/sparse", str(single))  # a single file is kept sparse too
        assert single.stat().st_size == sparse.stat().st_size and allocated(single) < 2**20
    finally:
        await sandbox.close()


async def test_a_transfer_past_the_disk_cap_is_refused_before_it_is_written(tmp_path: Path) -> None:
    sandbox = await BubblewrapBackend().create(SandboxSpec(limits=SandboxLimits(disk_mb=16)))
    try:
        made = await sandbox.exec(
            "truncate -s 64M big.bin && mkdir many && cd many && "
            "python3 -c 'for i in range(5000): open(str(i), \"w\").close()' && echo made"
        )
        assert made.stdout == "made\n", made
        refused = r"big\.bin.*more than 16 MiB would leave the sandbox"
        with pytest.raises(SandboxAgentError, match=refused):  # the agent's doing: scored
            await sandbox.read_file("big.bin")
        with pytest.raises(SandboxAgentError, match=refused):
            await sandbox.download("big.bin", str(tmp_path / "big.bin"))
        assert not (tmp_path / "big.bin").exists()  # refused before a byte was written
        # Empty files cost the host an inode each: 5,000 of them are past 16 MiB too.
        with pytest.raises(SandboxAgentError, match=r"many.*more than 16 MiB would leave the sandbox"):
            await sandbox.download("many", str(tmp_path / "many"))
        assert len(list((tmp_path / "many").iterdir())) <= 16 * 2**20 // 4096
        # Control: what fits is transferred.
        await sandbox.write_file("small.txt", "fits")
        assert await sandbox.read_file("small.txt") == b"fits"
    finally:
        await sandbox.close()


# ------------------------------------------------------------------ class 5: the smaller ones


def test_a_task_asking_for_the_network_needs_the_operators_consent(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "instruction.md").write_text("Fetch something.\n")
    (tmp_path / "tests" / "test.sh").write_text("true\n")
    (tmp_path / "task.toml").write_text("[environment]\nnetwork = true\n")
    with pytest.raises(TaskDirError, match="allow_network"):
        load_task_dir(tmp_path)
    assert load_task_dir(tmp_path, allow_network=True).metadata["sandbox"]["network"] is True


async def test_a_run_with_a_networked_task_needs_the_consent_key(tmp_path: Path, gateway) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "instruction.md").write_text("Fetch something.\n")
    (tmp_path / "tests" / "test.sh").write_text("true\n")
    (tmp_path / "task.toml").write_text("[environment]\nnetwork = true\n")
    task = load_task_dir(tmp_path, allow_network=True)  # loaded; the run must still be refused
    created: list[SandboxSpec] = []

    class Recording(BubblewrapBackend):
        async def create(self, spec: SandboxSpec) -> BubblewrapSandbox:
            created.append(spec)
            return await super().create(spec)

    @needs_sandbox(task_sandbox_spec)
    @rollout
    async def flow(task: Task, config: object) -> dict:
        return {}

    config = RolloutConfig(max_retries=0, progress=False)
    provider = SandboxProvider(Recording(), warm=1)  # no consent (the default)
    async with RolloutEngine(flow, None, config, gateway_url=gateway.url, sandboxes=provider) as engine:
        with pytest.raises(ConfigError, match=r"sandbox\.allow_task_network.*asks for network"):
            await engine.run([task])
    assert created == []  # refused before any sandbox was made
    consenting = RolloutConfig(max_retries=0, progress=False, sandbox_allow_task_network=True)
    async with RolloutEngine(flow, None, consenting, gateway_url=gateway.url) as engine:
        assert engine.sandboxes.allow_task_network  # the key reaches the engine's provider
        engine.sandboxes.check_consent(task)


async def test_the_setup_script_is_gone_before_the_agent_starts() -> None:
    spec = SandboxSpec(setup="echo the-answer-is-42 > /dev/null\n")
    sandbox = await BubblewrapBackend().create(spec)
    try:
        seen = await sandbox.exec("ls -A /.rllm; cat /.rllm/* 2>/dev/null; true")
        assert "the-answer-is-42" not in seen.stdout and "setup" not in seen.stdout, seen
    finally:
        await sandbox.close()


async def test_close_deletes_the_folder_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    from rllm.engine.sandbox import safe_delete

    sandbox = await BubblewrapBackend().create(SandboxSpec())
    made = await sandbox.exec(
        'python3 -c \'import os\nfor i in range(200):\n os.mkdir(str(i))\n for j in range(100): open(f"{i}/{j}", "w").close()\' && echo made',
        timeout=120,
    )
    assert made.stdout == "made\n", made
    threads: list[bool] = []
    real = safe_delete.remove_tree

    def spy(path: Path) -> bool:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(path)

    monkeypatch.setattr(safe_delete, "remove_tree", spy)
    await sandbox.close()
    assert threads and not any(threads), "the sandbox folder was deleted on the event loop's thread"
    assert not sandbox.root.exists()


def test_a_program_that_leases_one_sandbox_exits() -> None:
    program = textwrap.dedent("""
        import asyncio
        from rllm.engine.sandbox import BubblewrapBackend, SandboxProvider
        from rllm.sdk.sandbox import SandboxSpec, needs_sandbox
        from rllm.types import Task

        @needs_sandbox(SandboxSpec())
        async def flow(task, config=None): ...

        async def main():
            provider = SandboxProvider(BubblewrapBackend())
            async with provider.lease(flow, Task(id="t", instruction="x")) as sandbox:
                print((await sandbox.exec("echo one")).stdout, end="", flush=True)

        asyncio.run(main())
        print("returned", flush=True)
    """)
    try:
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the program did not exit: {exc.stdout!r}") from None
    assert done.returncode == 0 and done.stdout == "one\nreturned\n", done


async def test_a_read_only_bind_under_tmp_is_visible_and_read_only() -> None:
    # A checkout (and its venv) under /tmp, bound in read-only for a harness: the sandbox's own
    # /tmp tmpfs must not hide it (it did: the bind was mounted first; CI clones under /tmp).
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="rllm-ro-bind-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        (folder / "marker.txt").write_text("visible\n")
        (folder / "marker.txt").chmod(0o644)
        sb = await BubblewrapBackend(ro_binds=(str(folder),)).create(SandboxSpec())
        try:
            seen = await sb.exec(f"cat {folder}/marker.txt && touch /tmp/own-file && test -e /tmp/own-file")
            assert seen.ok and seen.stdout == "visible\n", seen
            written = await sb.exec(f"echo x > {folder}/marker.txt")
            assert not written.ok  # read-only inside
        finally:
            await sb.close()
        assert (folder / "marker.txt").read_text() == "visible\n"
    finally:
        shutil.rmtree(folder)
