"""Warm pool, task directories and the engine's per-rollout sandboxes (real bubblewrap)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from sandbox_helpers import host_processes_with, needs_bwrap, within

from rllm.engine import RolloutConfig, RolloutEngine
from rllm.engine.sandbox import BubblewrapBackend, SandboxProvider, WarmPool
from rllm.sdk import rollout
from rllm.sdk.sandbox import SandboxSpec, current_sandbox, needs_sandbox
from rllm.sdk.task_dir import TaskDirError, load_task_dir, run_verifier, task_sandbox_spec
from rllm.types import Task, TerminationReason

pytestmark = [needs_bwrap, pytest.mark.timeout(180)]


class RecordingBackend(BubblewrapBackend):
    """The real backend, recording the order in which sandboxes are created."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[str | None] = []
        self.live: list = []

    async def create(self, spec: SandboxSpec):  # type: ignore[override]
        self.created.append(spec.env.get("NAME"))
        sandbox = await super().create(spec)
        self.live.append(sandbox)
        return sandbox


def named(name: str) -> SandboxSpec:
    return SandboxSpec(env={"NAME": name}, setup='echo "$NAME" > prepared-for')


async def test_pool_prepares_in_schedule_order_and_replaces_what_it_hands_out() -> None:
    backend = RecordingBackend()
    pool = WarmPool(backend, size=2)
    pool.schedule([named("a"), named("b"), named("c"), named("d")])
    assert pool.preparing == [named("a"), named("b")]
    first = await pool.acquire(named("a"))
    try:
        assert (await first.exec("cat prepared-for")).stdout == "a\n"  # setup ran before hand-out
        assert backend.created[:2] == ["a", "b"]
        second = await pool.acquire(named("b"))
        third = await pool.acquire(named("c"))  # prepared as the replacement of a's slot
        assert pool.preparing == [named("d")]  # c replaced a's slot, d replaced b's
        assert backend.created[:3] == ["a", "b", "c"]
        assert pool.stats == {"warm": 3, "cold": 0, "dead": 0}
        cold = await pool.acquire(named("z"))  # nothing scheduled for it
        assert pool.stats["cold"] == 1 and (await cold.exec("cat prepared-for")).stdout == "z\n"
        for sandbox in (second, third, cold):
            await sandbox.close()
    finally:
        await first.close()
        await pool.close()
    assert all(sandbox.closed for sandbox in backend.live)  # d, never acquired, closed with the pool


async def test_pool_checks_liveness_before_hand_out() -> None:
    backend = RecordingBackend()
    pool = WarmPool(backend, size=1)
    pool.schedule([named("a")])
    prepared = await pool._slots[0][1]
    await prepared.close()  # it died while waiting in the pool
    sandbox = await pool.acquire(named("a"))
    try:
        assert sandbox is not prepared and await sandbox.is_alive()
        assert pool.stats == {"warm": 0, "cold": 0, "dead": 1}
        assert (await sandbox.exec("cat prepared-for")).stdout == "a\n"
    finally:
        await sandbox.close()
        await pool.close()


async def test_failed_setup_is_an_error_not_a_sandbox() -> None:
    from rllm.sdk.sandbox import SandboxError

    with pytest.raises(SandboxError, match="setup script failed"):
        await BubblewrapBackend().create(SandboxSpec(setup="echo broken >&2; exit 3"))


# ---------------------------------------------------------------------------------- engine
ARRIVED: dict[str, asyncio.Event] = {}


@needs_sandbox(lambda task: SandboxSpec(setup=f"echo {task.id} > who"))
@rollout
async def sandboxed_flow(task: Task, config) -> dict:
    sandbox = current_sandbox()
    # Unique sleep durations mark this run's processes on the host (other runs may be alive).
    marker = task.metadata["marker"]
    who = (await sandbox.exec(f"cat who; sleep {marker} & echo started")).stdout
    ARRIVED.setdefault(task.id, asyncio.Event()).set()
    if task.metadata.get("mode") == "error":
        raise RuntimeError("the agent crashed")
    if task.metadata.get("mode") == "hang":
        await sandbox.exec(f"sleep {marker + 1}", timeout=600)
    return {"who": who.split()[0]}


