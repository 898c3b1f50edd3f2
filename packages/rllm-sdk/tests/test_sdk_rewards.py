"""Reward helpers: boxed extraction, matching, math-verify grading, and the LLM judge against a
real loopback OpenAI-compatible server."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.sdk.rewards import (
    exact_match,
    extract_boxed,
    normalize_text,
    normalized_match,
    numeric_match,
    parse_number,
)
from rllm.types import Episode, Message, Step, Task, Trajectory

HAS_MATH_VERIFY = importlib.util.find_spec("math_verify") is not None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("$\\boxed 7$", "7"),
        ("\\fbox{x+1}", "x+1"),
        ("no box here", None),
        ("\\boxed{unterminated", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_exact_and_normalised_match():
    assert exact_match(" Paris\n", "Paris") and not exact_match("paris", "Paris")
    assert normalize_text("The  Café, Paris!") == "cafe paris"
    assert normalized_match("the eiffel tower", ["Big Ben", "Eiffel Tower."])
    assert not normalized_match("tower", "Eiffel Tower")


def test_numeric_match_with_tolerance():
    assert parse_number("The total is 1,234.5 dollars") == 1234.5
    assert parse_number("about 45%") == pytest.approx(0.45)
    assert parse_number("no digits") is None
    assert numeric_match("answer: 3.14159", "3.1416", rel_tol=1e-4)
    assert not numeric_match("answer: 3.14", "3.1416", rel_tol=1e-4)
    assert numeric_match("x = -2e3", -2000)
    assert not numeric_match("none", "1")
    with pytest.raises(ValueError, match="tolerances"):
        numeric_match("1", "1", rel_tol=-1)


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify not installed (rllm-sdk[math])")
@pytest.mark.parametrize(
    ("response", "truth", "ok"),
    [
        ("The answer is \\boxed{\\frac{1}{2}}", "0.5", True),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
        ("Thus $x = 1/2$.", "\\frac12", True),
        ("\\boxed{3}", "4", False),
        ("I don't know", "4", False),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
    ],
)
def test_grade_math_symbolic_equivalence(response, truth, ok):
    from rllm.sdk.rewards import grade_math

    assert grade_math(response, truth) is ok


@pytest.mark.parametrize(
    ("response", "truth", "ok"),
    [
        ("47 + 25 = 72", "72", True),
        ("The answer is \\boxed{72}.", "72", True),
        ("\\boxed{1{,}234}", "1234", True),
        ("\\boxed{72\\text{ apples}}", "72", True),
        ("\\boxed{$-3.5$}", "-3.5", True),
        ("\\boxed{\\$72}", "72", True),
        ("\\boxed{30^{\\circ}}", "30", True),
        ("Thus $x = 1/2$.", "0.5", True),
        # The question restated is no answer (SmolLM2 learned these within 10 steps when
        # math-verify evaluated them to the truth).
        ("88 + 28<|im_end|>", "116", False),
        ("79 + 57 = \\boxed{79 + 57}", "136", False),
        ("What does 11 + 39 enter?", "50", False),
        ("\\boxed{84/2}", "42", False),  # a fraction equal to an integer is the sum left undone
        ("x = 1/0", "5", False),
    ],
)
def test_a_numeric_truth_is_graded_by_the_final_number_only(response, truth, ok):
    from rllm.sdk.rewards import grade_math

    assert grade_math(response, truth) is ok


@settings(max_examples=200, deadline=None)
@given(
    a=st.integers(0, 10**6),
    b=st.integers(0, 10**6),
    op=st.sampled_from(["+", "-", "*", "\\times", "/"]),
    boxed=st.booleans(),
)
def test_restating_the_question_never_scores_and_its_value_does(a: int, b: int, op: str, boxed: bool) -> None:
    """Property: for any two-number question, the expression itself (bare or boxed) is graded
    wrong unless it happens to be the truth's own literal, and the computed value is graded right."""
    from rllm.sdk.rewards import grade_math

    values = {"+": a + b, "-": a - b, "*": a * b, "\\times": a * b, "/": a / b if b else None}
    truth = values[op]
    if truth is None or (op == "/" and truth != int(truth)):
        return  # no integer truth to grade against
    truth = int(truth)
    expression = f"{a} {op} {b}"
    wrap = (lambda text: f"\\boxed{{{text}}}") if boxed else (lambda text: text)
    assert not grade_math(wrap(expression), truth) or (str(b) == str(truth) and not boxed)
    assert grade_math(f"{expression} = {wrap(str(truth))}", truth)


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify not installed (rllm-sdk[math])")
def test_math_reward_works_off_the_main_thread_and_reports_format():
    from concurrent.futures import ThreadPoolExecutor

    from rllm.sdk.rewards import math_reward

    with ThreadPoolExecutor(1) as pool:  # engines run sync evaluators in threads (no signal.alarm)
        out = pool.submit(math_reward, "so \\boxed{10}", 10).result()
    assert out.reward == 1.0 and out.is_correct is True
    assert out.signals[0].name == "has_boxed" and out.signals[0].value == 1.0


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify not installed (rllm-sdk[math])")
@pytest.mark.parametrize(
    ("response", "reward", "correct"),
    [
        ("so \\boxed{10}", 1.0, True),
        ("so 10", 0.9, True),
        ("so \\boxed{11}", 0.0, False),
        ("so 11", -0.1, False),
        # The prompt's empty box echoed is no boxed answer (SmolLM2 learned that dodge in 5 steps).
        ("10 + 0 = \\boxed{} = 10", 0.9, True),
        ("so \\boxed{ }", -0.1, False),
    ],
)
def test_math_reward_format_coef_takes_off_an_unboxed_reply_s_reward_not_its_grade(response, reward, correct):
    from rllm.sdk.rewards import math_reward

    assert math_reward(response, 10).reward == (1.0 if correct else 0.0)  # off by default
    out = math_reward(response, 10, format_coef=0.1)
    assert out.reward == pytest.approx(reward) and out.is_correct is correct


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify not installed (rllm-sdk[math])")
@pytest.mark.parametrize("coef", [-0.1, 1.5, float("nan")])
def test_math_reward_refuses_a_format_coef_outside_0_to_1(coef):
    from rllm.sdk.rewards import math_reward
    from rllm.types.errors import InputError

    with pytest.raises(InputError, match="format_coef must be between 0 and 1"):
        math_reward("\\boxed{1}", 1, format_coef=coef)


