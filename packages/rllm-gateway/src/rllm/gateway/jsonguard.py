"""Limits on decoded JSON: nesting depth and integers that fit in int64.

Both protect what comes after decoding. A document nested thousands deep makes every recursive
consumer (validation, msgpack/JSON encoding of a trace, the store) raise RecursionError, and an
integer beyond int64 cannot be encoded as msgpack, so a trace holding one could never be read.
Such input is refused at the door (400), where the field can still be named.

The walk is iterative (no recursion of its own). The gateway runs it on the free-form parts of a
request that a trace keeps (``tools``; the whole body with ``store_raw``) and on admin bodies,
not on every byte of every request: that would cost as much as decoding it.
"""

from __future__ import annotations

from typing import Any

from rllm.types.errors import RLLMError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class JsonLimitError(RLLMError, ValueError):
    """The document breaks a limit; ``path`` names where (``tools[0].parameters``...)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


def check_json(obj: Any, max_depth: int, root: str = "") -> None:
    """Raise JsonLimitError if ``obj`` nests deeper than ``max_depth`` containers or holds an
    integer outside int64 (bools are fine)."""
    stack: list[tuple[Any, int, str]] = [(obj, 0, root)]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, dict):
            if depth >= max_depth:
                raise JsonLimitError(f"JSON nested deeper than {max_depth} levels", path or "body")
            for k, v in value.items():
                stack.append((v, depth + 1, f"{path}.{k}" if path else str(k)))
        elif isinstance(value, list):
            if depth >= max_depth:
                raise JsonLimitError(f"JSON nested deeper than {max_depth} levels", path or "body")
            for i, v in enumerate(value):
                stack.append((v, depth + 1, f"{path}[{i}]"))
        elif type(value) is int and not (INT64_MIN <= value <= INT64_MAX):
            raise JsonLimitError("integer does not fit in 64 bits", path or "body")


def fits_int64(value: int) -> bool:
    return INT64_MIN <= value <= INT64_MAX


__all__ = ["INT64_MAX", "INT64_MIN", "JsonLimitError", "check_json", "fits_int64"]
