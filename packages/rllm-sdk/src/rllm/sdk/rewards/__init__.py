"""Reward helpers. Matching needs nothing; math grading needs the ``math`` extra, the LLM judge
the ``judge`` extra (both imported lazily, so ``import rllm.sdk.rewards`` always works)."""

from rllm.sdk.rewards.boxed import extract_boxed
from rllm.sdk.rewards.match import exact_match, normalize_text, normalized_match, numeric_match, parse_number

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


def __getattr__(name: str):  # lazy: keep optional dependencies optional
    if name in ("grade_math", "math_reward"):
        from rllm.sdk.rewards import math_grader

        return getattr(math_grader, name)
    if name in ("LLMJudge", "parse_verdict"):
        from rllm.sdk.rewards import judge

        return getattr(judge, name)
    raise AttributeError(f"module 'rllm.sdk.rewards' has no attribute {name!r}")
