"""Who caused a failure decides what becomes of the rollout (docs/architecture.md, "Who caused a
failure"). A failure the agent caused in its own sandbox (its disk cap filled, a link planted
where a file is read) is its outcome: scored 0 with the reason on the episode, never retried,
kept in its group. An infrastructure failure, which the agent cannot cause (a sandbox that does
not start for a host reason, a grader's upstream that is down), is retried. Real engine, real
gateway, real bwrap sandboxes, real loopback sockets."""

from __future__ import annotations

import os
import socket

import httpx
import openai
import pytest
from sandbox_helpers import needs_bwrap

from rllm.algos import AlgorithmConfig
from rllm.algos.filters import filter_groups
from rllm.algos.grouping import group_trajectories
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.sandbox import BubblewrapBackend, SandboxProvider
from rllm.sdk import AgentConfig, evaluator, rollout
from rllm.sdk.sandbox import Sandbox, SandboxLimits, SandboxSpec, current_sandbox, needs_sandbox
from rllm.sdk.task_dir import run_verifier
from rllm.types import Episode, EvalOutput, Task, TerminationReason
from rllm.types.errors import InputError

pytestmark = pytest.mark.timeout(180)

# The workdir's disk cap is a sized tmpfs, which only root can mount (elsewhere the workdir is an
# uncapped host folder, and there is no disk for the agent to fill).
needs_disk_cap = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's disk cap needs root")
SMALL_DISK = SandboxSpec(limits=SandboxLimits(disk_mb=2))
FILL_DISK = "dd if=/dev/zero of=fill bs=64k 2>/dev/null; df -k . | tail -n 1"


def tasks(n: int = 1) -> list[Task]:
    return [
        Task(
            id=f"t{i}",
            instruction=f"What is 2+2? #{i}",
            metadata={"tests": {"test.sh": "test -f answer.txt\n"}, "verify_timeout_s": 30.0},
        )
        for i in range(n)
    ]


async def ask_model(config: AgentConfig) -> None:
    """One model call, so the failed rollout has a trajectory to keep in its group."""
    async with openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as client:
        await client.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": "2+2? #0"}]
        )


async def fill_disk(sandbox: Sandbox) -> None:
    """The agent fills its disk cap. That it did is checked (a command that could not run says
    why), so the test's outcome is about the verifier, never about a fill that did not happen."""
    result = await sandbox.exec(FILL_DISK)
    if " 100% " not in result.stdout:
        raise InputError(
            f"the disk was not filled (exit {result.exit_code}): {result.stdout} {result.stderr}"
        )


def engine_for(flow, grade, upstream, **config) -> RolloutEngine:
    settings = RolloutConfig(
        **{"n": 2, "progress": False, "retry_backoff_s": 0.01, "max_retries": 2, **config}
    )
    return RolloutEngine(flow, grade, settings, upstreams=[upstream.url])


def assert_scored_by_the_agents_fault(episodes: list[Episode], says: str, *, flow_failed: bool) -> None:
    for ep in episodes:
        if flow_failed:
            assert ep.termination_reason == TerminationReason.AGENT_ERROR, ep.error
            assert ep.error is not None and says in ep.error.message, (ep.error, ep.metadata)
            assert ep.error.type == "SandboxAgentError"
        else:  # the flow finished; its verifier was refused by the sandbox the agent broke
            assert ep.termination_reason == TerminationReason.DONE, (ep.error, ep.metadata)
            assert says in ep.metadata.get("eval_error", {}).get("message", ""), (ep.metadata, ep.artifacts)
            assert ep.metadata["eval_error"]["type"] == "SandboxAgentError"
        assert ep.metrics["attempts"] == 1.0 and "retried" not in ep.metadata  # never retried
        assert ep.metrics["reward"] == 0.0 and [t.reward for t in ep.trajectories] == [0.0]
    # Kept in its group under the default algorithm settings: a real outcome, not a lost rollout.
    kept, metrics = filter_groups(group_trajectories(episodes), AlgorithmConfig())
    assert metrics["trajectories_masked"] == 0.0 and [len(g.trajectories) for g in kept] == [len(episodes)]


@rollout
async def never_called(task: Task, config: AgentConfig) -> str:
    raise AssertionError("the flow ran although its sandbox did not start")


