"""The terminal cookbook: its ten task directories, the tool loop against a scripted model, and
2 training steps with native tool calls. Everything runs in real bubblewrap sandboxes."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import msgspec
import pytest
from rllm_cookbook_terminal import TOOLS, load_tasks

from rllm.engine.plugins import load_cookbook
from rllm.engine.sandbox import BubblewrapBackend
from rllm.engine.training.launch import task_vocabulary
from rllm.sdk.task_dir import run_verifier, task_sandbox_spec
from rllm.testing import MockReply

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed: apt-get install bubblewrap"
)


def _call(name: str, **args: str) -> MockReply:
    return MockReply(
        tool_calls=[
            {
                "id": f"call_{name}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ]
    )


async def test_every_task_is_unsolved_at_start_and_solved_by_its_reference() -> None:
    tasks = load_tasks("train")
    assert len(tasks) == 10 and len({t.id for t in tasks}) == 10
    backend = BubblewrapBackend()
    for task in tasks:
        sandbox = await backend.create(task_sandbox_spec(task))
        try:
            before = await run_verifier(sandbox, task)
            assert not before.ok, task.id
            await sandbox.write_file("solve.sh", task.metadata["solution"])
            ran = await sandbox.exec("sh solve.sh && rm solve.sh")
            assert ran.ok, (task.id, ran.stderr)
            after = await run_verifier(sandbox, task)
            assert after.ok, (task.id, after.stdout, after.stderr)
        finally:
            await sandbox.close()


async def test_tool_loop_against_a_scripted_model(scripted) -> None:
    tasks = load_tasks("test")
    solve = {t.instruction: t.metadata["solution"] for t in tasks[:5]}
    chatty = msgspec.structs.replace(tasks[6], metadata={**tasks[6].metadata, "max_turns": 3})
    cheat_instruction = tasks[7].instruction
    plan = [*tasks[:6], chatty, *tasks[7:]]
    cheat_saw: list[str] = []

    def respond(body):
        assert [t["function"]["name"] for t in body["tools"]] == ["run_shell", "submit"]
        messages = body["messages"]
        instruction = messages[1]["content"]
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if instruction == chatty.instruction:
            return "I would rather talk about it."
        if instruction == cheat_instruction:
            # Looks for the tests to copy the answer: they are not in the sandbox yet.
            if not results:
                return _call("run_shell", command="cat .rllm-tests/test.sh; ls -A")
            cheat_saw.append(results[0])
            return _call("submit")
        if results:
            return _call("submit")
        if instruction in solve:
            return _call("run_shell", command=solve[instruction])
        return _call("run_shell", command="echo not-the-answer > answer.txt")

    episodes = await scripted(load_cookbook("terminal"), plan, respond)
    by_id = {e.task_id: e for e in episodes}
    rewards = {e.task_id: e.trajectories[0].reward for e in episodes}
    assert rewards == {t.id: (1.0 if t.instruction in solve else 0.0) for t in plan}
    solved = by_id[tasks[0].id]
    assert solved.artifacts["submitted"] and solved.artifacts["commands"] == 1
    assert solved.trajectories[0].steps[0].output.tool_calls[0].function.name == "run_shell"
    limited = by_id[chatty.id]
    assert limited.termination_reason == "max_turns" and limited.artifacts["turns"] == 3
    cheat = by_id[tasks[7].id]
    assert (
        "No such file" in cheat_saw[0]
        and ".rllm-tests" not in cheat_saw[0].split("stdout:")[1].split("stderr:")[0]
    )
    assert cheat.is_correct is False


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's disk cap (a sized tmpfs) needs root")
async def test_an_agent_that_fills_its_disk_is_scored_zero_with_the_reason_not_retried(scripted) -> None:
    """The agent fills its disk cap, so the verifier (run after it, by the evaluator) cannot copy
    the tests in: the agent's doing, scored 0 with the reason, never retried as infrastructure."""
    task = load_tasks("test")[0]
    sandbox = task.metadata["sandbox"]
    small = {**sandbox, "limits": {**sandbox.get("limits", {}), "disk_mb": 2}}
    task = msgspec.structs.replace(task, metadata={**task.metadata, "sandbox": small})

    def respond(body):
        if any(m["role"] == "tool" for m in body["messages"]):
            return _call("submit")
        return _call("run_shell", command="dd if=/dev/zero of=fill bs=64k; df -k .")

    [ep] = await scripted(load_cookbook("terminal"), [task], respond, max_retries=2)
    assert ep.termination_reason == "done" and ep.metrics["attempts"] == 1.0, (ep.error, ep.metadata)
    assert ep.trajectories[0].reward == 0.0 and ep.is_correct is False
    assert ep.metadata["eval_error"]["type"] == "SandboxAgentError"
    assert "disk cap is full" in ep.metadata["eval_error"]["message"]


@pytest.mark.slow
def test_two_training_steps_with_tool_calls(train, tmp_path: Path) -> None:
    from rllm.tiny import init_tiny_model

    words = [*task_vocabulary(load_cookbook("terminal")), *re.findall(r"\w+|[^\w\s]", json.dumps(TOOLS))]
    model = init_tiny_model(tmp_path / "tiny-tools", vocab_words=words, tool_calls=True, max_positions=4096)
    rows = train(
        "terminal", tmp_path / "run", f"backend.options.model={model}", "backend.options.learning_rate=0.0005"
    )
    assert all(row["episodes"] == 4 for row in rows)


@pytest.mark.slow
def test_two_asynchronous_training_steps_in_sandboxes(train, tmp_path: Path) -> None:
    """rollout.max_staleness = 1: sandboxed rollouts keep running (each in its own sandbox) while
    the backend trains and syncs; the run trains every step within the bound."""
    from rllm.tiny import init_tiny_model

    words = [*task_vocabulary(load_cookbook("terminal")), *re.findall(r"\w+|[^\w\s]", json.dumps(TOOLS))]
    model = init_tiny_model(tmp_path / "tiny-tools", vocab_words=words, tool_calls=True, max_positions=4096)
    rows = train(
        "terminal",
        tmp_path / "run",
        f"backend.options.model={model}",
        "backend.options.learning_rate=0.0005",
        "rollout.max_staleness=1",
    )
    assert all(row["episodes"] == 4 and row["async/staleness_max"] <= 1 for row in rows)
    # A sandbox that failed to start, or was lost at a sync, ends its rollout as an infra error.
    assert all(row.get("termination/infra_error", 0) == 0 for row in rows), rows
