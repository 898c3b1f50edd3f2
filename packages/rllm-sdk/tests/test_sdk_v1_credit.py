"""v1_credit: one reward per call for both roles, no-signal calls marked, report signals."""

from __future__ import annotations

import pytest

from rllm.sdk.v1 import NO_SIGNAL_SUFFIX, pairwise_messages, prompt_key, v1_credit
from rllm.types import Episode, Message, Step, Trajectory

CANDIDATES = ["x = \\boxed{4}", "x = \\boxed{5}", "x = \\boxed{6}"]
CORRECT = [True, False, False]


def step(prompt: list[dict], reply: str) -> Step:
    return Step(input=[Message(**m) for m in prompt], output=Message(role="assistant", content=reply))


def episode() -> Episode:
    gen_prompt = [{"role": "user", "content": "solve"}]
    calls = [(0, 1, "VERDICT: A"), (1, 0, "VERDICT: A"), (1, 2, "VERDICT: TIE"), (2, 0, "no idea")]
    verify_steps, pairs = [], {}
    for first, second, reply in calls:
        messages = pairwise_messages("solve", CANDIDATES[first], CANDIDATES[second])
        pairs[prompt_key(messages)] = [first, second]
        verify_steps.append(step(messages, reply))
    artifacts = {
        "answer": CANDIDATES[0],
        "v1": {
            "candidates": CANDIDATES,
            "winner": 0,
            "majority_winner": 2,
            "verify_calls": 4,
            "unparsed": 1,
            "pairs_by_key": pairs,
        },
    }
    return Episode(
        task_id="t",
        trajectories=[
            Trajectory(role="generate", steps=[step(gen_prompt, c) for c in reversed(CANDIDATES)]),
            Trajectory(role="verify", steps=verify_steps),
        ],
        artifacts=artifacts,
    )


def test_every_call_gets_its_own_reward_and_no_signal_calls_are_marked() -> None:
    ep = episode()
    credit = v1_credit(ep, CORRECT)
    by_name: dict[str, list[float]] = {}
    for t in ep.trajectories:
        assert len(t.steps) == 1 and t.steps[0].done
        by_name.setdefault(t.role, []).append(credit.trajectory_rewards[t.id])
    # Candidates in trace order 6, 5, 4: only the last is correct.
    assert by_name["generate"] == [0.0, 0.0, 1.0]
    # (0 as A) said A: right; (1 as A, 0 as B) said A: wrong; (2, 0) unparsed: wrong; (1, 2): no signal.
    assert by_name["verify"] == [1.0, 0.0, 0.0]
    assert by_name["verify" + NO_SIGNAL_SUFFIX] == [0.0]
    signals = {s.name: s.value for s in credit.signals}
    assert signals["v1/winner_correct"] == 1.0 and signals["v1/majority_correct"] == 0.0
    assert signals["v1/random_correct"] == pytest.approx(1 / 3) and signals["v1/pass_at_n"] == 1.0
    assert signals["v1/verify_mixed_pairs"] == 3.0 and signals["v1/verify_mixed_accuracy"] == pytest.approx(
        1 / 3
    )
    assert signals["v1/unmatched_calls"] == 0.0 and credit.winner_correct


def test_bad_input_is_refused_with_its_reason() -> None:
    with pytest.raises(ValueError, match="artifacts"):
        v1_credit(Episode(task_id="t"), [True])
    with pytest.raises(ValueError, match="3 candidates"):
        v1_credit(episode(), [True])
