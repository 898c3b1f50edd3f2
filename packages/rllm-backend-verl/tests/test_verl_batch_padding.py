"""Batches of any size on verl's fixed splits: padding rows that train nothing (actor.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

from verl_helpers import sequence

from rllm.backends.verl.actor import Batching, _with_rows, mini_batch_layout
from rllm.backends.verl.convert import to_data_proto

pytestmark = pytest.mark.verl


@pytest.mark.parametrize(
    ("size", "mini_batches", "multiple", "layout"),
    [
        (4, 1, 2, [0, 1, 2, 3]),
        (3, 1, 2, [0, 1, 2, None]),
        (5, 2, 2, [0, 1, 2, None, 3, 4, None, None]),
        (2, 4, 1, [0, 1]),  # never a mini-batch of padding alone
        (7, 2, 4, [0, 1, 2, 3, 4, 5, 6, None]),
    ],
)
def test_rows_split_evenly_into_aligned_mini_batches(size, mini_batches, multiple, layout) -> None:
    assert mini_batch_layout(size, mini_batches, multiple) == layout


def test_padding_rows_train_nothing() -> None:
    data = to_data_proto(
        [sequence([10, 11, 12], [0, 1, 1], 1.0, "a"), sequence([10, 13], [0, 1], -1.0, "b")], pad_token_id=0
    )
    padded = _with_rows(data, [0, 1, None, None])
    assert len(padded) == 4 and list(padded.non_tensor_batch["uid"]) == ["a", "b", "a", "a"]
    assert padded.batch["response_mask"][2:].sum() == 0 and padded.batch["advantages"][2:].abs().sum() == 0
    assert data.batch["response_mask"].sum() == 3  # the real rows are untouched


def test_the_multiples_follow_ranks_and_micro_batches() -> None:
    batching = Batching(dp_size=2, micro_batch_size=4, log_prob_micro_batch_size=8)
    assert (batching.train_multiple, batching.infer_multiple) == (8, 16)
    assert Batching(dp_size=2, micro_batch_size=4, dynamic=True).train_multiple == 2
    with pytest.raises(ValueError, match="cannot lay out 0 rows"):
        mini_batch_layout(0, 1, 1)
