"""The teacher's top-k for dense distillation: vLLM's ``prompt_logprobs: k`` parsed strictly
(rllm.engine.data.distill_topk), the TrainSequence field checked, and the config rule for the loss."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.engine.data.distill_topk import parse_prompt_logprobs
from rllm.engine.training.trainer_config import config_from_dict
from rllm.types import ConfigError, FloatArray, TokenArray, TrainSequence
from rllm.types.errors import InputError
from rllm.types.sequence import TeacherTopK, check_teacher_topk


@st.composite
def teacher_answers(draw: st.DrawFn) -> tuple[list[int], int, list[Any], list[list[tuple[int, float]]]]:
    """A prompt, k, vLLM's JSON ``prompt_logprobs`` for it, and the top-k each position holds."""
    vocab = draw(st.integers(3, 40))
    k = draw(st.integers(1, vocab - 1))
    n = draw(st.integers(1, 6))
    ids = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    scores: list[Any] = [None]
    tops = []
    for position in range(1, n):
        top_ids = draw(st.permutations(range(vocab)))[:k]
        # strictly decreasing logprobs (no ties: the top-k order is then the only one)
        steps = draw(st.lists(st.floats(0.01, 2.0), min_size=k + 1, max_size=k + 1))
        values = [-sum(steps[: j + 1]) for j in range(k + 1)]
        top = list(zip(top_ids, values[:k], strict=True))
        entry = {str(t): {"logprob": v, "rank": r + 1, "decoded_token": "w"} for r, (t, v) in enumerate(top)}
        if str(ids[position]) not in entry:
            entry[str(ids[position])] = {"logprob": values[k], "rank": k + 1, "decoded_token": "w"}
        scores.append(entry)
        tops.append(top)
    return ids, k, json.loads(json.dumps(scores)), tops


@settings(max_examples=60, deadline=None)
@given(teacher_answers())
def test_a_well_formed_answer_parses_to_exactly_its_values(answer: tuple) -> None:
    ids, k, scores, tops = answer
    own, topk = parse_prompt_logprobs(scores, ids, k)
    assert topk is not None and topk.k == k and len(topk.ids) == len(ids) * k
    assert own[0] == 0.0 and list(topk.ids[:k]) == [0] * k  # row 0: nothing predicts token 0
    for position, top in enumerate(tops, start=1):
        assert own[position] == scores[position][str(ids[position])]["logprob"]
        assert list(topk.ids[position * k : (position + 1) * k]) == [t for t, _ in top]
        got = topk.logprobs[position * k : (position + 1) * k]
        assert all(math.isclose(a, v, rel_tol=1e-6) for a, (_, v) in zip(got, top, strict=True))
    # k = 0 (the sampled loss) reads the same answer's own-token logprobs only
    assert parse_prompt_logprobs(scores, ids, 0) == (own, None)


def _corrupt(kind: str, scores: list[Any], ids: list[int], k: int) -> tuple[list[Any] | Any, str]:
    """One malformed variant of a valid answer, and what its error must name."""
    scores = json.loads(json.dumps(scores))
    last = len(scores) - 1
    entry = scores[last]
    if kind == "length":
        return scores[:-1], "positions"
    if kind == "not_a_list":
        return {"0": scores}, "prompt_logprobs"
    if kind == "entry_not_a_dict":
        scores[last] = [entry]
        return scores, f"[{last}]"
    if kind == "own_token_missing":
        del entry[str(ids[last])]
        if not entry:  # the token was the whole top-k: an empty entry, named as such
            return scores, f"[{last}] must be a non-empty"
        return scores, f"[{last}] has no logprob for the prompt's token"
    if kind == "too_few":  # a server that ignores k and returns the token's own logprob only
        scores[last] = {str(ids[last]): entry[str(ids[last])]}
        return scores, f"[{last}] has 1 tokens, expected the top {k}"
    if kind == "logprob_not_a_number":
        entry[str(ids[last])]["logprob"] = "-1.0"
        return scores, f"[{last}]['{ids[last]}'].logprob"
    if kind == "logprob_nan":
        entry[str(ids[last])]["logprob"] = math.nan
        return scores, "finite"
    if kind == "positive_logprob":
        entry[str(ids[last])]["logprob"] = 0.5
        return scores, "above 0"
    if kind == "rank_outside":  # the top-k's own ranks say one of them is not in the top k
        token = max(entry, key=lambda t: entry[t]["logprob"])
        entry[token]["rank"] = k + 5
        return scores, "among the top"
    if kind == "bad_key":
        entry["x" + str(ids[last])] = entry.pop(str(ids[last]))
        return scores, "not a token id"
    raise AssertionError(kind)


