"""``tis = "trust_region"``: the loss's clip taken around the sampler's policy (stale samples).

The reference is numpy: PPO-clip and CISPO written out per token with the ratio pi_theta /
pi_sampler, token-mean aggregated, and their gradients with respect to log pi_theta in closed form.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from rllm.algos import AlgorithmConfig  # noqa: E402
from rllm.algos.losses import compute_policy_loss  # noqa: E402
from rllm.types.errors import ConfigError  # noqa: E402

_LOGPROB = st.floats(min_value=-6.0, max_value=0.0, allow_nan=False, width=64)
_ADV = st.floats(min_value=-3.0, max_value=3.0, allow_nan=False, width=64)


def _reference(lp: np.ndarray, sampler: np.ndarray, adv: np.ndarray, mask: np.ndarray, loss: str):
    """(token-mean loss, d loss / d lp) in numpy, ratio r = exp(lp - sampler), clip [0.8, 1.2]."""
    r = np.exp(lp - sampler)
    clipped = np.clip(r, 0.8, 1.2)
    n = mask.sum()
    if loss == "ppo_clip":
        unclipped_term, clipped_term = -adv * r, -adv * clipped
        per_token = np.maximum(unclipped_term, clipped_term)
        # the max picks the unclipped term (gradient -A r) unless the clipped one is strictly larger
        grad = np.where(clipped_term > unclipped_term, 0.0, -adv * r)
    else:  # cispo: -sg(clip(r)) * A * log pi
        per_token = -clipped * adv * lp
        grad = -clipped * adv
    return float((per_token * mask).sum() / n), grad * mask / n


def _ours(lp: np.ndarray, old: np.ndarray, sampler: np.ndarray, adv: np.ndarray, mask: np.ndarray, loss: str):
    x = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    value, metrics = compute_policy_loss(
        x,
        torch.tensor(old, dtype=torch.float64),
        torch.tensor(adv, dtype=torch.float64),
        torch.tensor(mask),
        AlgorithmConfig(loss=loss, tis="trust_region"),
        sampler_logprobs=torch.tensor(sampler, dtype=torch.float64),
    )
    value.backward()
    assert x.grad is not None
    return value.item(), x.grad.numpy(), metrics


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(_LOGPROB, _LOGPROB, _LOGPROB, _ADV, st.booleans()), min_size=1, max_size=12),
    loss=st.sampled_from(["ppo_clip", "cispo"]),
)
def test_trust_region_matches_the_numpy_reference(rows, loss: str) -> None:
    rows[0] = (*rows[0][:4], True)  # at least one trained token
    lp, old, sampler, adv, keep = (np.array([[r[i] for r in rows]]) for i in range(5))
    mask = keep.astype(bool)
    value, grad, metrics = _ours(lp, old, sampler, adv, mask, loss)
    want_value, want_grad = _reference(lp, sampler, adv, mask, loss)
    # float64 throughout; ties of r with the clip bounds have measure zero under these draws
    assert value == pytest.approx(want_value, rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-9, atol=1e-12)
    want_ratio = float((np.exp(lp - sampler) * mask).sum() / mask.sum())
    assert metrics["tis/ratio_mean"] == pytest.approx(want_ratio, rel=1e-9)


@pytest.mark.parametrize(
    ("now", "adv", "grad"),
    [
        # The last update raised a good token from p=0.5 to 0.9 (ratio 1.8 > 1.2): no further push,
        # where token TIS would push it with weight min(1.8, cap 2).
        (math.log(0.9), 1.0, 0.0),
        # ... and lowered a bad one from 0.5 to 0.1 (ratio 0.2 < 0.8): no further push either.
        (math.log(0.1), -1.0, 0.0),
        # Inside the region the step is the importance-weighted policy gradient: -A * ratio.
        (math.log(0.55), 1.0, -1.1),
        (math.log(0.55), -1.0, 1.1),
    ],
)
def test_a_stale_token_already_moved_past_the_clip_gets_no_push(now: float, adv: float, grad: float) -> None:
    sampler = np.array([[math.log(0.5)]])
    # One update per batch: pi_old is the current policy, so without the trust region the ratio is 1.
    _, ours, _ = _ours(
        np.array([[now]]), np.array([[now]]), sampler, np.array([[adv]]), np.ones((1, 1), bool), "ppo_clip"
    )
    assert ours[0, 0] == pytest.approx(grad)


def test_token_tis_pushes_the_already_raised_token_harder() -> None:
    """The behaviour trust_region replaces: token TIS on the same stale token (ratio 1.8)."""
    lp = torch.tensor([[math.log(0.9)]], dtype=torch.float64, requires_grad=True)
    loss, _ = compute_policy_loss(
        lp,
        lp.detach(),
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 1),
        AlgorithmConfig(tis="token"),
        sampler_logprobs=torch.tensor([[math.log(0.5)]], dtype=torch.float64),
    )
    loss.backward()
    assert lp.grad is not None and lp.grad.item() == pytest.approx(-1.8)


@pytest.mark.parametrize("loss", ["importance_sampling", "cross_entropy"])
def test_trust_region_needs_a_loss_that_clips(loss: str) -> None:
    with pytest.raises(ConfigError, match="`tis`"):
        AlgorithmConfig(loss=loss, tis="trust_region")


def test_trust_region_needs_the_sampler_logprobs() -> None:
    with pytest.raises(ValueError, match="`sampler_logprobs` is required"):
        compute_policy_loss(
            torch.zeros(1, 2),
            torch.zeros(1, 2),
            torch.ones(1),
            torch.ones(1, 2),
            AlgorithmConfig(tis="trust_region"),
        )
