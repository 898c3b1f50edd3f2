"""Reward helpers. Matching needs nothing; math grading needs the ``math`` extra, the LLM judge
the ``judge`` extra (both imported lazily, so ``import rllm.sdk.rewards`` always works)."""

from typing import TYPE_CHECKING

from rllm.sdk.rewards.boxed import extract_boxed
from rllm.sdk.rewards.match import exact_match, normalize_text, normalized_match, numeric_match, parse_number

if TYPE_CHECKING:  # imported on first use below, so the optional extras stay optional
    from rllm.sdk.rewards.judge import LLMJudge, parse_verdict
    from rllm.sdk.rewards.math_grader import grade_math, math_reward

__all__ = [
    "LLMJudge",
    "exact_match",
    "extract_boxed",
    "grade_math",
    "math_reward",
    "normalize_text",
    "normalized_match",
    "numeric_match",
    "parse_number",
    "parse_verdict",
]


def __getattr__(name: str) -> object:  # lazy: keep optional dependencies optional
    if name in ("grade_math", "math_reward"):
        from rllm.sdk.rewards import math_grader

        return getattr(math_grader, name)
    if name in ("LLMJudge", "parse_verdict"):
        from rllm.sdk.rewards import judge

        return getattr(judge, name)
    raise AttributeError(f"module 'rllm.sdk.rewards' has no attribute {name!r}")
