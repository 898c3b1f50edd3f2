"""The rubric judges' strict parsers, property-based: every well-formed reply reads back its
scores, and every reply that is not one (no score, two, a decimal, out of range, a trajectory
missing or repeated) is refused, never read as a number."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm.sdk.rewards import JudgeParseError, parse_group_scores, parse_rubric_score

# Free text a judge writes around its scores; it never spells "score".
PROSE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80).filter(
    lambda t: "score" not in t.lower()
)
# A busy CI machine (load 10 on 2 cores) must not fail a property on time: no deadline, no speed check.
LOADED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPACING = st.sampled_from(["SCORE: {s}", "SCORE : {s}", "score:{s}", "Score:  {s}"])


@LOADED
@given(
    st.integers(1, 20).flatmap(lambda scale: st.tuples(st.just(scale), st.integers(0, scale))),
    PROSE,
    PROSE,
    SPACING,
)
def test_a_pointwise_score_reads_back_whatever_surrounds_it(scale_and_score, before, after, form) -> None:
    scale, score = scale_and_score
    reply = f"{before}\n{form.format(s=score)}\n{after}"
    assert parse_rubric_score(reply, scale) == score


@LOADED
@given(PROSE)
def test_a_reply_without_a_score_is_refused(text: str) -> None:
    with pytest.raises(JudgeParseError, match="no 'SCORE: s'"):
        parse_rubric_score(text)


@LOADED
@given(st.integers(0, 10), st.integers(0, 10), PROSE)
def test_two_scores_are_refused_not_the_last_taken(a: int, b: int, middle: str) -> None:
    with pytest.raises(JudgeParseError, match="exactly one"):
        parse_rubric_score(f"SCORE: {a}\n{middle}\nSCORE: {b}")


@pytest.mark.parametrize(
    ("reply", "why"),
    [("SCORE: 7.5", "whole number"), ("SCORE: -1", "whole number"), ("SCORE: 11", "over the scale")],
)
def test_a_score_off_the_scale_is_refused_by_name(reply: str, why: str) -> None:
    with pytest.raises(JudgeParseError, match=why):
        parse_rubric_score(reply, 10)


@st.composite
def group_replies(draw: st.DrawFn) -> tuple[int, int, list[int], str]:
    n = draw(st.integers(1, 8))
    scale = draw(st.integers(1, 10))
    scores = draw(st.lists(st.integers(0, scale), min_size=n, max_size=n))
    order = draw(st.permutations(list(range(1, n + 1))))
    lines = [f"{draw(PROSE)}\nSCORE {i}: {scores[i - 1]}" for i in order]
    return n, scale, scores, "\n".join(lines) + "\n" + draw(PROSE)


@LOADED
@given(group_replies())
def test_group_scores_read_back_in_trajectory_order_whatever_order_they_came_in(case) -> None:
    n, scale, scores, reply = case
    assert parse_group_scores(reply, n, scale) == scores


@LOADED
@given(group_replies(), st.data())
def test_a_group_reply_missing_or_repeating_a_trajectory_is_refused(case, data: st.DataObject) -> None:
    n, scale, _, reply = case
    lines = re.findall(r"SCORE \d+: \d+", reply)
    victim = data.draw(st.sampled_from(lines))
    with pytest.raises(JudgeParseError, match="no 'SCORE i: s' line for trajectory"):
        parse_group_scores(reply.replace(victim, "(no grade)"), n, scale)
    with pytest.raises(JudgeParseError, match="scored twice"):
        parse_group_scores(reply + "\n" + victim, n, scale)
    with pytest.raises(JudgeParseError, match="names no trajectory"):
        parse_group_scores(reply + f"\nSCORE {n + 1}: 0", n, scale)


def test_the_tiny_models_spacing_reads_the_same() -> None:
    """A word-level tokenizer decodes with a space between every token."""
    assert parse_group_scores("SCORE 1 : 7 SCORE 2 : 10", 2) == [7, 10]
    assert parse_rubric_score("ok . SCORE : 3") == 3
    with pytest.raises(JudgeParseError, match="whole number"):
        parse_group_scores("SCORE 1 : 7 . 5 SCORE 2 : 1", 2)


def test_the_next_line_is_never_part_of_the_score() -> None:
    """Found by the property above: a reply whose next line starts with ".0" is not "0.0"."""
    assert parse_rubric_score("SCORE: 0\n.0", 1) == 0
    assert parse_group_scores("SCORE 1: 3\n.5 SCORE 2: 4", 2) == [3, 4]
