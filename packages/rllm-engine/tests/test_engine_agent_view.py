"""An agent never sees its grader: on every executor the flow gets ``agent_view(task)`` (no ground
truth, no tests, solution, sandbox spec or dataset-marked grader-only metadata), a command
harness's ``RLLM_TASK`` / ``RLLM_TASK_FILE`` hold only that view (and nothing of the grader is in
its sandbox while it works), a remote agent service is sent only that view, and the evaluator
still gets the full task. Real engine, real gateway, spawned flow processes, a real agent service
on loopback, real bwrap."""

from __future__ import annotations

import importlib
import json
import textwrap

import pytest
from sandbox_helpers import needs_bwrap

from rllm.engine.rollout.agent_server import AgentServer
from rllm.engine.rollout.remote_executor import RemoteSettings
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.sdk import command_flow
from rllm.sdk.sandbox import SandboxSpec
from rllm.sdk.task_dir import task_sandbox_spec
from rllm.types import Task, TerminationReason, to_builtins

SECRETS = ["GT-SECRET", "TESTS-SECRET", "SOLUTION-SECRET", "REFERENCE-SECRET", "SETUP-SECRET"]

# Flow processes are spawned: the flow and evaluator live in an importable module.
FLOWS = """
from rllm.sdk import evaluator, rollout
from rllm.types import EvalOutput, to_builtins


@rollout
async def recorder(task, config):
    return {"seen": to_builtins(task)}


@evaluator
def full_task_evaluator(task, episode):
    # The grader's part reaches the evaluator whole.
    full = task.ground_truth == "GT-SECRET" and "TESTS-SECRET" in str(task.metadata.get("tests"))
    return EvalOutput(reward=1.0 if full else 0.0, is_correct=full)
"""


def secret_task(task_id: str = "t0") -> Task:
    return Task(
        id=task_id,
        instruction="What is 2+2? #0",
        ground_truth="GT-SECRET",
        metadata={
            "map": "VISIBLE-INPUT",  # an input the agent legitimately needs (FrozenLake's map)
            "tests": {"test.sh": "echo TESTS-SECRET"},
            "solution": "echo SOLUTION-SECRET",
            "sandbox": to_builtins(SandboxSpec(setup=": SETUP-SECRET")),
            "reference": "print('REFERENCE-SECRET')",
            "grader_only": ["reference"],
        },
    )


@pytest.fixture
def flows(tmp_path, monkeypatch):
    (tmp_path / "rllm_agent_view_flows.py").write_text(textwrap.dedent(FLOWS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module("rllm_agent_view_flows")


def _assert_saw_only_the_view(seen: object) -> None:
    text = json.dumps(seen)
    assert "VISIBLE-INPUT" in text and "What is 2+2?" in text, text
    leaked = [s for s in SECRETS if s in text]
    assert leaked == [], f"the agent saw {leaked}: {text}"


@pytest.mark.parametrize("executor", ["local", "processes"])
async def test_a_flow_sees_only_the_agent_view_and_the_evaluator_the_full_task(flows, upstream, executor):
    workers = 2 if executor == "processes" else 1
    config = RolloutConfig(n=2, executor=executor, workers=workers, progress=False, max_retries=0)
    async with RolloutEngine(
        flows.recorder, flows.full_task_evaluator, config, upstreams=[upstream.url]
    ) as engine:
        episodes = await engine.run([secret_task("t0"), secret_task("t1")])
    assert len(episodes) == 4
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        _assert_saw_only_the_view(ep.artifacts["seen"])
        assert ep.is_correct and ep.metrics["reward"] == 1.0  # the evaluator had the full task


async def test_a_remote_agent_service_is_sent_only_the_agent_view(flows, upstream):
    received: list[object] = []

    async def recording(task, config):
        received.append(to_builtins(task))
        return {"answer": "4"}

    async with AgentServer(recording) as service:
        config = RolloutConfig(
            n=1, executor="remote", remote=RemoteSettings(urls=[service.url]), progress=False, max_retries=0
        )
        async with RolloutEngine(None, flows.full_task_evaluator, config, upstreams=[upstream.url]) as engine:
            [ep] = await engine.run([secret_task()])
    assert ep.termination_reason == TerminationReason.DONE, ep.error
    [seen] = received
    _assert_saw_only_the_view(seen)
    assert ep.is_correct  # the trainer's evaluator graded it with the full task


# Prints everything the harness can find of its task: the variables, the file, and (in a sandbox)
# every file it can read in the places a grader's files could have been put.
SHOW_TASK = r"""
printf 'env=%s\n' "$RLLM_TASK"
printf 'file=%s\n' "$(cat "$RLLM_TASK_FILE")"
env | grep -v '^RLLM_TASK=' | sed 's/^/var: /'
for place in "$RLLM_WORKDIR" "$(dirname "$RLLM_TASK_FILE")" /tmp /dev/shm "$HOME"; do
  [ -d "$place" ] && grep -rs . "$place" 2>/dev/null | sed 's/^/found: /' | head -c 20000
done
exit 0
"""


async def test_an_unsandboxed_command_harness_gets_only_the_agent_view(flows, gateway, tmp_path):
    script = tmp_path / "show.sh"
    script.write_text(SHOW_TASK)
    flow = command_flow(["sh", str(script)], timeout_s=60)
    config = RolloutConfig(n=1, progress=False, max_retries=0)
    async with RolloutEngine(flow, flows.full_task_evaluator, config, gateway_url=gateway.url) as engine:
        [ep] = await engine.run([secret_task()])
    assert ep.termination_reason == TerminationReason.DONE, (ep.error, ep.metadata)
    env_line = next(line for line in ep.artifacts["answer"].splitlines() if line.startswith("env="))
    _assert_saw_only_the_view(json.loads(env_line[len("env=") :]))
    _assert_saw_only_the_view(ep.artifacts["answer"])
    assert ep.is_correct


@needs_bwrap
@pytest.mark.timeout(120)
async def test_a_sandboxed_command_harness_finds_nothing_of_its_grader_in_its_sandbox(flows, gateway):
    """The task's own sandbox (its spec in the task's metadata, setup script included): the
    harness's variables, its task file and every file it can read in its sandbox hold the agent's
    view only; the tests arrive only when a verifier runs, after it."""
    flow = command_flow(["sh", "-c", SHOW_TASK], timeout_s=60, sandbox=task_sandbox_spec)
    config = RolloutConfig(n=1, progress=False, max_retries=0)
    async with RolloutEngine(flow, flows.full_task_evaluator, config, gateway_url=gateway.url) as engine:
        [ep] = await engine.run([secret_task()])
    assert ep.termination_reason == TerminationReason.DONE, (ep.error, ep.metadata)
    answer = ep.artifacts["answer"]
    assert "found: " in answer and "file={" in answer, answer  # it did look (the task file at least)
    _assert_saw_only_the_view(answer)
    assert ep.is_correct
