"""Math answer grading with math-verify (install ``rllm-sdk[math]``).

Extracts the model's final answer (the last ``\\boxed{}``; else math-verify's own LaTeX and
expression extraction) and checks symbolic equivalence with the ground truth, so ``\\frac{1}{2}``,
``0.5`` and ``1/2`` all match.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from rllm.sdk.rewards.boxed import extract_boxed
from rllm.types import EvalOutput, Signal
from rllm.types.errors import InputError, MissingExtraError


class _DisabledTimeoutIsOurChoice(logging.Filter):
    """math-verify warns "Timeout is disabled" on every call without a timeout; outside the main
    thread that is this module's deliberate choice (see ``_timeout``), so the warning is noise
    that floods an evaluation's output. Every other math-verify message passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


_NO_TIMEOUT_FILTER = _DisabledTimeoutIsOurChoice()


def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise MissingExtraError("math grading needs math-verify: pip install 'rllm-sdk[math]'") from exc
    for name in ("math_verify.grader", "math_verify.parser"):
        logger = logging.getLogger(name)
        if _NO_TIMEOUT_FILTER not in logger.filters:
            logger.addFilter(_NO_TIMEOUT_FILTER)
    return math_verify


def _timeout() -> int | None:
    # math-verify times out with signal.alarm, which only works in the main thread; engines run
    # sync evaluators in worker threads, where the timeout must be off (the deadline is theirs).
    return 5 if threading.current_thread() is threading.main_thread() else None


def _parse(text: str) -> list[Any]:
    mv = _math_verify()
    configs = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    return mv.parse(text, extraction_config=configs, parsing_timeout=_timeout())


def _as_latex(text: str) -> str:
    """Wrap a bare answer in ``$...$`` so the LaTeX extractor sees it; keep text that has math already."""
    return text if ("$" in text or "\\(" in text or "\\[" in text) else f"${text}$"


def _boxed_answer(response: str) -> str | None:
    """The last ``\\boxed{}``'s content, or None when there is none or it is empty: an empty box
    (the prompt's own ``\\boxed{}`` echoed) holds no answer."""
    boxed = extract_boxed(response)
    return boxed if boxed is not None and boxed.strip() else None


def grade_math(response: str, ground_truth: str | float | int) -> bool:
    """True if the final answer in ``response`` is mathematically equivalent to ``ground_truth``."""
    mv = _math_verify()
    boxed = _boxed_answer(response)
    gold = _parse(_as_latex(str(ground_truth)))
    if not gold:
        raise InputError(f"cannot parse the ground truth {ground_truth!r} as math")
    pred = _parse(_as_latex(boxed)) if boxed is not None else _parse(response)
    if not pred:
        return False
    return bool(mv.verify(gold, pred, timeout_seconds=_timeout()))


def checked_format_coef(value: object) -> float:
    """``value`` as a format coefficient (a number from 0 to 1); InputError naming it otherwise."""
    try:
        coef = float(value)  # pyright: ignore[reportArgumentType]
    except (TypeError, ValueError):
        raise InputError(f"format_coef must be a number, got {value!r}") from None
    if not 0.0 <= coef <= 1.0:
        raise InputError(f"format_coef must be between 0 and 1, got {value!r}")
    return coef


def math_reward(response: str, ground_truth: str | float | int, format_coef: float = 0.0) -> EvalOutput:
    """An EvalOutput for math answers: reward 1/0, is_correct, and a ``has_boxed`` format signal
    (an answer in a box: an empty ``\\boxed{}`` is none).

    The grade reads an unboxed final answer too, so RL on it is free to drop the ``\\boxed{}`` it
    was asked for (SmolLM2-135M did within 5 steps: boxed 9% -> 2%). ``format_coef`` (0 to 1) takes
    that much off the reward of a reply without a box, right or wrong: the format term of
    tinker-cookbook's math environments. ``is_correct`` stays the grade alone."""
    format_coef = checked_format_coef(format_coef)
    correct = grade_math(response, ground_truth)
    has_boxed = _boxed_answer(response) is not None  # echoing the prompt's empty box is no dodge
    penalty = 0.0 if has_boxed else format_coef
    return EvalOutput(
        reward=(1.0 if correct else 0.0) - penalty,
        is_correct=correct,
        signals=[Signal(name="has_boxed", value=1.0 if has_boxed else 0.0)],
    )
