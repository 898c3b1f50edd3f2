"""Rollouts across worker processes (RolloutConfig.workers > 1): real spawned processes, each
with its own embedded gateway, in front of a real loopback upstream; flows use the openai client."""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import textwrap

import pytest
from sandbox_helpers import needs_bwrap

from rllm.engine.rollout.early_flow_processes import OFF_ENV as EARLY_OFF_ENV
from rllm.engine.rollout.early_flow_processes import start_early
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.gateway import GatewayServer
from rllm.sdk import rollout
from rllm.types import TerminationReason

# Worker processes are spawned, so their flow must be importable: it lives in a module written
# to a temporary directory on sys.path (inherited by the workers).
FLOWS = """
import os

import openai

from rllm.sdk import rollout


def _first_to_claim(marker):
    # O_EXCL makes the claim atomic: when two workers run t0 at once only one of them dies.
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


@rollout
async def two_turns(task, config):
    marker = config.metadata.get("die_once")
    if marker and task.id == "t0" and _first_to_claim(marker):
        os._exit(3)  # the worker process dies mid-rollout
    client = openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0)
    messages = [{"role": "user", "content": f"{task.instruction} #{task.id}"}]
    for turn in range(2):
        reply = await client.chat.completions.create(model=config.model, messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": f"go on {turn} #{task.id}"}]
    await client.close()
    return {"pid": os.getpid(), "model": config.model}


@rollout
async def timed(task, config):
    # Its one call is held by the upstream until enough calls run at once (held_upstream).
    import time
    start = time.time()
    client = openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0)
    await client.chat.completions.create(model=config.model, messages=[{"role": "user", "content": "hi"}])
    await client.close()
    return {"pid": os.getpid(), "start": start, "end": time.time()}


@rollout
async def unsendable(task, config):
    return {"handle": object()} if task.id == "t1" else {"ok": True}


from rllm.sdk.sandbox import SandboxSpec, current_sandbox, needs_sandbox


@needs_sandbox(lambda task: SandboxSpec(setup=f"echo {task.id} > who"))
@rollout
async def sandboxed(task, config):
    who = (await current_sandbox().exec("cat who; sleep 0.3")).stdout
    return {"who": who.strip(), "pid": os.getpid()}


@rollout
def one_turn_sync(task, config):
    with openai.OpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as client:
        reply = client.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": f"{task.instruction} #{task.id}"}]
        )
    return {"text": reply.choices[0].message.content}
"""


