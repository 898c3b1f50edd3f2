"""String and number matching rewards: exact, normalised and numeric-with-tolerance."""

from __future__ import annotations

import math
import re
import string
import unicodedata

from rllm.types.errors import InputError

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPACES = re.compile(r"\s+")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?%?")


def exact_match(prediction: str, reference: str) -> bool:
    """True if the strings are identical after trimming surrounding whitespace."""
    return prediction.strip() == reference.strip()


def normalize_text(text: str) -> str:
    """Lower-case, strip accents, punctuation, articles and extra spaces (SQuAD-style answers)."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    text = "".join(c for c in text if c not in string.punctuation)
    text = _ARTICLES.sub(" ", text)
    return _SPACES.sub(" ", text).strip()


def normalized_match(prediction: str, reference: str | list[str]) -> bool:
    """True if the normalised prediction equals the (or any) normalised reference."""
    references = [reference] if isinstance(reference, str) else list(reference)
    pred = normalize_text(prediction)
    return any(pred == normalize_text(ref) for ref in references)


def parse_number(text: str) -> float | None:
    """The last number in ``text`` ("1,234.5", "-3e2", "45%" → 0.45), or None if there is none.

    The last one, because chain-of-thought answers state the result at the end.
    """
    candidates = [m.group(0) for m in _NUMBER.finditer(text) if any(ch.isdigit() for ch in m.group(0))]
    if not candidates:
        return None
    raw = candidates[-1].replace(",", "")
    scale = 1.0
    if raw.endswith("%"):
        raw, scale = raw[:-1], 0.01
    try:
        return float(raw) * scale
    except ValueError:
        return None


def numeric_match(
    prediction: str | float, reference: str | float, rel_tol: float = 1e-6, abs_tol: float = 1e-9
) -> bool:
    """True if both sides hold a number and they agree within ``rel_tol`` / ``abs_tol``."""
    if rel_tol < 0 or abs_tol < 0:
        raise InputError(f"tolerances must be >= 0, got rel_tol={rel_tol}, abs_tol={abs_tol}")
    pred = prediction if isinstance(prediction, int | float) else parse_number(prediction)
    ref = reference if isinstance(reference, int | float) else parse_number(reference)
    if pred is None or ref is None:
        return False
    return math.isclose(float(pred), float(ref), rel_tol=rel_tol, abs_tol=abs_tol)
