"""The DeepCoder cookbook: its sample, the hidden tests in a real sandbox, a scripted model that
solves some problems and fails others (wrong answer, crash, reaching the network, no code), and
2 training steps."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from rllm_cookbook_deepcoder import SANDBOX, extract_code, generate, load_tasks, run_hidden_tests, stdin_tests

from rllm.engine.plugins import load_cookbook
from rllm.engine.sandbox import BubblewrapBackend

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed: apt-get install bubblewrap"
)


def test_shipped_sample_is_the_generators_output() -> None:
    for split in ("train", "test"):
        assert [t.metadata["tests"] for t in load_tasks(split)] == [r["tests"] for r in generate(split)]
    with pytest.raises(ValueError, match="hub:<config>"):
        load_tasks("validation")


def test_hub_test_layouts_keep_only_stdin_tests() -> None:
    stdin = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    assert stdin_tests(json.dumps(stdin)) == [{"input": "1\n", "output": "2\n"}]
    assert stdin_tests([{"input": "[1]", "output": "2", "testtype": "functional"}]) == []
    assert stdin_tests({"inputs": ["a\n"], "outputs": ["b\n"]}) == [{"input": "a\n", "output": "b\n"}]
    assert stdin_tests({"inputs": ["1"], "outputs": ["2"], "fn_name": "f"}) == []
    assert extract_code("sketch ```py\nx\n``` final ```python\nprint(1)\n```") == "print(1)\n"


@needs_bwrap
async def test_reference_solutions_pass_their_hidden_tests() -> None:
    backend = BubblewrapBackend()
    for task in load_tasks("test"):
        sandbox = await backend.create(SANDBOX)
        try:
            result = await run_hidden_tests(sandbox, task.metadata["reference"], task.metadata["tests"])
        finally:
            await sandbox.close()
        assert result["all_passed"] and result["passed"] == 4, (task.id, result)


@needs_bwrap
async def test_scripted_model_solves_some_and_fails_others(scripted) -> None:
    connections: list[bytes] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(await reader.read(100))
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    # One task per problem kind: the scripted model knows a task by its statement.
    tasks = list({t.instruction: t for t in reversed(load_tasks("train"))}.values())[:6]
    assert len(tasks) == 6
    bad = {
        tasks[2].instruction: "```python\nprint(0)\n```",  # wrong answer
        tasks[3].instruction: "```python\nraise SystemExit(3)\n```",  # crashes
        tasks[4].instruction: (  # fetches the answer from the network, which the sandbox has not
            f"```python\nimport urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:{port}').read())\n```"
        ),
        tasks[5].instruction: "I cannot solve this.",  # no code
    }
    reference = {t.instruction: t.metadata["reference"] for t in tasks}

    def respond(body):
        problem = body["messages"][-1]["content"]
        return bad.get(problem) or f"Here it is:\n```python\n{reference[problem]}```"

    try:
        episodes = await scripted(load_cookbook("deepcoder"), tasks, respond)
    finally:
        server.close()
        await server.wait_closed()
    rewards = {e.task_id: e.trajectories[0].reward for e in episodes}
    assert rewards == {t.id: (0.0 if t.instruction in bad else 1.0) for t in tasks}
    failures = {e.task_id: e.metadata["eval"]["failure"] for e in episodes}
    assert failures[tasks[2].id] == "test 0: wrong answer"
    assert failures[tasks[3].id].startswith("test 0: exit 3")
    assert "URLError" in failures[tasks[4].id] and connections == []
    assert failures[tasks[5].id] == "no code block"


@needs_bwrap
@pytest.mark.slow
def test_two_training_steps(train, tmp_path: Path) -> None:
    rows = train("deepcoder", tmp_path)
    assert all(row["episodes"] == 4 for row in rows)