@pytest.fixture
def flows(tmp_path, monkeypatch):
    (tmp_path / "rllm_worker_flows.py").write_text(textwrap.dedent(FLOWS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module("rllm_worker_flows")


class HeldCalls:
    """An upstream responder that holds each call until ``at_once`` calls have arrived, then lets
    every call through: the first ``at_once`` flows are in flight together, whatever the machine's
    load (a rendezvous, where a sleep in the flow only made overlap likely)."""

    def __init__(self, at_once: int) -> None:
        self.at_once = at_once
        self.arrived = 0
        self.all_in = asyncio.Event()

    async def reply(self, body: dict) -> str:
        self.arrived += 1
        if self.arrived >= self.at_once:
            self.all_in.set()
        # Never that many at once: the call fails (HTTP 500) and so does the test, naming the flow.
        await asyncio.wait_for(self.all_in.wait(), 30)
        return "hello"


@pytest.fixture
async def held_upstream(request):
    """A MockUpstream whose calls wait for each other (``HeldCalls``); parametrise ``at_once``."""
    from rllm.testing import MockUpstream

    held = HeldCalls(request.param)
    async with MockUpstream(responder=held.reply) as upstream:
        yield upstream


def _tasks(n: int) -> list[dict[str, str]]:
    return [{"id": f"t{i}", "instruction": "what is 2 + 2?"} for i in range(n)]


async def test_rollouts_spread_over_worker_processes_with_their_own_gateways(flows, upstream):
    config = RolloutConfig(n=2, concurrency=16, workers=2, progress=False)
    async with RolloutEngine(flows.two_turns, None, config, upstreams=[upstream.url]) as engine:
        await engine.client.set_weight_version(7)  # reaches every worker's gateway
        assert await engine.client.get_weight_version() == 7
        episodes = await engine.run(_tasks(20))
        # a trainer renames the served model after a remote weight sync: workers follow
        engine.config.model = "policy-v2"
        renamed = await engine.run(_tasks(4))
    assert {ep.artifacts["model"] for ep in renamed} == {"policy-v2"}
    assert len(episodes) == 40
    assert [(ep.task_id, ep.rollout_index) for ep in episodes] == [
        (f"t{i}", r) for i in range(20) for r in range(2)
    ]
    pids = set()
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        (traj,) = ep.trajectories
        assert len(traj.steps) == 2
        for step in traj.steps:
            assert step.weight_version == 7
            assert len(step.completion_ids) == len(step.completion_logprobs) > 0
        assert traj.steps[1].input[-1].content == f"go on 0 #{ep.task_id}"  # no cross-talk
        pids.add(ep.artifacts["pid"])
    assert len(pids) == 2  # both processes served rollouts
    # each episode names its worker, one name per process (the per-worker sandbox metrics need it)
    by_pid = {ep.artifacts["pid"]: set() for ep in episodes}
    for ep in episodes:
        by_pid[ep.artifacts["pid"]].add(ep.metadata["rollout_worker"])
    assert sorted(n for names in by_pid.values() for n in names) == ["process-0", "process-1"]


def _most_at_once(episodes) -> int:
    events = sorted(
        [(ep.artifacts["start"], 1) for ep in episodes] + [(ep.artifacts["end"], -1) for ep in episodes]
    )
    running = most = 0
    for _, delta in events:  # an end sorts before a start at the same instant
        running += delta
        most = max(most, running)
    return most


@pytest.mark.parametrize(
    ("concurrency", "workers", "held_upstream"), [(3, 2, 3), (1, 2, 1)], indirect=["held_upstream"]
)
async def test_concurrency_is_split_between_workers_and_never_exceeded(
    flows, held_upstream, concurrency, workers
):
    """Each worker runs at most its share; the jobs sent ahead (prefetch) wait in the worker.
    The upstream holds the first ``concurrency`` calls until all of them are in: they overlap."""
    config = RolloutConfig(n=1, concurrency=concurrency, workers=workers, progress=False)
    async with RolloutEngine(flows.timed, None, config, upstreams=[held_upstream.url]) as engine:
        assert engine._pool.capacity > concurrency or concurrency < workers
        episodes = await engine.run(_tasks(10))
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes)
    assert _most_at_once(episodes) == concurrency
    if concurrency >= workers:
        assert len({ep.artifacts["pid"] for ep in episodes}) == workers


@pytest.mark.parametrize("held_upstream", [2], indirect=True)
async def test_slots_report_waiting_only_for_an_empty_queue(flows, held_upstream):
    """``slot_wait_s``: with every job sent ahead, each slot waits once, for the batch to start;
    the jobs queued behind are taken at once (0.0). The first two calls are held until both are
    in, so every job has been sent ahead before any slot frees."""
    config = RolloutConfig(n=1, concurrency=2, workers=2, worker_prefetch=10, progress=False)
    async with RolloutEngine(flows.timed, None, config, upstreams=[held_upstream.url]) as engine:
        episodes = await engine.run(_tasks(10))
    waits = sorted(ep.metrics["slot_wait_s"] for ep in episodes)
    assert waits[:8] == [0.0] * 8 and all(w > 0.0 for w in waits[8:])


async def test_a_dead_worker_fails_over_and_the_batch_completes(flows, upstream, tmp_path):
    marker = tmp_path / "died"
    config = RolloutConfig(n=1, concurrency=8, workers=2, progress=False, metadata={"die_once": str(marker)})
    async with RolloutEngine(flows.two_turns, None, config, upstreams=[upstream.url]) as engine:
        episodes = await engine.run(_tasks(12))
        assert sum(w.alive for w in engine._pool.workers) == 1
    assert marker.exists()
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes), [
        ep.error for ep in episodes if ep.error
    ]


