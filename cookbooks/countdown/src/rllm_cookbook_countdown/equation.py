"""The exact check of a countdown answer: arithmetic only, each given number at most once.

The equation is parsed with :mod:`ast` (never evaluated as code) and computed with exact
fractions, so ``7 / 2 * 2`` is exactly 7 and no float rounding makes a wrong answer right.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction

from rllm.types.errors import RLLMError

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OPS = {
    ast.Add: Fraction.__add__,
    ast.Sub: Fraction.__sub__,
    ast.Mult: Fraction.__mul__,
    ast.Div: Fraction.__truediv__,
}


class BadEquation(RLLMError, ValueError):
    """The answer is not an arithmetic expression over integers."""


def extract_equation(reply: str) -> str | None:
    """The last ``<answer>...</answer>``, with a trailing ``= target`` dropped."""
    found = _ANSWER.findall(reply)
    if not found:
        return None
    return found[-1].split("=")[0].strip()


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """The exact value of ``expression`` and the integers it uses, in order."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise BadEquation(f"not an expression: {expression!r}") from exc
    used: list[int] = []

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise BadEquation("division by zero")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        raise BadEquation(f"only integers, + - * / and parentheses are allowed, not {ast.dump(node)[:40]}")

    return value(tree.body), used


def check(reply: str, numbers: list[int], target: int) -> tuple[bool, str]:
    """``(correct, why)``: the equation hits ``target`` using each of ``numbers`` at most once."""
    equation = extract_equation(reply)
    if equation is None:
        return False, "no <answer>...</answer>"
    try:
        result, used = evaluate(equation)
    except BadEquation as exc:
        return False, str(exc)
    if Counter(used) - Counter(numbers):
        return False, f"uses numbers not given (or twice): {used}"
    if result != target:
        return False, f"equals {result}, not {target}"
    return True, "ok"
