"""Math answer grading with math-verify (install ``rllm-sdk[math]``).

Extracts the model's final answer (the last ``\\boxed{}``; else math-verify's own LaTeX and
expression extraction) and checks symbolic equivalence with the ground truth, so ``\\frac{1}{2}``,
``0.5`` and ``1/2`` all match.

A ground truth that is a plain number (``72``, ``-3.5``, ``1,234``) is graded by value, and the
answer must be a number too: the whole box, or without one the reply's last number (a decimal, or
a fraction ``a/b`` / ``\\frac{a}{b}`` when the truth is not an integer). Symbolic equivalence
there would accept the question restated: math-verify evaluates ``47 + 25`` to 72, and
SmolLM2-135M learned within 10 steps to answer "What is 47 + 25?" with ``47 + 25`` (or
``\\boxed{47 + 25}``) for full reward (benchmarks/history/issue-48.md, "the echo hack").
"""

from __future__ import annotations

import logging
import re
import threading
from fractions import Fraction
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


_INT = r"[-+]?\d+"
_DECIMAL = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMERIC_TRUTH = re.compile(rf"{_DECIMAL}")
# One numeric answer: \frac{a}{b} (or \dfrac, \tfrac), a/b, or a decimal; the first that fits at a
# position, so "3/4" is one fraction, not 3 then 4.
_ATOM = re.compile(rf"\\[dt]?frac\{{({_INT})\}}\{{({_INT})\}}|({_INT})\s*/\s*(\d+)|({_DECIMAL})")
# What may surround a number in a box without changing it: math mode, a currency sign, spacing, a
# thousands brace, a percent, degree or unit word after it (``\boxed{72\text{ apples}}``), a
# final full stop.
_BOX_NOISE = re.compile(r"\\?\$|\\[,!;: ]|\\text\{[^{}]*\}|\\mathrm\{[^{}]*\}|\\%|%|\^\{?\\circ\}?|°|\s+|\.$")


def _atom_value(match: re.Match[str]) -> tuple[Fraction, bool] | None:
    """The value of one ``_ATOM`` match, and whether it was written as a fraction."""
    frac_num, frac_den, slash_num, slash_den, decimal = match.groups()
    num, den = (frac_num, frac_den) if frac_num is not None else (slash_num, slash_den)
    if num is not None:
        return (Fraction(int(num), int(den)), True) if int(den) != 0 else None
    return Fraction(decimal.replace(",", "")), False


def _numeric_answer(response: str) -> tuple[Fraction, bool] | None:
    """The reply's final numeric answer: the whole last box when there is one (None unless it
    holds exactly one number: ``\\boxed{47 + 25}`` is no answer), else its last number."""
    boxed = _boxed_answer(response)
    if boxed is not None:
        match = _ATOM.fullmatch(_BOX_NOISE.sub("", boxed.replace("{,}", ",")))
        return _atom_value(match) if match else None
    matches = list(_ATOM.finditer(response))
    return _atom_value(matches[-1]) if matches else None


def _grade_number(response: str, truth: str) -> bool:
    answer = _numeric_answer(response)
    if answer is None:
        return False
    value, as_fraction = answer
    gold = Fraction(truth.replace(",", ""))
    if as_fraction and gold.denominator == 1:
        return False  # "84/2" for 42 is the sum left undone, not an answer
    return value == gold


def grade_math(response: str, ground_truth: str | float | int) -> bool:
    """True if the final answer in ``response`` is mathematically equivalent to ``ground_truth``
    (by value, and only a number, when the truth is a plain number: see the module's docstring)."""
    truth = str(ground_truth).strip()
    if _NUMERIC_TRUTH.fullmatch(truth):
        return _grade_number(response, truth)
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