async def test_sync_flows_run_in_each_workers_thread_pool(flows, upstream):
    config = RolloutConfig(n=2, concurrency=8, workers=2, progress=False)
    async with RolloutEngine(flows.one_turn_sync, None, config, upstreams=[upstream.url]) as engine:
        episodes = await engine.run(_tasks(4))
    assert len(episodes) == 8
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        (step,) = ep.trajectories[0].steps
        assert step.input[-1].content.endswith(f"#{ep.task_id}") and len(step.completion_ids) > 0


async def test_workers_attached_to_one_gateway(flows, gateway: GatewayServer):
    config = RolloutConfig(n=1, concurrency=8, workers=2, progress=False)
    async with RolloutEngine(flows.two_turns, None, config, gateway_url=gateway.url) as engine:
        episodes = await engine.run(_tasks(6))
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes)
    assert gateway.sessions == {} and gateway.store.trace_count() == 0  # every session finished


async def test_a_flow_that_cannot_be_imported_is_refused(upstream):
    @rollout
    async def local_flow(task, config):
        return None

    config = RolloutConfig(workers=2, progress=False)
    with pytest.raises(ValueError, match="importable flow"):
        async with RolloutEngine(local_flow, None, config, upstreams=[upstream.url]):
            pass


def test_config_refuses_zero_workers():
    from rllm.types import InvariantError

    with pytest.raises(InvariantError, match="workers"):
        RolloutConfig(workers=0)


async def test_frames_survive_any_chunking_over_a_real_socket_pair():
    """The pipe's framing: frames split at every byte, several per read, and one of 3 MB."""
    import asyncio
    import socket

    from rllm.engine.rollout.frames import HEADER, Frames

    payloads = [b"", b"x", bytes(range(256)) * 3, b"y" * (3 << 20), b"tail"]
    wire = b"".join(HEADER.pack(len(p)) + p for p in payloads)
    got: list[bytes] = []
    lost = asyncio.Event()
    frames = Frames(lambda view: got.append(bytes(view)), lost.set)
    for cut in (1, 3, 4, 7, 1000, 65536, len(wire)):  # one protocol fed directly, in pieces
        for i in range(0, len(wire), cut):
            frames.data_received(wire[i : i + cut])
    assert got == payloads * 7

    got.clear()
    all_in = asyncio.Event()

    def receive(view: memoryview) -> None:
        got.append(bytes(view))
        if len(got) == len(payloads):
            all_in.set()

    a, b = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(lambda: Frames(receive, lost.set), sock=a)
    b.setblocking(False)
    await loop.sock_sendall(b, wire)
    await asyncio.wait_for(all_in.wait(), 30)
    assert got == payloads
    b.close()
    await asyncio.wait_for(lost.wait(), 5)
    transport.close()


async def test_frames_sent_in_one_loop_pass_go_out_together_and_in_order():
    """send() queues; the pass's frames leave in one write after it (each write wakes the peer)."""
    import asyncio
    import socket

    from rllm.engine.rollout.frames import Frames

    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    got: list[bytes] = []
    lost = asyncio.Event()
    payloads = [f"job {i}".encode() * (i + 1) for i in range(100)] + [b"z" * (1 << 20)]
    all_in = asyncio.Event()

    def receive(view: memoryview) -> None:
        got.append(bytes(view))
        if len(got) == len(payloads):
            all_in.set()

    _, sender = await loop.create_connection(lambda: Frames(lambda v: None, lost.set), sock=a)
    _, receiver = await loop.create_connection(lambda: Frames(receive, lost.set), sock=b)
    writes: list[int] = []
    real_write = sender.transport.write
    sender.transport.write = lambda data: (writes.append(len(data)), real_write(data))  # type: ignore[method-assign]
    for p in payloads:
        sender.send(p)
    assert writes == []  # nothing written while this pass runs
    await asyncio.wait_for(all_in.wait(), 30)
    assert got == payloads and len(writes) == 1
    receiver.transport.close()
    await asyncio.wait_for(lost.wait(), 5)


