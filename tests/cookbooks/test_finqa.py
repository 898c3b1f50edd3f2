from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rllm_cookbook_finqa import FinanceDB, answer_matches, generate, load_tasks
from rllm_cookbook_finqa.calculator import CalculatorError, calculate

from rllm.engine.plugins import load_cookbook
from rllm.engine.training.launch import task_vocabulary
from rllm.testing import MockReply

TABLES = {"t": {"columns": ["item", "fy2021", "fy2022"], "rows": [["revenue", 100, 125]]}}


def test_shipped_sample_is_the_generators_output():
    for split in ("train", "test"):
        assert [(t.instruction, t.ground_truth) for t in load_tasks(split)] == [
            (r["question"], r["answer"]) for r in generate(split)
        ]


@given(
    st.lists(st.integers(-1000, 1000), min_size=1, max_size=5), st.lists(st.sampled_from("+-*"), max_size=4)
)
def test_calculator_agrees_with_integer_arithmetic(numbers, ops):
    expr, expected = str(numbers[0]), numbers[0]
    for op, n in zip(ops, numbers[1:], strict=False):
        expr = f"({expr}) {op} ({n})"
        expected = {"+": expected + n, "-": expected - n, "*": expected * n}[op]
    assert calculate(expr) == expected


@pytest.mark.parametrize("bad", ["__import__('os')", "(1).real", "x + 1", "2 ** 10000", "1 / 0", "[1]", ""])
def test_calculator_refuses_what_is_not_arithmetic(bad):
    with pytest.raises(CalculatorError):
        calculate(bad)


def test_sql_is_read_only_and_records_tables():
    db = FinanceDB(TABLES)
    assert json.loads(db.list_tables()) == ["t"]
    assert json.loads(db.sql_query("SELECT fy2022 FROM t WHERE item = 'revenue'")) == [[125]]
    for write in [
        "INSERT INTO t VALUES ('x', 1, 2)",
        "DROP TABLE t",
        "PRAGMA query_only = 0",
        "ATTACH ':memory:' AS x",
    ]:
        assert db.sql_query(write).startswith("error: not authorized"), write
    assert json.loads(db.sql_query("SELECT count(*) FROM t")) == [[1]]
    assert db.accessed == ["t"]
    assert "no table" in db.get_table_schema("nope")
    assert db.call("calculator", '{"expression": "(125 - 100) / 100 * 100"}') == "25.0"
    assert db.call("nope", "{}").startswith("error: no tool") and db.call("sql_query", "{").startswith(
        "error"
    )
    db.close()


def test_a_runaway_query_is_interrupted():
    db = FinanceDB(TABLES, time_limit_s=0.05)
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    assert db.sql_query(endless) == "error: query took longer than the time limit"
    assert json.loads(db.sql_query("SELECT 1")) == [[1]]  # the connection still works
    db.close()


def test_each_rollout_has_its_own_database():
    a, b = FinanceDB(TABLES), FinanceDB({"u": {"columns": ["a"], "rows": [[1]]}})
    assert json.loads(a.list_tables()) == ["t"] and json.loads(b.list_tables()) == ["u"]
    a.close(), b.close()


@pytest.mark.parametrize(
    ("answer", "truth", "ok"),
    [
        ("25.0", 25.0, True),
        ("25%", 25.0, True),
        ("$1,250", 1250.0, True),
        ("25.1", 25.0, True),
        ("30", 25.0, False),
        (None, 1.0, False),
    ],
)
def test_numeric_tolerance(answer, truth, ok):
    assert answer_matches(answer, truth) is ok


