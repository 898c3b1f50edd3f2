"""The V1 verification-reply parser: total, and the last explicit verdict wins."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from rllm.sdk.v1 import Verdict, pairwise_messages, parse_verdict

WORDS = {"A": Verdict.A, "B": Verdict.B, "TIE": Verdict.TIE, "both": Verdict.TIE, "Neither": Verdict.TIE}


@given(st.text())
def test_any_text_parses_to_a_verdict_or_none(text: str) -> None:
    assert parse_verdict(text) in (Verdict.A, Verdict.B, Verdict.TIE, None)


@given(
    prefix=st.text(),
    word=st.sampled_from(sorted(WORDS)),
    decoration=st.sampled_from(["{}", "**{}**", "`{}`", "{}.", " {} ", "{}\n"]),
    marker=st.sampled_from(["VERDICT: ", "Verdict:", "verdict = ", "**VERDICT:** "]),
)
def test_the_last_verdict_line_wins_whatever_came_before(
    prefix: str, word: str, decoration: str, marker: str
) -> None:
    reply = f"{prefix}\n{marker}{decoration.format(word)}"
    assert parse_verdict(reply) is WORDS[word]


@given(prefix=st.text(), letter=st.sampled_from(["A", "B", "tie"]))
def test_a_boxed_letter_counts_when_no_verdict_line(prefix: str, letter: str) -> None:
    assume("verdict" not in prefix.lower())
    assert parse_verdict(f"{prefix} so the answer is \\boxed{{{letter}}}") is WORDS[letter.upper()]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("A", Verdict.A),
        (" b. ", Verdict.B),
        ("**B**", Verdict.B),
        ("Solution A", Verdict.A),
        ("(tie)", Verdict.TIE),
        ("VERDICT: A\n...on reflection, VERDICT: B", Verdict.B),
        ("I cannot tell which one is right.", None),
        ("A is wrong because B forgot the sign", None),  # letters in prose are not a verdict
        ("VERDICT: AB", None),
        ("", None),
    ],
)
def test_examples(reply: str, expected: Verdict | None) -> None:
    assert parse_verdict(reply) is expected


def test_the_prompt_shows_both_candidates_in_the_asked_order() -> None:
    (message,) = pairwise_messages("1+1?", "first says 2", "second says 3")
    text = message["content"]
    assert text.index("Solution A\nfirst says 2") < text.index("Solution B\nsecond says 3")
    assert "VERDICT: A" in text and "1+1?" in text
