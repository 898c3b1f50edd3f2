from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rllm_cookbook_countdown import check, generate, load_tasks
from rllm_cookbook_countdown.equation import evaluate

from rllm.engine.plugins import load_cookbook


def test_shipped_sample_is_the_generators_output_and_solvable():
    for split in ("train", "test"):
        tasks = load_tasks(split)
        assert [(t.metadata["numbers"], t.ground_truth) for t in tasks] == [
            (r["numbers"], r["target"]) for r in generate(split)
        ]


@pytest.mark.parametrize(
    ("reply", "ok", "why"),
    [
        ("<answer>(4 + 9) + 20</answer>", True, "ok"),
        ("<answer>20 + 9 + 4 = 33</answer>", True, "ok"),
        ("<answer>20 + 9 + 4 + 0</answer>", False, "uses numbers"),
        ("<answer>20 + 20 - 7</answer>", False, "uses numbers"),
        ("<answer>20 * 9 / 4</answer>", False, "equals"),
        ("<answer>__import__('os')</answer>", False, "only integers"),
        ("<answer>33.0</answer>", False, "only integers"),
        ("33", False, "no <answer>"),
    ],
)
def test_equation_check_is_exact(reply, ok, why):
    correct, reason = check(reply, [4, 9, 20], 33)
    assert correct is ok and why in reason


@given(st.lists(st.integers(1, 30), min_size=2, max_size=4), st.sampled_from("+-*"))
def test_any_expression_over_the_numbers_checks_against_its_own_value(numbers, op):
    expression = f" {op} ".join(map(str, numbers))
    value, used = evaluate(expression)
    assert used == numbers
    assert check(f"<answer>{expression}</answer>", numbers, int(value))[0]


async def test_flow_and_evaluator_against_a_scripted_model(scripted):
    tasks = load_tasks("test")[:4]
    solutions = {}
    for row in generate("test")[:4]:
        solutions[str(row["target"])] = row
    wrong = tasks[2].instruction

    def respond(body):
        prompt = body["messages"][0]["content"]
        if prompt == wrong:
            return "<answer>1 + 1</answer>"
        task = next(t for t in tasks if t.instruction == prompt)
        n = task.metadata["numbers"]
        # brute force over pairs/triples with + - *: the generator's tasks are solvable this way
        return f"<answer>{_solve(n, task.metadata['target'])}</answer>"

    episodes = await scripted(load_cookbook("countdown"), tasks, respond)
    rewards = {e.task_id: e.trajectories[0].reward for e in episodes}
    assert rewards == {t.id: (0.0 if t.instruction == wrong else 1.0) for t in tasks}


def _solve(numbers: list[int], target: int) -> str:
    import itertools

    for k in range(2, len(numbers) + 1):
        for perm in itertools.permutations(numbers, k):
            for ops in itertools.product("+-*", repeat=k - 1):
                expr = str(perm[0])
                for op, n in zip(ops, perm[1:], strict=True):
                    expr = f"({expr} {op} {n})"
                if evaluate(expr)[0] == target:
                    return expr
    raise AssertionError(f"unsolvable {numbers} -> {target}")


@pytest.mark.slow
def test_two_training_steps(train, tmp_path):
    rows = train("countdown", tmp_path)
    assert all(row["episodes"] == 4 for row in rows)