def _call(name: str, **args) -> MockReply:
    return MockReply(
        tool_calls=[
            {
                "id": f"call_{name}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ]
    )


async def test_react_loop_with_native_tool_calls(scripted):
    tasks = load_tasks("test")[:3]
    right, wrong, endless = tasks
    by_question = {t.instruction: t for t in tasks}

    def respond(body):
        messages = body["messages"]
        task = by_question[messages[1]["content"]]
        assert [t["function"]["name"] for t in body["tools"]] == [
            "list_tables",
            "get_table_schema",
            "sql_query",
            "calculator",
        ]
        tool_results = [m["content"] for m in messages if m["role"] == "tool"]
        if task is endless:
            return _call("list_tables")
        if task is wrong:
            return "FINAL ANSWER: 123456" if tool_results else _call("list_tables")
        table = task.metadata["table"]
        if len(tool_results) == 0:
            return _call("list_tables")
        if len(tool_results) == 1:
            assert table in json.loads(tool_results[0])
            return _call("sql_query", query=f"SELECT * FROM {table}")
        if len(tool_results) == 2:
            return _call("calculator", expression=str(task.ground_truth))
        return f"FINAL ANSWER: {tool_results[2]}"

    episodes = await scripted(load_cookbook("finqa"), tasks, respond)
    by_id = {e.task_id: e for e in episodes}
    ok, bad, limit = by_id[right.id], by_id[wrong.id], by_id[endless.id]
    assert ok.trajectories[0].reward == 1.0 and ok.is_correct
    assert ok.artifacts["turns"] == 4 and ok.artifacts["accessed_tables"] == [right.metadata["table"]]
    assert float(ok.artifacts["answer"]) == pytest.approx(right.ground_truth)
    assert bad.trajectories[0].reward == 0.0 and bad.artifacts["answer"] == "123456"
    assert bad.artifacts["turns"] == 2 and bad.artifacts["accessed_tables"] == []
    assert limit.termination_reason == "max_turns" and limit.artifacts["turns"] == 20
    assert limit.artifacts["answer"] is None and limit.trajectories[0].reward == 0.0
    assert ok.trajectories[0].steps[0].output.tool_calls[0].function.name == "list_tables"


@pytest.mark.slow
def test_two_training_steps_with_tool_calls(train, tmp_path: Path):
    import re

    from rllm_cookbook_finqa import TOOLS

    from rllm.tiny import init_tiny_model

    words = [
        *task_vocabulary(load_cookbook("finqa")),
        *re.findall(r"\w+|[^\w\s]", json.dumps(TOOLS)),
        "FINAL",
        "ANSWER",
    ]
    model = init_tiny_model(tmp_path / "tiny-tools", vocab_words=words, tool_calls=True, max_positions=4096)
    rows = train(
        "finqa",
        tmp_path / "run",
        f"backend.options.model={model}",
        "tasks_per_step=1",
        "rollout.sampling.max_tokens=4",
    )
    # A random model never writes a valid call: every episode runs into the 20-turn limit, and
    # its turns (tool schemas rendered by the template, nudges) are trained on.
    assert all(row["episodes"] == 2 and row["termination/max_turns"] == 1.0 for row in rows)


def test_options_set_the_evaluator_and_unknown_ones_are_refused(monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test")
    base = load_cookbook("finqa")
    assert base.with_options({}) is base
    bonus = base.with_options({"table_bonus": 0.5})
    assert bonus.evaluator.table_bonus == 0.5 and bonus.evaluator.judge is None
    assert base.evaluator.table_bonus == 0.0  # the installed cookbook is left as it was
    judged = base.with_options(
        {
            "judge_base_url": "http://127.0.0.1:9/v1",
            "judge_model": "judge",
            "judge_api_key_env": "MY_JUDGE_KEY",
        }
    )
    assert type(judged.evaluator.judge).__name__ == "LLMJudge"
    with pytest.raises(ValueError, match="judge_temperature"):
        base.with_options({"judge_temperature": 0})
    with pytest.raises(ValueError, match="table_bonus must be a number"):
        base.with_options({"table_bonus": "lots"})
    with pytest.raises(ValueError, match="both judge_base_url and judge_model"):
        base.with_options({"judge_model": "judge"})