async def test_engine_injects_and_always_cleans_up(gateway) -> None:
    backend = RecordingBackend()
    marker = random.randrange(10**6, 10**7)
    tasks = [
        Task(id=f"t{i}", instruction="x", metadata={"mode": m, "marker": marker})
        for i, m in enumerate(["ok", "error", "hang"])
    ]
    config = RolloutConfig(deadline_s=5, max_retries=0, progress=False)
    provider = SandboxProvider(backend, warm=2)
    async with RolloutEngine(
        sandboxed_flow, None, config, gateway_url=gateway.url, sandboxes=provider
    ) as engine:
        episodes = await engine.run(tasks)
    by_id = {ep.task_id: ep for ep in episodes}
    assert by_id["t0"].termination_reason == TerminationReason.DONE
    assert by_id["t0"].artifacts["who"] == "t0"  # its own per-task setup ran first
    assert by_id["t1"].termination_reason == TerminationReason.AGENT_ERROR
    assert by_id["t2"].termination_reason == TerminationReason.TIMEOUT
    assert backend.live and all(sandbox.closed for sandbox in backend.live)
    assert host_processes_with(f"sleep {marker}") == [] and host_processes_with(f"sleep {marker + 1}") == []
    assert provider.pool.stats["warm"] >= 1


async def test_cancelled_rollout_closes_its_sandbox(gateway) -> None:
    backend = RecordingBackend()
    config = RolloutConfig(deadline_s=None, max_retries=0, progress=False)
    marker = random.randrange(10**6, 10**7)
    task = Task(id="c", instruction="x", metadata={"mode": "hang", "marker": marker})
    async with (
        within(120, "the cancelled rollout"),
        RolloutEngine(
            sandboxed_flow, None, config, gateway_url=gateway.url, sandboxes=SandboxProvider(backend)
        ) as engine,
    ):
        arrived = ARRIVED.setdefault("c", asyncio.Event())
        run = asyncio.ensure_future(engine.run_one(task))
        arrival = asyncio.ensure_future(arrived.wait())
        await asyncio.wait([arrival, run], return_when=asyncio.FIRST_COMPLETED)
        assert not run.done(), run.result()  # the flow has its sandbox and goes into its long exec
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    assert backend.live and all(sandbox.closed for sandbox in backend.live)
    assert host_processes_with(f"sleep {marker + 1}") == []


# ---------------------------------------------------------------------------- task directories
def make_task_dir(root: Path) -> Path:
    task = root / "count-lines"
    (task / "environment" / "files").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "instruction.md").write_text("Write the number of lines of data.txt into count.txt.\n")
    (task / "task.toml").write_text(
        "[agent]\ntimeout_sec = 30\n[verifier]\ntimeout_sec = 10\n[environment]\nmemory_mb = 512\n"
        '[metadata]\ncategory = "text"\n'
    )
    (task / "environment" / "files" / "data.txt").write_text("a\nb\nc\n")
    (task / "environment" / "setup.sh").write_text("echo extra >> data.txt\n")
    (task / "tests" / "test.sh").write_text('test "$(cat count.txt)" = "$(cat .rllm-tests/expected)"\n')
    (task / "tests" / "expected").write_text("4\n")
    (task / "solution" / "solve.sh").write_text("wc -l < data.txt > count.txt\n")
    return task


async def test_task_directory_setup_verify_and_hidden_tests(tmp_path: Path) -> None:
    task = load_task_dir(make_task_dir(tmp_path))
    assert task.instruction.startswith("Write the number") and task.metadata["category"] == "text"
    spec = task_sandbox_spec(task)
    assert spec.limits.memory_mb == 512 and task.metadata["agent_timeout_s"] == 30
    sandbox = await BubblewrapBackend().create(spec)
    try:
        assert (await sandbox.exec("ls -A")).stdout == "data.txt\n"  # the tests are not there
        assert not (await run_verifier(sandbox, task)).ok  # unsolved
        await sandbox.write_file("solve.sh", task.metadata["solution"])
        await sandbox.exec("sh solve.sh")
        assert (await run_verifier(sandbox, task)).ok
    finally:
        await sandbox.close()


def test_bad_task_directory_names_the_problem(tmp_path: Path) -> None:
    task = make_task_dir(tmp_path)
    (task / "task.toml").write_text("[environment]\nmemory_mb = 0\n")
    with pytest.raises(TaskDirError, match="memory_mb"):
        load_task_dir(task)
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(TaskDirError, match=r"missing tests/test\.sh"):
        load_task_dir(task)