KINDS = [
    "length",
    "not_a_list",
    "entry_not_a_dict",
    "own_token_missing",
    "too_few",
    "logprob_not_a_number",
    "logprob_nan",
    "positive_logprob",
    "bad_key",
    "rank_outside",
]


@settings(max_examples=80, deadline=None)
@given(teacher_answers(), st.sampled_from(KINDS))
def test_a_malformed_answer_is_an_error_naming_the_field_never_a_zero(answer: tuple, kind: str) -> None:
    ids, k, scores, _ = answer
    if len(ids) < 2 or (kind == "too_few" and k == 1):
        return  # nothing to corrupt past position 0 / one entry is a valid top-1
    bad, names = _corrupt(kind, scores, ids, k)
    with pytest.raises(InputError) as caught:
        parse_prompt_logprobs(bad, ids, k, where="prompt_logprobs")
    assert "prompt_logprobs" in str(caught.value) and names in str(caught.value)


def _sequence(n: int = 4, k: int = 2, **topk: Any) -> TrainSequence:
    fields = {"k": k, "ids": TokenArray(list(range(n * k))), "logprobs": FloatArray([-1.0] * (n * k)), **topk}
    return TrainSequence(
        input_ids=TokenArray(range(n)),
        loss_mask=FloatArray([0, 0, 1, 1][:n]),
        advantages=FloatArray([0.0] * n),
        sampler_logprobs=FloatArray([0.0] * n),
        teacher_topk=TeacherTopK(**fields),
    )


def test_the_sequence_field_is_checked_against_its_sequence() -> None:
    assert check_teacher_topk(_sequence()).k == 2
    cases = [
        (_sequence(ids=TokenArray([1, 2])), "ids has 2 values for 4 tokens x k=2"),
        (_sequence(ids=TokenArray([5] * 8)), "row 2 repeats a token"),
        (_sequence(logprobs=FloatArray([-0.1] * 8)), "row 2 sums to a probability above 1"),
        (
            _sequence(logprobs=FloatArray([0.0, 0.0, 0.0, 0.0, float("nan"), -1, -1, -1])),
            "row 2 is not finite",
        ),
        (_sequence(k=0, ids=TokenArray(), logprobs=FloatArray()), "k must be >= 1"),
    ]
    for sequence, message in cases:
        with pytest.raises(InputError, match=message):
            check_teacher_topk(sequence, "batch[0]")
    bare = _sequence()
    bare.teacher_topk = None
    with pytest.raises(InputError, match=r"batch\[3\]\.teacher_topk is missing"):
        check_teacher_topk(bare, "batch[3]")


def _config(**distill: Any) -> Any:
    algorithm = distill.pop("algorithm", {})
    return config_from_dict(
        {"cookbook": "say", "algorithm": algorithm, "distill": {"teacher": "http://t/v1", **distill}}
    )


def test_distill_loss_topk_picks_its_loss_and_refuses_what_cannot_work() -> None:
    assert _config().algorithm.loss == "ppo_clip"  # sampled: the policy loss on the teacher's advantages
    assert _config(loss="topk").algorithm.loss == "topk_forward_kl"
    assert _config(loss="topk", kl="reverse").algorithm.loss == "topk_reverse_kl"
    assert _config(loss="topk", algorithm={"loss": "topk_forward_kl"}).algorithm.loss == "topk_forward_kl"
    refusals = [
        ({"loss": "topk", "algorithm": {"loss": "cispo"}}, "algorithm.loss"),
        ({"loss": "topk", "reward_coef": 0.5}, "distill.reward_coef"),
        ({"loss": "topk", "topk": 0}, "distill.topk"),
        ({"algorithm": {"loss": "topk_reverse_kl"}}, "algorithm.loss"),
    ]
    for fields, key in refusals:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            _config(**fields)
    with pytest.raises(ConfigError, match=r"algorithm\.loss.*rllm distill"):
        config_from_dict({"cookbook": "say", "algorithm": {"loss": "topk_forward_kl"}})


@pytest.mark.parametrize("loss", ["sampled", "topk"])
def test_distillation_under_a_staleness_bound_is_refused_naming_the_key(loss: str) -> None:
    """The asynchronous step never asks the teacher: K > 0 would train on the task reward alone."""
    doc = {
        "cookbook": "say",
        "rollout": {"max_staleness": 1},
        "distill": {"teacher": "http://t/v1", "loss": loss},
    }
    with pytest.raises(ConfigError, match=r"rollout\.max_staleness.*distillation runs synchronously"):
        config_from_dict(doc)
