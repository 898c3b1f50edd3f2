"""Extract ``\\boxed{...}`` answers (brace-balanced) from model output; no dependencies."""

from __future__ import annotations

_MARKERS = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed x``) in ``text``.

    Braces are balanced by counting, so ``\\boxed{\\frac{1}{2}}`` yields ``\\frac{1}{2}``; an
    unterminated box yields None rather than a truncated answer.
    """
    start = max(text.rfind(marker) for marker in _MARKERS)
    if start < 0:
        return None
    marker = next(m for m in _MARKERS if text.startswith(m, start))
    i = start + len(marker)
    if text.startswith(" ", i):  # "\boxed 5": the token up to the next space or "$"
        rest = text[i + 1 :]
        end = min((p for p in (rest.find("$"), rest.find(" "), rest.find("\n")) if p >= 0), default=len(rest))
        return rest[:end].strip() or None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None
