"""The header of a GGUF file (metadata and tensor table), read and checked without its weights.

``rllm model import`` reads this before handing the file to transformers' GGUF loader, which
dequantises every tensor and converts the vocabulary (minutes): a file that is not a model, is
truncated, names an architecture or a tensor type the loader does not take, or has no usable
chat template is refused in well under a second, with one line naming why.

Why not ``gguf.GGUFReader``: it builds a numpy view for every item of every array (262,144
token strings for Gemma 3), which takes tens of seconds on a busy CPU, and it fails on a
damaged file with whatever numpy raised. This reader skips arrays it does not need, bounds every
read by the file's size (a forged count cannot make it loop or allocate), and raises one
``GGUFError`` for anything it cannot read. Layout (GGUF v2 and v3, little-endian): magic
``GGUF``, u32 version, u64 tensor count, u64 metadata count; each metadata entry a string key,
a u32 value type and the value; each tensor a string name, u32 dims, u64 per dim, u32 type, u64
offset into the data section, which starts at the header's end rounded up to
``general.alignment`` (default 32).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from rllm.types.errors import InputError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 8  # ggml has 4; anything far past that is a damaged file, not a model
MAX_NESTING = 8  # arrays of arrays: real files nest once at most

# GGUF value types: fixed-size scalars (struct format), string (8), array (9).
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class GGUFError(InputError):
    """The file is not a GGUF file rLLM can read; the message names the file and why."""


@dataclass(frozen=True)
class GGUFArray:
    """An array value, by its item type and length (the items are skipped, not read)."""

    item_type: int
    count: int


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]
    type_id: int  # a ggml type (gguf.GGMLQuantizationType's value)
    offset: int  # from the start of the data section


@dataclass
class GGUFHeader:
    version: int
    metadata: dict[str, object] = field(default_factory=dict)
    tensors: list[GGUFTensor] = field(default_factory=list)
    data_start: int = 0  # byte offset of the data section
    file_size: int = 0

    def string(self, key: str) -> str | None:
        value = self.metadata.get(key)
        return value if isinstance(value, str) else None

    def integer(self, key: str) -> int | None:
        value = self.metadata.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf: bytes | mmap.mmap, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path} is truncated or damaged: {what} runs past the end of the file")

    def unpack(self, fmt: str, what: str) -> object:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return int(self.unpack("<I", what))  # pyright: ignore[reportArgumentType]

    def u64(self, what: str) -> int:
        return int(self.unpack("<Q", what))  # pyright: ignore[reportArgumentType]

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path} is damaged: {what} is not UTF-8") from None

    def skip_string(self, what: str) -> None:
        n = self.u64(what)
        self.need(n, what)
        self.pos += n

    def value(self, type_id: int, what: str) -> object:
        if type_id in _SCALARS:
            return self.unpack(_SCALARS[type_id], what)
        if type_id == _STRING:
            return self.string(what)
        if type_id == _ARRAY:
            item_type = self.u32(what)
            count = self.u64(what)
            self.skip_array(item_type, count, what)
            return GGUFArray(item_type, count)
        raise GGUFError(f"{self.path} is damaged: {what} has unknown value type {type_id}")

    def skip_array(self, item_type: int, count: int, what: str, depth: int = 0) -> None:
        if depth > MAX_NESTING:
            raise GGUFError(f"{self.path} is damaged: {what} nests arrays {depth} deep")
        if item_type in _SCALARS:
            self.need(count * struct.calcsize(_SCALARS[item_type]), what)
            self.pos += count * struct.calcsize(_SCALARS[item_type])
        elif item_type == _STRING:
            self.need(count * 8, what)  # each string is at least its u64 length
            for _ in range(count):
                self.skip_string(what)
        elif item_type == _ARRAY:
            self.need(count * 12, what)  # each nested array is at least its type and length
            for _ in range(count):
                nested_type = self.u32(what)
                self.skip_array(nested_type, self.u64(what), what, depth + 1)
        else:
            raise GGUFError(f"{self.path} is damaged: {what} holds items of unknown type {item_type}")


def read_header(path: Path, quant_sizes: dict[int, tuple[int, int]]) -> GGUFHeader:
    """The header of the GGUF file at ``path``; every tensor's bytes checked to lie in the file.

    ``quant_sizes`` maps each ggml type id to (elements per block, bytes per block) (gguf's
    ``GGML_QUANT_SIZES``); a tensor of a type not in it is refused by the caller, not here.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        if f.read(4) != MAGIC:
            raise GGUFError(f"{path} is not a GGUF file (it does not start with the GGUF magic)")
        if size < 24:
            raise GGUFError(f"{path} is truncated: {size} bytes, shorter than a GGUF header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Cursor(buf, path), path, size, quant_sizes)


def _parse(cur: _Cursor, path: Path, size: int, quant_sizes: dict[int, tuple[int, int]]) -> GGUFHeader:
    cur.pos = 4
    version = cur.u32("the version")
    if version not in (2, 3):
        raise GGUFError(f"{path} is GGUF version {version}; only versions 2 and 3 are read")
    tensor_count = cur.u64("the tensor count")
    kv_count = cur.u64("the metadata count")
    header = GGUFHeader(version=version, file_size=size)
    cur.need(kv_count * 12, "the metadata")  # each entry is at least a key length and a type
    for i in range(kv_count):
        key = cur.string(f"metadata entry {i}'s key")
        header.metadata[key] = cur.value(cur.u32(f"{key}'s type"), key)
    cur.need(tensor_count * 24, "the tensor table")  # name length, dims, type, offset at least
    for i in range(tensor_count):
        name = cur.string(f"tensor {i}'s name")
        n_dims = cur.u32(f"tensor {name}'s dimension count")
        if n_dims > MAX_DIMS:
            raise GGUFError(f"{path} is damaged: tensor {name} has {n_dims} dimensions")
        shape = tuple(cur.u64(f"tensor {name}'s shape") for _ in range(n_dims))
        type_id = cur.u32(f"tensor {name}'s type")
        header.tensors.append(GGUFTensor(name, shape, type_id, cur.u64(f"tensor {name}'s offset")))
    alignment = header.integer("general.alignment") or DEFAULT_ALIGNMENT
    if alignment <= 0:
        raise GGUFError(f"{path} is damaged: general.alignment is {alignment}")
    header.data_start = -(-cur.pos // alignment) * alignment
    for tensor in header.tensors:
        if tensor.type_id not in quant_sizes:
            continue  # the caller names the unsupported type
        block, block_bytes = quant_sizes[tensor.type_id]
        elements = 1
        for dim in tensor.shape:
            elements *= dim
        end = header.data_start + tensor.offset + -(-elements // block) * block_bytes
        if end > size:
            raise GGUFError(
                f"{path} is truncated: tensor {tensor.name} ends at byte {end} but the file has {size} bytes"
            )
    return header
