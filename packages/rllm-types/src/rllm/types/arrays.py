"""Packed numeric arrays for token ids, logprobs and per-token values.

Token ids and logprobs are the bulk of every trace. They stay packed (stdlib ``array.array``)
from the gateway to the trainer: msgpack carries their raw little-endian bytes, ``numpy``
and ``torch`` wrap them without a copy (``np.frombuffer(ids, dtype=np.int32)``), and JSON shows
them as plain lists for people.
"""

from __future__ import annotations

import abc
import sys
from array import array
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeAlias, overload

_LITTLE_ENDIAN = sys.byteorder == "little"


class TokenArray(array):
    """int32 token ids."""

    def __new__(cls, values: Iterable[int] | bytes = ()) -> TokenArray:
        return _new_packed(cls, "i", values)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.tolist(),))

    def __repr__(self) -> str:
        return f"TokenArray({self.tolist()!r})"


class FloatArray(array):
    """float32 values, one per token: logprobs, per-token advantages, masks."""

    def __new__(cls, values: Iterable[float] | bytes = ()) -> FloatArray:
        return _new_packed(cls, "f", values)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.tolist(),))

    def __repr__(self) -> str:
        return f"FloatArray({self.tolist()!r})"


def _new_packed(cls: type, typecode: str, values: Any) -> Any:
    out = array.__new__(cls, typecode)
    if isinstance(values, bytes | bytearray | memoryview):
        out.frombytes(values)
        if not _LITTLE_ENDIAN:  # the wire format is little-endian
            out.byteswap()
    elif isinstance(values, array) and values.typecode == typecode:
        out.frombytes(values.tobytes())
    else:
        out.extend(values)  # type: ignore[arg-type]
    return out


def packed_bytes(values: array) -> memoryview | bytes:
    """The little-endian bytes of ``values``, without a copy on little-endian hosts."""
    if _LITTLE_ENDIAN:
        return memoryview(values).cast("B")
    swapped = array(values.typecode, values)
    swapped.byteswap()
    return swapped.tobytes()


if TYPE_CHECKING:
    # What type checkers see: the two concrete types a step's advantage can be.
    Advantage: TypeAlias = float | FloatArray
else:

    class Advantage(abc.ABC):  # noqa: B024 - a marker ABC, nothing to implement
        """A step's advantage: one float for the whole response, or a FloatArray with one per token.

        msgspec unions cannot mix custom types with floats, so the field is annotated with this
        ABC and both concrete types are registered as virtual subclasses.
        """

    Advantage.register(float)
    Advantage.register(int)
    Advantage.register(FloatArray)


@overload
def as_token_array(values: None) -> None: ...
@overload
def as_token_array(values: Iterable[Any] | bytes) -> TokenArray: ...
def as_token_array(values: Any) -> TokenArray | None:
    """Coerce ``values`` (list, array, numpy array, bytes) to a TokenArray; None stays None."""
    if values is None or type(values) is TokenArray:
        return values
    return TokenArray(_plain(values))


@overload
def as_float_array(values: None) -> None: ...
@overload
def as_float_array(values: Iterable[Any] | bytes) -> FloatArray: ...
def as_float_array(values: Any) -> FloatArray | None:
    """Coerce ``values`` to a FloatArray; None stays None."""
    if values is None or type(values) is FloatArray:
        return values
    return FloatArray(_plain(values))


def _plain(values: Any) -> Any:
    # numpy/torch arrays: go through a Python list so dtype mismatches convert, not reinterpret.
    tolist = getattr(values, "tolist", None)
    if tolist is not None and not isinstance(values, array):
        return tolist()
    return values
