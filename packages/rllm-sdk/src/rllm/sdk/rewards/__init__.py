"""Reward helpers. Matching needs nothing; math grading needs the ``math`` extra, the LLM judges
the ``judge`` extra (``openai``, imported when a judge first asks its model, so
``import rllm.sdk.rewards`` always works).

Judges: ``LLMJudge`` (one answer against a reference), ``RubricJudge`` (pointwise, a rubric),
``GroupJudge`` (RULER-style: a group's trajectories scored together, relative to each other;
``GroupGather`` makes it the engine's per-episode evaluator); all ask through a
``JudgeEndpoint`` (any OpenAI-compatible endpoint; concurrency limit, content-hash cache in
memory or SQLite, tokens and cost counted). ``CombinedReward`` sums a judge with programmatic
rewards."""

from typing import TYPE_CHECKING

from rllm.sdk.rewards.boxed import extract_boxed
from rllm.sdk.rewards.combine import CombinedReward
from rllm.sdk.rewards.group_gather import GroupGather
from rllm.sdk.rewards.judge import LLMJudge, parse_verdict
from rllm.sdk.rewards.judge_cache import JudgeCache
from rllm.sdk.rewards.judge_client import (
    CallUsage,
    JudgeEndpoint,
    JudgeReplyError,
    JudgeUnavailable,
    JudgeUsage,
)
from rllm.sdk.rewards.judge_parse import JudgeParseError, parse_group_scores, parse_rubric_score
from rllm.sdk.rewards.match import exact_match, normalize_text, normalized_match, numeric_match, parse_number
from rllm.sdk.rewards.rubric import GroupJudge, RubricJudge, mark_judge_failure

if TYPE_CHECKING:  # imported on first use below, so the optional extra stays optional
    from rllm.sdk.rewards.math_grader import grade_math, math_reward

__all__ = [
    "CallUsage",
    "CombinedReward",
    "GroupGather",
    "GroupJudge",
    "JudgeCache",
    "JudgeEndpoint",
    "JudgeParseError",
    "JudgeReplyError",
    "JudgeUnavailable",
    "JudgeUsage",
    "LLMJudge",
    "RubricJudge",
    "exact_match",
    "extract_boxed",
    "grade_math",
    "mark_judge_failure",
    "math_reward",
    "normalize_text",
    "normalized_match",
    "numeric_match",
    "parse_group_scores",
    "parse_number",
    "parse_rubric_score",
    "parse_verdict",
]


def __getattr__(name: str) -> object:  # lazy: keep the math extra optional
    if name in ("grade_math", "math_reward"):
        from rllm.sdk.rewards import math_grader

        return getattr(math_grader, name)
    raise AttributeError(f"module 'rllm.sdk.rewards' has no attribute {name!r}")
