"""Command harnesses (rllm.sdk.command_flow) through the real engine and gateway: real processes
(a Python script with the openai client, bash with curl), their calls captured, their failures
classified and their process trees killed."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.sdk import CommandFlow, Task, command_flow, evaluator, final_answer
from rllm.types import TerminationReason
from rllm.types.errors import UsageError

PY_HARNESS = """
import sys
from openai import OpenAI

client = OpenAI(max_retries=0)  # OPENAI_BASE_URL / OPENAI_API_KEY come from the engine
reply = client.chat.completions.create(
    model=__import__("os").environ["OPENAI_MODEL"], messages=[{"role": "user", "content": sys.argv[1]}]
)
print(reply.choices[0].message.content)
"""

# A curl harness: the request body built with printf, the answer written to a file.
CURL_HARNESS = r"""
set -euo pipefail
body=$(printf '{"model": "%s", "messages": [{"role": "user", "content": "%s"}]}' "$OPENAI_MODEL" "$1")
curl -sSf "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" \
  -H 'Content-Type: application/json' -d "$body" > "$RLLM_WORKDIR/reply.json"
python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])' \
  "$RLLM_WORKDIR/reply.json" > "$RLLM_WORKDIR/answer.txt"
"""


@evaluator
def contains_four(task: Task, episode) -> bool:
    return "4" in final_answer(episode)


def tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", instruction=f"What is 2+2? #{i}", ground_truth="4") for i in range(n)]


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie runs nothing; only its parent's wait removes it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def pids_in(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


async def test_python_openai_harness_calls_are_captured_token_true(gateway, tmp_path):
    script = tmp_path / "harness.py"
    script.write_text(PY_HARNESS)
    flow = command_flow([sys.executable, str(script), "{instruction}"], timeout_s=60)
    config = RolloutConfig(n=2, concurrency=4, progress=False)
    async with RolloutEngine(flow, contains_four, config, gateway_url=gateway.url) as engine:
        episodes = await engine.run(tasks(2))
    assert len(episodes) == 4
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        tag = ep.task_id[1:]
        assert ep.artifacts["answer"] == f"The answer is 4. [{tag}]"
        assert ep.is_correct
        [trajectory] = ep.trajectories
        [step] = trajectory.steps
        # The mock sampler's token ids are the UTF-8 bytes of its text: the ids are the sampler's.
        assert bytes(list(step.completion_ids)).decode() == f"The answer is 4. [{tag}]"
        assert step.completion_logprobs is not None and len(step.completion_logprobs) == len(
            step.completion_ids
        )
        command = ep.metadata["command"]
        assert command["exit_code"] == 0 and command["duration_s"] > 0
        assert command["argv"][2] == f"What is 2+2? #{tag}"  # the placeholder, one argv element
        assert ep.metrics["command_s"] == command["duration_s"]


async def test_bash_curl_harness_with_answer_file(gateway):
    flow = command_flow(
        ["bash", "-c", CURL_HARNESS, "harness", "{instruction}"],
        answer_from="file:answer.txt",
        timeout_s=60,
    )
    config = RolloutConfig(n=2, concurrency=4, progress=False)
    async with RolloutEngine(flow, contains_four, config, gateway_url=gateway.url) as engine:
        episodes = await engine.run(tasks(2))
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, (ep.error, ep.metadata)
        assert ep.artifacts["answer"] == f"The answer is 4. [{ep.task_id[1:]}]"
        [step] = ep.trajectories[0].steps
        assert bytes(list(step.completion_ids)).decode() == ep.artifacts["answer"]


async def test_exit_status_1_is_agent_error_with_its_stderr(gateway):
    flow = command_flow(["bash", "-c", "echo partial; echo 'no model today' >&2; exit 1"])
    config = RolloutConfig(n=1, progress=False)
    async with RolloutEngine(flow, contains_four, config, gateway_url=gateway.url) as engine:
        [ep] = await engine.run(tasks(1))
    assert ep.termination_reason == TerminationReason.AGENT_ERROR
    assert ep.error is not None and "exited with status 1: no model today" in ep.error.message
    assert ep.metadata["command"]["exit_code"] == 1
    assert ep.metadata["command"]["stdout_tail"] == "partial\n"
    assert ep.metadata["command"]["stderr_tail"] == "no model today\n"
    assert ep.metrics["attempts"] == 1.0  # the agent's fault: never retried


async def test_hang_past_timeout_is_timeout_and_the_tree_is_killed(gateway, tmp_path):
    pids = tmp_path / "pids"
    script = 'sleep 1000 & echo $! >> "$PIDS"; echo $$ >> "$PIDS"; exec sleep 1000'
    flow = command_flow(["bash", "-c", script], env={"PIDS": str(pids)}, timeout_s=3)
    config = RolloutConfig(n=1, progress=False)
    async with RolloutEngine(flow, contains_four, config, gateway_url=gateway.url) as engine:
        [ep] = await engine.run(tasks(1))
    assert ep.termination_reason == TerminationReason.TIMEOUT
    assert ep.error is not None and "ran past its 3 s timeout" in ep.error.message
    assert ep.metadata["command"]["exit_code"] == -9
    assert len(pids_in(pids)) == 2
    assert not [p for p in pids_in(pids) if running(p)]


async def test_children_outliving_the_harness_are_killed(gateway, tmp_path):
    # A background child in its process group, one that left it (setsid) and a double fork: the
    # harness exits 0 at once while all three still run and hold its stdout open.
    pids = tmp_path / "pids"
    script = (
        'sleep 1000 & echo $! >> "$PIDS"; '
        'setsid sleep 1000 & echo $! >> "$PIDS"; '
        '( ( sleep 1000 & echo $! >> "$PIDS" ) & ); '
        'while [ "$(wc -l < "$PIDS")" -lt 3 ]; do :; done; echo finished'
    )
    flow = command_flow(["bash", "-c", script], env={"PIDS": str(pids)}, timeout_s=60)
    config = RolloutConfig(n=1, progress=False)
    async with RolloutEngine(flow, contains_four, config, gateway_url=gateway.url) as engine:
        [ep] = await engine.run(tasks(1))
    assert ep.termination_reason == TerminationReason.DONE, ep.error
    assert ep.artifacts["answer"] == "finished"
    assert ep.metadata["command"]["killed_leftovers"] >= 3
    assert len(pids_in(pids)) == 3
    assert not [p for p in pids_in(pids) if running(p)]


async def test_engine_deadline_cancels_the_command_and_kills_it(gateway, tmp_path):
    pids = tmp_path / "pids"
    flow = command_flow(["bash", "-c", 'echo $$ >> "$PIDS"; exec sleep 1000'], env={"PIDS": str(pids)})
    config = RolloutConfig(n=1, progress=False, deadline_s=2)
    async with RolloutEngine(flow, contains_four, config, gateway_url=gateway.url) as engine:
        [ep] = await engine.run(tasks(1))
    assert ep.termination_reason == TerminationReason.TIMEOUT
    assert pids_in(pids) and not [p for p in pids_in(pids) if running(p)]


async def test_missing_program_and_missing_answer_file_are_agent_errors(gateway, tmp_path):
    config = RolloutConfig(n=1, progress=False)
    missing = command_flow([str(tmp_path / "no-such-harness")])
    async with RolloutEngine(missing, contains_four, config, gateway_url=gateway.url) as engine:
        [ep] = await engine.run(tasks(1))
    assert ep.termination_reason == TerminationReason.AGENT_ERROR
    assert ep.error is not None and "cannot be started" in ep.error.message
    no_file = command_flow(["true"], answer_from="file:{workdir}/answer.txt")
    async with RolloutEngine(no_file, contains_four, config, gateway_url=gateway.url) as engine:
        [ep] = await engine.run(tasks(1))
    assert ep.termination_reason == TerminationReason.AGENT_ERROR
    assert ep.error is not None and "wrote no answer file" in ep.error.message


def test_command_flow_pickles_by_its_arguments_and_refuses_bad_ones():
    flow = command_flow(["agent", "{instruction}"], env={"A": "1"}, timeout_s=5, answer_from="file:out")
    again = pickle.loads(pickle.dumps(flow))
    assert isinstance(again, CommandFlow) and again.is_async
    assert (again.argv, again.env, again.timeout_s, again.answer_from) == (
        ["agent", "{instruction}"],
        {"A": "1"},
        5,
        "file:out",
    )
    with pytest.raises(UsageError, match="argv"):
        command_flow([])
    with pytest.raises(UsageError, match="answer_from"):
        command_flow(["x"], answer_from="stderr")
    with pytest.raises(UsageError, match="timeout_s"):
        command_flow(["x"], timeout_s=0)


TASK_ECHO = """
import json, os, sys
from_file = json.load(open(os.environ["RLLM_TASK_FILE"]))
from_env = json.loads(os.environ["RLLM_TASK"]) if "RLLM_TASK" in os.environ else None
print(json.dumps({"file_id": from_file["id"], "env": from_env is not None, "n": len(from_file["instruction"]),
                  "same": from_env in (None, from_file), "cwd_is_workdir": os.getcwd() == os.environ["RLLM_WORKDIR"]}))
"""


async def test_the_task_reaches_the_process_in_a_file_and_when_small_in_the_environment(gateway, tmp_path):
    import json

    script = tmp_path / "echo_task.py"
    script.write_text(TASK_ECHO)
    flow = command_flow([sys.executable, str(script)], timeout_s=60)
    config = RolloutConfig(n=1, progress=False)
    big = Task(id="big", instruction="x" * 300_000)  # over Linux's 128 KiB for one variable
    async with RolloutEngine(flow, None, config, gateway_url=gateway.url) as engine:
        small_ep, big_ep = await engine.run([tasks(1)[0], big])
    for ep, in_env, n in ((small_ep, True, len("What is 2+2? #0")), (big_ep, False, 300_000)):
        assert ep.termination_reason == TerminationReason.DONE, (ep.error, ep.metadata)
        seen = json.loads(ep.artifacts["answer"])
        assert seen == {"file_id": ep.task_id, "env": in_env, "n": n, "same": True, "cwd_is_workdir": True}