async def test_a_bad_frame_closes_the_pipe():
    import asyncio
    import socket

    from rllm.engine.rollout.frames import HEADER, Frames

    def refuse(view: memoryview) -> None:
        raise ValueError("not a frame we know")

    lost = asyncio.Event()
    a, b = socket.socketpair()
    _, pipe = await asyncio.get_running_loop().create_connection(lambda: Frames(refuse, lost.set), sock=a)
    b.sendall(HEADER.pack(3) + b"abc")
    await asyncio.wait_for(lost.wait(), 5)
    with pytest.raises(ConnectionResetError):
        pipe.send(b"more")
    b.close()


def test_worker_shares_and_prefetch():
    from rllm.engine.rollout.worker_pool import WorkerSlots
    from rllm.types import InvariantError

    slots = WorkerSlots(3, concurrency=1000)
    assert slots.shares == [334, 333, 333] and slots.prefetch == 166  # half a share queued ahead
    assert slots.capacity == 1000 + 3 * 166
    exact = WorkerSlots(3, concurrency=10, prefetch=0)
    assert exact.capacity == 10  # no jobs queued ahead: every job the pool takes runs at once
    few = WorkerSlots(4, concurrency=2)
    assert few.shares == [1, 1, 0, 0] and few.capacity == 4  # workers without a share get nothing
    assert [few.runs(i) for i in range(4)] == [1, 1, 1, 1]  # one each, should the others die
    with pytest.raises(InvariantError, match="worker_prefetch"):
        RolloutConfig(worker_prefetch=-1)


async def test_an_episode_that_cannot_leave_its_worker_fails_alone(flows, upstream):
    config = RolloutConfig(n=1, concurrency=4, workers=2, progress=False)
    async with RolloutEngine(flows.unsendable, None, config, upstreams=[upstream.url]) as engine:
        episodes = await asyncio.wait_for(engine.run(_tasks(3)), 60)  # no hang waiting for t1
    reasons = [ep.termination_reason for ep in episodes]
    assert reasons == [TerminationReason.DONE, TerminationReason.AGENT_ERROR, TerminationReason.DONE]
    assert "msgpack-encodable" in episodes[1].error.message and episodes[1].metrics["reward"] == 0.0


