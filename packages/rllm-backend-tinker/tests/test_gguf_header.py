"""The GGUF header reader (rllm.backends.tinker.gguf_header): the same header the gguf package's
own reader sees on a real file, and for any damaged, truncated or forged file one GGUFError,
never another exception, a hang or a huge allocation."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm.backends.tinker.gguf_header import GGUFArray, GGUFError, read_header
from rllm.testing.gguf_files import write_tiny_llama

SIZES = {int(t): size for t, size in gguf.GGML_QUANT_SIZES.items()}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tensor_type="Q4_1")
    return path.read_bytes()


def _read(data: bytes) -> object:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.gguf"
        path.write_bytes(data)
        return read_header(path, SIZES)


def test_the_header_is_what_the_gguf_packages_reader_sees(tiny: bytes, tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny)
    header = read_header(path, SIZES)
    reference = gguf.GGUFReader(path)
    assert [(t.name, t.type_id) for t in header.tensors] == [
        (t.name, int(t.tensor_type)) for t in reference.tensors
    ]
    assert [header.data_start + t.offset for t in header.tensors] == [
        t.data_offset for t in reference.tensors
    ]
    assert [tuple(t.shape) for t in header.tensors] == [
        tuple(int(d) for d in t.shape) for t in reference.tensors
    ]
    fields = {k: v for k, v in reference.fields.items() if not k.startswith("GGUF.")}
    assert set(header.metadata) == set(fields)
    assert header.string("general.architecture") == "llama"
    assert header.string("tokenizer.chat_template") == fields["tokenizer.chat_template"].contents()
    tokens = header.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, GGUFArray) and tokens.count == len(fields["tokenizer.ggml.tokens"].contents())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=10**9))
def test_every_truncation_before_the_last_tensors_end_is_refused(tiny: bytes, cut: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        full = Path(folder) / "full.gguf"
        full.write_bytes(tiny)
        header = read_header(full, SIZES)
    last = max(header.tensors, key=lambda t: t.offset)
    block, block_bytes = SIZES[last.type_id]
    elements = 1
    for dim in last.shape:
        elements *= dim
    end = header.data_start + last.offset + elements // block * block_bytes
    length = 4 + cut % (end - 4)  # past the magic, short of the last tensor's end
    with pytest.raises(GGUFError, match=r"truncated|damaged"):
        _read(tiny[:length])


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=4096))
def test_any_bytes_after_the_magic_read_as_a_header_or_one_gguf_error(body: bytes) -> None:
    try:
        _read(b"GGUF" + body)
    except GGUFError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(min_value=4, max_value=600), value=st.integers(min_value=0, max_value=2**64 - 1))
def test_a_forged_count_or_length_is_refused_without_reading_past_the_file(
    tiny: bytes, at: int, value: int
) -> None:
    """A u64 overwritten anywhere in the header (a count, a length, a shape): read or refused."""
    forged = tiny[:at] + struct.pack("<Q", value) + tiny[at + 8 :]
    try:
        _read(forged)
    except GGUFError:
        pass


def test_forged_counts_are_refused_by_name() -> None:
    head = b"GGUF" + struct.pack("<I", 3)
    with pytest.raises(GGUFError, match="the metadata runs past the end"):
        _read(head + struct.pack("<QQ", 0, 2**63) + bytes(16))
    with pytest.raises(GGUFError, match="the tensor table runs past the end"):
        _read(head + struct.pack("<QQ", 2**40, 0) + bytes(16))
    with pytest.raises(GGUFError, match="only versions 2 and 3"):
        _read(b"GGUF" + struct.pack("<I", 7) + bytes(32))
    with pytest.raises(GGUFError, match="not a GGUF file"):
        _read(b"GGML" + bytes(32))