@needs_bwrap
@needs_disk_cap
async def test_an_agent_that_fills_its_disk_breaks_its_own_flow_and_is_scored_zero(upstream):
    @needs_sandbox(SMALL_DISK)
    @rollout
    async def filler(task: Task, config: AgentConfig) -> str:
        await ask_model(config)
        sandbox = current_sandbox()
        await fill_disk(sandbox)  # the agent's command
        await sandbox.write_file("notes.txt", "the flow keeps its notes in the sandbox\n" * 100)
        return "4"

    async with engine_for(filler, None, upstream) as engine:
        episodes = await engine.run(tasks())
    assert_scored_by_the_agents_fault(episodes, "disk cap is full", flow_failed=True)


@needs_bwrap
@needs_disk_cap
async def test_an_agent_that_fills_its_disk_before_its_verifier_runs_is_scored_zero_with_the_reason(upstream):
    """The issue's case: the tests are copied in only after the agent is done (by the evaluator,
    in the same sandbox), and a disk the agent filled refuses them."""

    @needs_sandbox(SMALL_DISK)
    @rollout
    async def filler(task: Task, config: AgentConfig) -> str:
        await ask_model(config)
        await fill_disk(current_sandbox())
        return "4"

    @evaluator
    async def verify(task: Task, episode: Episode) -> EvalOutput:
        verdict = await run_verifier(current_sandbox(), task)
        return EvalOutput(reward=float(verdict.ok), is_correct=verdict.ok)

    async with engine_for(filler, verify, upstream) as engine:
        episodes = await engine.run(tasks())
    assert_scored_by_the_agents_fault(episodes, "disk cap is full", flow_failed=False)


@needs_bwrap
async def test_an_agent_that_plants_a_link_where_its_answer_is_read_is_scored_zero(upstream):
    @needs_sandbox(SandboxSpec())
    @rollout
    async def linker(task: Task, config: AgentConfig) -> str:
        await ask_model(config)
        sandbox = current_sandbox()
        await sandbox.exec("ln -s /etc/passwd answer.txt")  # the agent's command
        return (await sandbox.read_file("answer.txt")).decode()

    async with engine_for(linker, None, upstream) as engine:
        episodes = await engine.run(tasks())
    assert_scored_by_the_agents_fault(episodes, "a link is in the way", flow_failed=True)


@needs_bwrap
async def test_a_sandbox_that_cannot_start_for_a_host_reason_is_an_infra_error_and_retried(
    upstream, tmp_path
):
    """The other side of the rule (a control: so it was before): a real bubblewrap backend whose
    host lacks its bwrap binary. The agent never ran, so the rollout is retried, then ends as
    infra_error naming the host's fault."""
    sandboxes = SandboxProvider(BubblewrapBackend(bwrap=str(tmp_path / "no-bwrap-here")))
    flow = needs_sandbox(SandboxSpec())(never_called)
    config = RolloutConfig(n=2, progress=False, retry_backoff_s=0.01, max_retries=2)
    async with RolloutEngine(flow, None, config, upstreams=[upstream.url], sandboxes=sandboxes) as engine:
        episodes = await engine.run(tasks())
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.INFRA_ERROR, ep.error
        assert ep.error is not None and "no-bwrap-here" in ep.error.message
        assert ep.metrics["attempts"] == 3.0 and len(ep.metadata["retried"]) == 2


async def test_a_grader_whose_upstream_is_down_is_an_infra_error_and_retried_not_a_zero(upstream):
    """A verdict the agent cannot have spoilt: the evaluator's judge endpoint refuses connections.
    Scoring that as 0 would teach the policy a falsehood; it is an infra error, retried."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    judge_url = f"http://127.0.0.1:{closed.getsockname()[1]}/judge"
    calls: list[str] = []

    @rollout
    async def answer(task: Task, config: AgentConfig) -> str:
        await ask_model(config)
        return "4"

    @evaluator
    async def judge(task: Task, episode: Episode) -> EvalOutput:
        calls.append(task.id)
        async with httpx.AsyncClient() as client:
            reply = await client.post(judge_url, json={"answer": episode.artifacts["answer"]})
        return EvalOutput(reward=float(reply.json()["score"]))

    try:
        async with engine_for(answer, judge, upstream, max_retries=1) as engine:
            [first, second] = await engine.run(tasks())
    finally:
        closed.close()
    for ep in (first, second):
        assert ep.termination_reason == TerminationReason.INFRA_ERROR, ep.error
        assert ep.error is not None and ep.error.type == "ConnectError"
        assert ep.metrics["attempts"] == 2.0 and len(ep.metadata["retried"]) == 1
    assert len(calls) == 4  # each rollout graded once per attempt