async def test_a_worker_that_dies_while_starting_is_reported(tmp_path, monkeypatch, upstream):
    (tmp_path / "rllm_flows_broken_in_workers.py").write_text(
        textwrap.dedent(
            """
            import os

            from rllm.sdk import rollout

            if os.environ["RLLM_TEST_PARENT_PID"] != str(os.getpid()):  # a (spawned) worker
                raise ImportError("this module cannot be imported in a worker process")


            @rollout
            async def flow(task, config):
                return None
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RLLM_TEST_PARENT_PID", str(os.getpid()))
    module = importlib.import_module("rllm_flows_broken_in_workers")
    config = RolloutConfig(workers=2, progress=False)
    engine = RolloutEngine(module.flow, None, config, upstreams=[upstream.url])
    with pytest.raises(RuntimeError, match="failed to start") as err:
        await asyncio.wait_for(engine.start(), 60)
    # The worker's own error, in one line: not "did not start" after start_timeout_s.
    assert "ImportError: this module cannot be imported in a worker process" in str(err.value)
    assert "\n" not in str(err.value)
    assert engine._pool is None or engine._pool.workers == []


async def test_a_worker_whose_engine_fails_to_start_fails_the_pool_at_once_with_its_error(
    tmp_path, monkeypatch
):
    """A worker whose engine raises on start fails the pool with the worker's own line, without
    waiting out ``start_timeout_s`` (an hour here) for the other worker, which never starts."""
    from rllm.engine.rollout.flow_processes import FlowProcessPool

    (tmp_path / "rllm_engines_failing_to_start.py").write_text(
        textwrap.dedent(
            """
            import asyncio


            class Engine:
                def __init__(self, *, index, **kwargs):
                    self.index = index

                async def start(self):
                    if self.index == 1:
                        raise RuntimeError("no GPU on this node\\nsecond line")
                    await asyncio.Event().wait()  # worker 0 never gets there
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("rllm_engines_failing_to_start")

    class PerWorker(FlowProcessPool):  # each worker is told its index (a pickled, module-level class)
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.slots.engine_kwargs = lambda kwargs, i: {**kwargs, "index": i}

    pool = PerWorker(2, {}, engine=module.Engine, concurrency=2, start_timeout_s=3600)
    with pytest.raises(RuntimeError) as err:
        await asyncio.wait_for(pool.start(), 120)
    assert str(err.value) == "rollout worker 1 failed to start: RuntimeError: no GPU on this node"
    assert pool.workers == []  # both closed, the one still starting too


async def test_a_worker_still_starting_at_the_timeout_is_not_called_broken(flows, upstream, monkeypatch):
    """A worker that is slow to start (an overloaded machine) is reported as such, not as a flow
    that cannot be imported; the pool it was part of is closed."""
    import functools

    from rllm.engine.rollout import flow_processes
    from rllm.engine.rollout.flow_processes import FlowProcessPool

    # The executors' dispatch imports the pool class from its module when it starts one.
    monkeypatch.setattr(
        flow_processes, "FlowProcessPool", functools.partial(FlowProcessPool, start_timeout_s=0.001)
    )
    config = RolloutConfig(workers=2, progress=False)
    engine = RolloutEngine(flows.two_turns, None, config, upstreams=[upstream.url])
    with pytest.raises(RuntimeError, match=r"did not start within 0 s \(it is still starting") as err:
        await asyncio.wait_for(engine.start(), 60)
    assert "importable" not in str(err.value)
    assert engine._pool is None or engine._pool.workers == []


@pytest.mark.parametrize("workers", [1, 2])
async def test_run_one_takes_the_model_name_per_rollout(flows, upstream, workers):
    """Rollouts from before and after a rename can be in flight together: the name goes with
    each rollout, not through the shared config."""
    from rllm.types import Task

    config = RolloutConfig(n=1, concurrency=4, workers=workers, progress=False, model="policy-v1")
    async with RolloutEngine(flows.two_turns, None, config, upstreams=[upstream.url]) as engine:
        task = Task(id="t0", instruction="what is 2 + 2?")
        old, new = await asyncio.gather(engine.run_one(task), engine.run_one(task, model="policy-v2"))
    assert (old.artifacts["model"], new.artifacts["model"]) == ("policy-v1", "policy-v2")
    assert engine.config.model == "policy-v1"


async def test_ctrl_c_leaves_the_workers_to_the_parent(flows, upstream):
    """Ctrl-C signals the whole process group: workers ignore it (no KeyboardInterrupt
    tracebacks), keep serving, and exit cleanly when the parent closes them."""
    import signal

    config = RolloutConfig(n=1, concurrency=4, workers=2, progress=False)
    async with RolloutEngine(flows.two_turns, None, config, upstreams=[upstream.url]) as engine:
        assert engine._pool is not None
        processes = [w.process for w in engine._pool.workers]
        for process in processes:
            os.kill(process.pid, signal.SIGINT)
        episodes = await engine.run(_tasks(8))
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes), [
        ep.error for ep in episodes
    ]
    assert [p.exitcode for p in processes] == [0, 0]


@needs_bwrap
async def test_each_worker_keeps_warm_sandboxes_for_the_jobs_it_holds(flows, upstream):
    """A job's sandbox is prepared in its worker while the job waits for a slot (before, with
    workers > 1, every sandbox was acquired cold); each rollout records its acquire latency."""
    config = RolloutConfig(
        n=1, concurrency=2, workers=2, worker_prefetch=3, sandbox_warm=3, max_retries=0, progress=False
    )
    async with RolloutEngine(flows.sandboxed, None, config, upstreams=[upstream.url]) as engine:
        episodes = await engine.run(_tasks(10))
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes), [
        ep.error for ep in episodes
    ]
    assert [ep.artifacts["who"] for ep in episodes] == [f"t{i}" for i in range(10)]
    assert all(ep.metrics["sandbox_acquire_s"] >= 0 for ep in episodes)
    warm = [ep for ep in episodes if ep.metrics["sandbox_warm"] == 1.0]
    assert {ep.artifacts["pid"] for ep in warm} == {ep.artifacts["pid"] for ep in episodes}  # in each worker


