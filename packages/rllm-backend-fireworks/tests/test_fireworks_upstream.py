"""The adapter's translation of Fireworks' ``raw_output`` answers into vLLM's capture fields,
checked as properties over generated answers (hypothesis)."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm.backends.fireworks.upstream import to_vllm_fields
from rllm.gateway.capture import capture_response

ids = st.lists(st.integers(0, 200_000), max_size=8)
logprob = st.floats(-50.0, 0.0, allow_nan=False)
entry = st.fixed_dictionaries(
    {"token": st.just("t"), "logprob": logprob, "sampling_logprob": st.none() | logprob}
)


@st.composite
def answers(draw: st.DrawFn) -> tuple[dict, list[int], list[int] | None]:
    completion = draw(ids)
    prompt = draw(st.none() | ids)
    raw: dict = {"completion_token_ids": completion}
    if prompt is not None:
        raw["prompt_token_ids"] = prompt
    entries = draw(st.lists(entry, min_size=len(completion), max_size=len(completion)))
    choice = {"index": 0, "text": "x", "raw_output": raw, "logprobs": {"content": entries}}
    return {"choices": [choice]}, completion, prompt


# A busy shared machine must not fail the test by being slow to generate inputs.
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers(), st.booleans(), st.booleans())
def test_ids_and_sampling_logprobs_land_where_the_gateway_reads_them(
    drawn: tuple[dict, list[int], list[int] | None], chat: bool, keep_raw: bool
) -> None:
    answer, completion, prompt = drawn
    original = copy.deepcopy(answer)
    out = to_vllm_fields(answer, chat=chat, keep_raw=keep_raw)
    choice = out["choices"][0]
    assert ("raw_output" in choice) == keep_raw
    captured = capture_response(out, chat=chat)
    assert (captured.completion_ids or []) == completion
    assert (captured.prompt_ids or None) == (prompt or None)
    entries = original["choices"][0]["logprobs"]["content"]
    expected = [e["sampling_logprob"] if e["sampling_logprob"] is not None else e["logprob"] for e in entries]
    assert (captured.completion_logprobs or []) == expected


def test_an_answer_without_raw_output_is_left_as_it_is() -> None:
    answer = {"choices": [{"index": 0, "text": "hi", "logprobs": None}]}
    assert to_vllm_fields(copy.deepcopy(answer), chat=False, keep_raw=False) == answer
