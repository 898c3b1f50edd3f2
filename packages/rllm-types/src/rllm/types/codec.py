"""msgpack (the wire format) and JSON (for people) codecs for every rllm.types Struct.

Decoding checks types and invariants and raises :class:`SchemaError` whose ``path`` names the
offending field, e.g. ``trajectories[0].steps[3].logprobs``. Unknown fields are ignored, so an
older reader accepts a newer writer's records as long as the schema version allows it.
"""

from __future__ import annotations

import functools
from array import array
from typing import Any, TypeVar

import msgspec

from rllm.types.arrays import Advantage, FloatArray, TokenArray, packed_bytes
from rllm.types.errors import InputError, InvariantError, SchemaError, UsageError

T = TypeVar("T")


def _enc_msgpack(obj: Any) -> Any:
    if isinstance(obj, array):
        return packed_bytes(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _enc_json(obj: Any) -> Any:
    if isinstance(obj, array):
        return obj.tolist()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dec(tp: type, obj: Any) -> Any:
    if tp is TokenArray or tp is FloatArray:
        if isinstance(obj, bytes) and len(obj) % 4:
            raise InputError(f"packed {tp.__name__} has {len(obj)} bytes, not a multiple of 4")
        if not isinstance(obj, bytes | list):
            raise UsageError(
                f"Expected `{tp.__name__}` (bytes or list of numbers), got `{type(obj).__name__}`"
            )
        return tp(obj)
    if tp is Advantage:
        if isinstance(obj, float | int) and not isinstance(obj, bool):
            return float(obj)
        return _dec(FloatArray, obj)
    raise NotImplementedError(f"cannot decode {tp!r}")


_msgpack_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_msgpack)
_json_encoder = msgspec.json.Encoder(enc_hook=_enc_json)


@functools.cache
def _msgpack_decoder(tp: Any) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(tp, dec_hook=_dec)


@functools.cache
def _json_decoder(tp: Any) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(tp, dec_hook=_dec)


def to_msgpack(obj: Any) -> bytes:
    """Encode a Struct (or list/dict of Structs) as msgpack; arrays travel as packed bytes."""
    return _msgpack_encoder.encode(obj)


def to_json(obj: Any) -> bytes:
    """Encode as JSON; arrays become plain lists."""
    return _json_encoder.encode(obj)


def to_builtins(obj: Any) -> Any:
    """Plain dicts/lists/numbers, e.g. for a JSON HTTP response or a pandas row."""
    return msgspec.to_builtins(obj, enc_hook=_enc_json)


def from_msgpack(data: bytes | memoryview, tp: type[T]) -> T:
    """Decode msgpack into ``tp``; raises SchemaError naming the bad field's path."""
    return _decode(data, _msgpack_decoder(tp))


def from_json(data: bytes | str, tp: type[T]) -> T:
    """Decode JSON into ``tp``; raises SchemaError naming the bad field's path."""
    return _decode(data, _json_decoder(tp))


def convert(obj: Any, tp: type[T]) -> T:
    """Build ``tp`` from plain Python data (dicts/lists), with the same checks as decoding."""
    try:
        return msgspec.convert(obj, tp, dec_hook=_dec)
    except msgspec.ValidationError as exc:
        raise _from_validation_error(exc) from None
    except InvariantError as exc:
        raise SchemaError(exc.reason, exc.field) from None


def _decode(data: Any, decoder: Any) -> Any:
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _from_validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise SchemaError(f"malformed input: {exc}") from None
    except InvariantError as exc:
        raise SchemaError(exc.reason, exc.field) from None


def _from_validation_error(exc: msgspec.ValidationError) -> SchemaError:
    message, _, where = str(exc).rpartition(" - at `")
    if not message:
        message, where = str(exc), "$`"
    path = where.rstrip("`").removeprefix("$").removeprefix(".")
    cause = exc.__cause__
    if isinstance(cause, InvariantError):  # raised by a Struct's __post_init__
        return SchemaError(cause.reason, _join(path, cause.field))
    missing = message.partition("Object missing required field `")[2]
    if missing:
        return SchemaError("missing required field", _join(path, missing.rstrip("`")))
    return SchemaError(message, path)


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field