# ----------------------------------------------------------------------------- early start
async def test_workers_started_early_are_the_ones_that_run_the_rollouts(flows, upstream):
    """start_early's processes (spawned before the engine exists, as a trainer does while its
    backend loads the model) are adopted by the engine's pool: no fresh spawn, same episodes."""
    config = RolloutConfig(n=2, concurrency=8, workers=2, progress=False)
    handler = signal.getsignal(signal.SIGINT)
    early = start_early(config, flows.two_turns, None, tokenizer=True)
    assert early is not None
    assert signal.getsignal(signal.SIGINT) is handler  # this process's Ctrl-C handling is back
    early_pids = {proc.pid for proc, _ in early._waiting}
    for pid in early_pids:  # a Ctrl-C reaching them while they start: ignored from their first instruction
        os.kill(pid, signal.SIGINT)
    async with RolloutEngine(
        flows.two_turns, None, config, upstreams=[upstream.url], early_workers=early
    ) as engine:
        await engine.client.set_weight_version(3)
        episodes = await engine.run(_tasks(6))
    assert early._waiting == []
    assert {ep.artifacts["pid"] for ep in episodes} == early_pids
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        (traj,) = ep.trajectories
        assert [s.weight_version for s in traj.steps] == [3, 3]
        assert traj.steps[1].input[-1].content == f"go on 0 #{ep.task_id}"
    assert sorted({ep.metadata["rollout_worker"] for ep in episodes}) == ["process-0", "process-1"]


async def test_an_early_worker_that_died_is_replaced_by_a_fresh_spawn(flows, upstream):
    config = RolloutConfig(n=1, concurrency=4, workers=2, progress=False)
    early = start_early(config, flows.two_turns, None, tokenizer=False)
    assert early is not None
    (dead, _), (alive, _) = early._waiting
    dead.kill()
    await asyncio.to_thread(dead.join)  # its exit, not a sleep
    async with RolloutEngine(
        flows.two_turns, None, config, upstreams=[upstream.url], early_workers=early
    ) as engine:
        episodes = await engine.run(_tasks(4))
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes)
    pids = {ep.artifacts["pid"] for ep in episodes}
    assert alive.pid in pids and dead.pid not in pids and len(pids) == 2


async def test_early_workers_refuse_an_unimportable_flow_as_spawned_ones_do(upstream):
    @rollout
    async def local_flow(task, config):
        return None

    config = RolloutConfig(workers=2, progress=False)
    early = start_early(config, local_flow, None, tokenizer=False)
    assert early is not None
    procs = [proc for proc, _ in early._waiting]
    with pytest.raises(ValueError, match="importable flow"):
        async with RolloutEngine(local_flow, None, config, upstreams=[upstream.url], early_workers=early):
            pass
    assert early._waiting == []
    for proc in procs:  # ended: their sockets closed (and terminated if still importing)
        await asyncio.to_thread(proc.join)


def test_early_start_only_for_process_workers(flows, monkeypatch):
    assert start_early(RolloutConfig(workers=1), flows.two_turns, None, tokenizer=False) is None
    monkeypatch.setenv(EARLY_OFF_ENV, "1")
    assert start_early(RolloutConfig(workers=2), flows.two_turns, None, tokenizer=False) is None