def test_parse_verdict():
    from rllm.sdk.rewards import parse_verdict
    from rllm.sdk.rewards.judge import JudgeParseError

    assert parse_verdict("fine\nVERDICT: CORRECT") == (1.0, True)
    assert parse_verdict("VERDICT: CORRECT ... on reflection VERDICT: incorrect") == (0.0, False)
    assert parse_verdict("SCORE: 0.75") == (0.75, True)
    with pytest.raises(JudgeParseError, match="no 'VERDICT"):
        parse_verdict("looks good to me")
    with pytest.raises(JudgeParseError, match="outside"):
        parse_verdict("SCORE: 7")


async def test_llm_judge_calls_a_real_openai_compatible_server():
    pytest.importorskip("openai")
    MockUpstream = pytest.importorskip("rllm.testing").MockUpstream  # a real loopback server
    from rllm.sdk.rewards import LLMJudge

    seen: list[str] = []

    def responder(body):
        prompt = body["messages"][-1]["content"]
        seen.append(prompt)
        return (
            "Matches.\nVERDICT: CORRECT"
            if "Paris" in prompt.split("Answer to grade:")[1]
            else "VERDICT: INCORRECT"
        )

    async with MockUpstream(responder=responder) as server:
        judge = LLMJudge(base_url=server.url, model="mock-model")
        task = Task(id="q", instruction="Capital of France?", ground_truth="Paris")

        def episode(answer: str) -> Episode:
            step = Step(output=Message(role="assistant", content=answer))
            return Episode(task_id="q", trajectories=[Trajectory(steps=[step])])

        good = await judge.evaluate(task, episode("It is Paris."))
        bad = await judge.evaluate(task, episode("It is Lyon."))
        await judge.aclose()
    assert (good.reward, good.is_correct) == (1.0, True)
    assert (bad.reward, bad.is_correct) == (0.0, False)
    assert "Capital of France?" in seen[0] and "Reference answer:\nParis" in seen[0]
    assert good.metadata["judge_reply"].endswith("VERDICT: CORRECT")


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify not installed (rllm-sdk[math])")
def test_grading_in_a_thread_does_not_warn_about_its_disabled_timeout(caplog) -> None:
    """Engines grade in worker threads, where the timeout is off on purpose: math-verify's
    "Timeout is disabled" warning (one per call) must not flood the output; other warnings pass."""
    import logging
    from concurrent.futures import ThreadPoolExecutor

    from rllm.sdk.rewards import grade_math

    caplog.set_level(logging.WARNING)
    # The logger's own level too: a test before this one may have run a command that quiets it.
    caplog.set_level(logging.WARNING, logger="math_verify.parser")
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(grade_math, "so \\boxed{\\frac{1}{2}}", "0.5").result()
    assert not [r for r in caplog.records if "Timeout is disabled" in r.getMessage()]
    logging.getLogger("math_verify.parser").warning("something else")
    assert [r for r in caplog.records if r.getMessage() == "something else"]
