"""pass@k: the unbiased estimator against brute-force enumeration of k-subsets."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllm.engine.pass_at_k import mean_pass_at_k, pass_at_k


def brute_force(n: int, c: int, k: int) -> float:
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_matches_enumeration(args):
    n, c, k = args
    assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k))


def test_edges_and_errors():
    assert (
        pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0 and pass_at_k(10, 1, 1) == pytest.approx(0.1)
    )
    with pytest.raises(ValueError, match="k <= attempts"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="correct <= attempts"):
        pass_at_k(3, 4, 1)
    assert mean_pass_at_k([(4, 2), (4, 0)], 2) == pytest.approx((1 - 1 / 6) / 2)
