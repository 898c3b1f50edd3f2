"""Estimators against a plain per-group reference written with the statistics module."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.algos import AlgorithmConfig, AlgorithmInputError, RewardBatch, get_estimator

EPS = 1e-6


def _reference(name: str, groups: list[list[float]], tokens: list[list[float]]) -> list[float]:
    out: list[float] = []
    for g in groups:
        n, mean = len(g), statistics.fmean(g)
        for r in g:
            if name == "grpo":
                out.append(0.0 if n == 1 else (r - mean) / (statistics.stdev(g) + EPS))
            elif name == "drgrpo":
                out.append(r - mean)
            elif name == "rloo":
                out.append(0.0 if n == 1 else r - (sum(g) - r) / (n - 1))
            elif name == "reinforce":
                out.append(r)
            elif name == "reinforce_pp_baseline":
                out.append(r - mean)
    if name == "reinforce_pp_baseline":  # token-weighted whitening over the batch
        w = [t for ts in tokens for t in ts]
        total = sum(w)
        m = sum(wi * a for wi, a in zip(w, out, strict=True)) / total
        var = sum(wi * (a - m) ** 2 for wi, a in zip(w, out, strict=True)) / (total - 1) if total > 1 else 0.0
        out = [(a - m) / (var + 1e-8) ** 0.5 for a in out]
    if name == "batch_norm":
        flat = [r for g in groups for r in g]
        mean = statistics.fmean(flat)
        std = statistics.stdev(flat) if len(flat) > 1 else 0.0
        out = [(r - mean) / (std + EPS) for r in flat]
    return out


groups_strategy = st.lists(
    st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=1, max_size=9), min_size=1, max_size=12
)


@pytest.mark.parametrize(
    "name", ["grpo", "drgrpo", "rloo", "reinforce", "reinforce_pp_baseline", "batch_norm"]
)
@settings(max_examples=60, deadline=None)
@given(groups=groups_strategy, data=st.data())
def test_matches_per_group_reference(name: str, groups: list[list[float]], data) -> None:
    tokens = [[float(data.draw(st.integers(1, 20))) for _ in g] for g in groups]
    # Shuffle rows: estimators must not assume a group's rows are adjacent.
    n = sum(len(g) for g in groups)
    perm = np.array(data.draw(st.permutations(range(n))))
    rewards = np.array([r for g in groups for r in g])
    index = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    flat_tokens = np.array([t for ts in tokens for t in ts])
    batch = RewardBatch(rewards[perm], index[perm], len(groups), flat_tokens[perm])
    got = get_estimator(name).fn(batch, AlgorithmConfig())
    expected = np.array(_reference(name, groups, tokens))[perm]
    np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-6)


def test_grpo_known_values() -> None:
    batch = RewardBatch(np.array([1.0, 0.0, 1.0, 0.0, 5.0]), np.array([0, 0, 0, 0, 1]), 2)
    got = get_estimator("grpo").fn(batch, AlgorithmConfig())
    s = np.std([1, 0, 1, 0], ddof=1)
    np.testing.assert_allclose(
        got, [0.5 / (s + EPS), -0.5 / (s + EPS), 0.5 / (s + EPS), -0.5 / (s + EPS), 0.0]
    )


def test_constant_groups_give_zero_not_nan() -> None:
    batch = RewardBatch(np.array([3.0, 3.0, 3.0]), np.zeros(3, dtype=np.int64), 1)
    for name in ("grpo", "drgrpo", "rloo", "reinforce_pp_baseline", "batch_norm"):
        assert np.all(get_estimator(name).fn(batch, AlgorithmConfig()) == 0.0), name


def test_group_relative_advantages_sum_to_zero_per_group() -> None:
    rng = np.random.default_rng(0)
    index = rng.integers(0, 50, size=400)
    batch = RewardBatch(rng.random(400), index, 50)
    for name in ("grpo", "drgrpo", "rloo"):
        adv = get_estimator(name).fn(batch, AlgorithmConfig())
        np.testing.assert_allclose(np.bincount(index, weights=adv, minlength=50), 0.0, atol=1e-9)


@pytest.mark.parametrize(
    ("rewards", "group", "message"),
    [
        ([], [], "empty batch"),
        ([1.0, float("nan")], [0, 0], "row 1"),
        ([1.0, 2.0], [0], "shapes"),
        ([1.0, 2.0], [0, 3], "group indices"),
    ],
)
def test_bad_batches(rewards, group, message) -> None:
    with pytest.raises(AlgorithmInputError, match=message):
        RewardBatch(np.array(rewards), np.array(group, dtype=np.int64), 2)


def test_from_group_ids_accepts_strings() -> None:
    batch = RewardBatch.from_group_ids(np.array([1.0, 2.0, 3.0]), np.array(["b", "a", "b"]))
    assert batch.num_groups == 2
    assert batch.group[0] == batch.group[2] != batch.group[1]
