"""Safe arithmetic for the agent's calculator tool: parsed with :mod:`ast`, never ``eval``-ed."""

from __future__ import annotations

import ast
import math
import operator

from rllm.types.errors import RLLMError

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCTIONS = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt, "log": math.log}
MAX_EXPONENT = 100  # 10**10**10 would hang the process, not raise


class CalculatorError(RLLMError, ValueError):
    """The expression is not plain arithmetic (or cannot be computed)."""


def calculate(expression: str) -> float:
    """The value of an arithmetic expression: numbers, + - * / % **, parentheses, a few functions."""
    try:
        tree = ast.parse(expression.replace(",", "").strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from exc
    try:
        return float(_value(tree.body))
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise CalculatorError(f"cannot compute {expression!r}: {exc}") from exc


def _value(node: ast.AST) -> float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        return _BINARY[type(node.op)](left, right)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        return _FUNCTIONS[node.func.id](*(_value(arg) for arg in node.args))
    raise CalculatorError(f"not allowed in the calculator: {ast.dump(node)[:60]}")
