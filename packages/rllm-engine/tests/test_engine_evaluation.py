"""evaluate(): per-task JSONL, summary with pass@k, and resuming an interrupted run."""

from __future__ import annotations

import json

import openai
import pytest

from rllm.engine.evaluation import AttemptResult, TaskResult, evaluate, load_dataset, read_results, summarize
from rllm.sdk import AgentConfig, Task, evaluator, final_answer, rollout
from rllm.sdk.rewards import math_reward
from rllm.testing import MockUpstream
from rllm.types import SchemaError


def graded_reply(body):
    """Task i answers correctly on attempts r < i: task 0 never, task 3 always (of 3)."""
    task, attempt = body["messages"][-1]["content"].split("|")
    return "\\boxed{4}" if int(attempt) < int(task) else "\\boxed{5}"


@rollout
def sync_solver(task: Task, config: AgentConfig) -> None:
    client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0)
    content = f"{task.metadata['n']}|{config.metadata['rollout_index']}"
    client.chat.completions.create(model=config.model, messages=[{"role": "user", "content": content}])
    client.close()


@evaluator
def math_eval(task: Task, episode):
    return math_reward(final_answer(episode), task.ground_truth)


DATASET = [
    {"id": f"task-{i}", "instruction": "2+2", "ground_truth": "4", "metadata": {"n": i}} for i in range(4)
]


async def test_evaluate_writes_results_summary_and_resumes(tmp_path):
    async with MockUpstream(responder=graded_reply) as upstream:
        summary = await evaluate(
            DATASET, sync_solver, math_eval, upstream.url, attempts=3, output_dir=tmp_path, progress=False
        )
        calls = upstream.stats.by_path["/v1/chat/completions"]
        assert calls == 12
        assert summary.num_tasks == 4 and summary.num_rollouts == 12
        assert summary.accuracy == pytest.approx(0.5)
        assert summary.pass_at_k["pass@1"] == pytest.approx(0.5)
        assert summary.pass_at_k["pass@2"] == pytest.approx(2 / 3)
        assert summary.pass_at_k["pass@3"] == pytest.approx(0.75)
        assert summary.mean_reward == pytest.approx(0.5)
        assert summary.tokens["completion"] == 12 * len("\\boxed{4}")
        assert summary.termination == {"done": 12}
        assert summary.latency_s["max"] > 0

        rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
        by_id = {r["task_id"]: r for r in rows}
        assert {tid: r["num_correct"] for tid, r in by_id.items()} == {f"task-{i}": i for i in range(4)}
        assert [a["rollout_index"] for a in by_id["task-2"]["attempts"]] == [0, 1, 2]
        assert by_id["task-2"]["attempts"][0]["answer"] == "\\boxed{4}"
        assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 12
        assert json.loads((tmp_path / "summary.json").read_text())["pass_at_k"]["pass@3"] == 0.75

        # Simulate a run killed mid-write: drop task-3's line, leave a torn one behind.
        lines = (tmp_path / "results.jsonl").read_text().splitlines(keepends=True)
        kept = [ln for ln in lines if '"task-3"' not in ln]
        (tmp_path / "results.jsonl").write_text("".join(kept) + '{"task_id": "task-3", "att')
        again = await evaluate(
            DATASET,
            sync_solver,
            math_eval,
            upstream.url,
            attempts=3,
            output_dir=tmp_path,
            progress=False,
            resume=True,
        )
        assert upstream.stats.by_path["/v1/chat/completions"] == calls + 3  # only task-3 re-ran
        assert again.resumed_tasks == 3
        assert again.pass_at_k == summary.pass_at_k and again.num_rollouts == 12
        assert len(read_results(tmp_path / "results.jsonl")) == 4


async def test_evaluate_records_failures_as_incorrect(tmp_path):
    @rollout
    async def crashes(task: Task, config: AgentConfig) -> None:
        raise RuntimeError("agent bug")

    async with MockUpstream() as upstream:
        summary = await evaluate(
            DATASET[:2], crashes, math_eval, upstream.url, attempts=2, output_dir=tmp_path, progress=False
        )
    assert summary.accuracy == 0.0 and summary.termination == {"agent_error": 4}
    row = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[0])
    assert row["attempts"][0]["error"] == "RuntimeError: agent bug"


def test_load_dataset_validates_rows(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"id": "a", "instruction": "x"}\n{"id": "a", "instruction": "y"}\n')
    with pytest.raises(SchemaError, match="duplicate task id 'a'"):
        load_dataset(path)
    path.write_text('{"id": "a", "instruction": "x"}\n{"instruction": "y"}\n')
    with pytest.raises(SchemaError, match=r"task #1.*id"):
        load_dataset(path)
    path.write_text('{"id": "a", "instruction": "x"}\nnot json\n')
    with pytest.raises(SchemaError, match=r"data\.jsonl:2"):
        load_dataset(path)


async def test_evaluate_needs_exactly_one_endpoint(tmp_path):
    with pytest.raises(ValueError, match="exactly one"):
        await evaluate(DATASET, sync_solver, math_eval, output_dir=tmp_path)


def test_summary_averages_each_signal_over_the_attempts_that_report_it():
    def attempt(i: int, signals: dict[str, float]) -> AttemptResult:
        return AttemptResult(
            rollout_index=i, reward=0.0, is_correct=False, termination_reason="done", signals=signals
        )

    rows = [
        TaskResult(
            "a", [attempt(0, {"v1/winner_correct": 1.0, "calls": 6.0}), attempt(1, {"calls": 4.0})], 0, 0.0
        ),
        TaskResult("b", [attempt(0, {"v1/winner_correct": 0.0})], 0, 0.0),
    ]
    assert summarize(rows, attempts=2).signals == {"calls": 5.0, "v1/winner_correct": 0.5}
