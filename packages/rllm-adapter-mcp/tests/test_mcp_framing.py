"""The host's framing of a sandboxed MCP server's stdout (``LineFramer``), property-tested: any
split of the stream into chunks gives the same lines, and no line, nor unterminated rest, over
the bound ever passes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rllm_adapter_mcp.sandboxed import LineFramer, Oversized

LIMIT = 64
lines_st = st.lists(st.binary(max_size=LIMIT).map(lambda b: b.replace(b"\n", b"")), max_size=12)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def fed(framer: LineFramer, chunks: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for chunk in chunks:
        out += framer.feed(chunk)
    return out


@given(
    lines_st, st.binary(max_size=LIMIT).map(lambda b: b.replace(b"\n", b"")), st.lists(st.integers(0, 10**6))
)
def test_any_chunking_gives_the_same_lines(lines: list[bytes], rest: bytes, cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines) + rest
    assert fed(LineFramer(LIMIT), chunked(data, cuts)) == lines  # the unterminated rest is held


@given(lines_st, st.integers(LIMIT + 1, 4 * LIMIT), st.booleans(), st.lists(st.integers(0, 10**6)))
def test_nothing_over_the_bound_passes(lines: list[bytes], size: int, ended: bool, cuts: list[int]) -> None:
    big = b"x" * size + (b"\n" if ended else b"")
    data = b"".join(line + b"\n" for line in lines) + big + b"after\n"
    framer, seen = LineFramer(LIMIT), []
    with pytest.raises(Oversized, match=f"max_message_bytes={LIMIT}"):
        for chunk in chunked(data, cuts):
            seen += framer.feed(chunk)
    assert seen == lines[: len(seen)] and all(len(line) <= LIMIT for line in seen)
