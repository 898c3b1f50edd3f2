"""Our estimators, losses and KL estimators equal verl's core_algos on random inputs (within 1e-6).

Runs only where verl is installed (``nox -s verl-reference``); skipped cleanly elsewhere. Inputs are
float64 so the comparison checks the definitions, not float32 rounding.

Deliberate differences, each pinned by a test below:
- Singleton groups: verl's loop implementations of GRPO, RLOO and REINFORCE++-baseline use a
  baseline of 0 for a group of one, so the raw score becomes the advantage, on a different scale
  from every normalised group beside it. A group of one has nothing to compare against, so ours
  gives 0 (its reward is its own baseline), which is also what verl's own rloo_vectorized does.
- ``ppo_clip`` is PPO without dual-clip; verl's "vanilla" loss always dual-clips, so ppo_clip is
  compared with vanilla at an unreachable ``clip_ratio_c`` and ``dual_clip`` with vanilla at c.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from rllm.algos import AlgorithmConfig, RewardBatch, get_estimator  # noqa: E402
from rllm.algos.losses import compute_policy_loss, kl_penalty  # noqa: E402

pytestmark = pytest.mark.verl
TOL = 1e-6
AGGREGATIONS = [
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]


@st.composite
def outcome_batches(draw, min_group: int = 2):
    """Groups of outcome rewards as verl sees them: a score on the last response token."""
    sizes = draw(st.lists(st.integers(min_group, 8), min_size=1, max_size=10))
    n, width = sum(sizes), draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    binary = draw(st.booleans())
    scores = (
        rng.integers(0, 2, n).astype(np.float64)
        if binary
        else rng.normal(0, draw(st.sampled_from([0.1, 1, 5])), n)
    )
    lengths = rng.integers(1, width + 1, n)  # n >= 2, so at least two tokens (verl's whitening needs them)
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.float64)
    token_rewards = np.zeros((n, width))
    token_rewards[np.arange(n), lengths - 1] = scores
    group = np.repeat(np.arange(len(sizes)), sizes)
    perm = rng.permutation(n)  # verl's index need not be sorted, neither is ours
    return scores[perm], group[perm], token_rewards[perm], mask[perm], len(sizes)


def _uids(group: np.ndarray) -> np.ndarray:
    return np.array([f"uid-{g}" for g in group], dtype=object)


def _ours(name: str, scores, group, mask, num_groups, **cfg) -> np.ndarray:
    batch = RewardBatch(scores, group, num_groups, mask.sum(-1))
    return get_estimator(name).fn(batch, AlgorithmConfig(**cfg))[:, None] * mask


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


@settings(max_examples=60, deadline=None)
@given(outcome_batches())
def test_grpo_and_drgrpo_match_verl(batch) -> None:
    scores, group, token_rewards, mask, num_groups = batch
    for ours_name, by_std in (("grpo", True), ("drgrpo", False)):
        theirs, _ = core_algos.compute_grpo_outcome_advantage(
            _t(token_rewards), _t(mask), _uids(group), epsilon=1e-6, norm_adv_by_std_in_grpo=by_std
        )
        np.testing.assert_allclose(
            _ours(ours_name, scores, group, mask, num_groups), theirs.numpy(), atol=TOL, rtol=0
        )


@settings(max_examples=60, deadline=None)
@given(outcome_batches())
def test_rloo_matches_verl(batch) -> None:
    scores, group, token_rewards, mask, num_groups = batch
    theirs, _ = core_algos.compute_rloo_outcome_advantage(_t(token_rewards), _t(mask), _uids(group))
    np.testing.assert_allclose(
        _ours("rloo", scores, group, mask, num_groups), theirs.numpy(), atol=TOL, rtol=0
    )


@settings(max_examples=60, deadline=None)
@given(outcome_batches())
def test_reinforce_pp_baseline_matches_verl(batch) -> None:
    scores, group, token_rewards, mask, num_groups = batch
    theirs, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        _t(token_rewards), _t(mask), _uids(group)
    )
    ours = _ours("reinforce_pp_baseline", scores, group, mask, num_groups)
    np.testing.assert_allclose(ours, theirs.numpy(), atol=TOL, rtol=0)


def test_singleton_groups_differ_on_purpose() -> None:
    scores = np.array([1.0, 0.0, 1.0, 0.7])
    group = np.array([0, 0, 0, 1])  # group 1 has one member
    mask = np.ones((4, 1))
    loop, _ = core_algos.compute_rloo_outcome_advantage(_t(scores[:, None]), _t(mask), _uids(group))
    vectorized, _ = core_algos.compute_rloo_vectorized_outcome_advantage(
        _t(scores[:, None]), _t(mask), _uids(group)
    )
    grpo_loop, _ = core_algos.compute_grpo_outcome_advantage(_t(scores[:, None]), _t(mask), _uids(group))
    ours_rloo = _ours("rloo", scores, group, mask, 2)
    ours_grpo = _ours("grpo", scores, group, mask, 2)
    # Same for the real groups ...
    np.testing.assert_allclose(ours_rloo[:3], loop.numpy()[:3], atol=TOL)
    np.testing.assert_allclose(ours_grpo[:3], grpo_loop.numpy()[:3], atol=TOL)
    # ... and for the singleton verl's loops pass the raw score through while we (and verl's
    # vectorised RLOO) give 0: there is nothing in the group to compare against.
    assert loop.numpy()[3, 0] == pytest.approx(0.7)
    assert grpo_loop.numpy()[3, 0] == pytest.approx(0.7)
    assert ours_rloo[3, 0] == ours_grpo[3, 0] == vectorized.numpy()[3, 0] == 0.0


@st.composite
def loss_batches(draw):
    b, t = draw(st.integers(1, 6)), draw(st.integers(1, 10))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    logprobs = -rng.exponential(1.0, (b, t))
    old = logprobs + rng.normal(0, draw(st.sampled_from([0.05, 0.3, 1.0])), (b, t))
    ref = logprobs + rng.normal(0, 0.5, (b, t))
    adv = rng.normal(0, 1, (b, 1)).repeat(t, axis=1) if draw(st.booleans()) else rng.normal(0, 1, (b, t))
    mask = (rng.random((b, t)) < 0.7).astype(np.float64)
    mask[rng.integers(0, b), rng.integers(0, t)] = 1.0  # at least one trained token
    clip_low = draw(st.sampled_from([0.1, 0.2]))
    clip_high = draw(st.sampled_from([0.2, 0.28]))
    return logprobs, old, ref, adv, mask, clip_low, clip_high


def _verl_config(clip_low: float, clip_high: float, clip_c: float = 3.0) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=clip_low,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        clip_ratio_c=clip_c,
    )


def _compare(verl_fn, verl_cfg, ours_cfg: AlgorithmConfig, data, metric_keys) -> None:
    logprobs, old, _, adv, mask, _, _ = data
    lp_theirs = _t(logprobs).requires_grad_(True)
    loss_theirs, metrics_theirs = verl_fn(
        old_log_prob=_t(old),
        log_prob=lp_theirs,
        advantages=_t(adv),
        response_mask=_t(mask),
        loss_agg_mode=ours_cfg.aggregation,
        config=verl_cfg,
    )
    loss_theirs.backward()
    lp_ours = _t(logprobs).requires_grad_(True)
    loss_ours, metrics_ours = compute_policy_loss(lp_ours, _t(old), _t(adv), _t(mask), ours_cfg)
    loss_ours.backward()
    assert loss_ours.item() == pytest.approx(loss_theirs.item(), abs=TOL, rel=0)
    np.testing.assert_allclose(lp_ours.grad.numpy(), lp_theirs.grad.numpy(), atol=TOL, rtol=0)
    for ours_key, verl_key in metric_keys:
        assert metrics_ours[ours_key] == pytest.approx(metrics_theirs[verl_key], abs=TOL), ours_key


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@settings(max_examples=25, deadline=None)
@given(data=loss_batches())
def test_ppo_clip_and_dual_clip_match_verl_vanilla(aggregation: str, data) -> None:
    *_, clip_low, clip_high = data
    ours = AlgorithmConfig(loss="ppo_clip", clip_low=clip_low, clip_high=clip_high, aggregation=aggregation)
    keys = [("clip_frac", "actor/pg_clipfrac"), ("approx_kl", "actor/ppo_kl")]
    _compare(
        core_algos.compute_policy_loss_vanilla,
        _verl_config(clip_low, clip_high, clip_c=1e12),
        ours,
        data,
        keys,
    )
    ours = AlgorithmConfig(
        loss="dual_clip", clip_low=clip_low, clip_high=clip_high, dual_clip_c=3.0, aggregation=aggregation
    )
    keys.append(("clip_frac_lower", "actor/pg_clipfrac_lower"))
    _compare(
        core_algos.compute_policy_loss_vanilla,
        _verl_config(clip_low, clip_high, clip_c=3.0),
        ours,
        data,
        keys,
    )


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@settings(max_examples=25, deadline=None)
@given(data=loss_batches())
def test_gspo_matches_verl(aggregation: str, data) -> None:
    *_, clip_low, clip_high = data
    ours = AlgorithmConfig(loss="gspo", clip_low=clip_low, clip_high=clip_high, aggregation=aggregation)
    keys = [("clip_frac", "actor/pg_clipfrac"), ("approx_kl", "actor/ppo_kl")]
    _compare(core_algos.compute_policy_loss_gspo, _verl_config(clip_low, clip_high), ours, data, keys)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@settings(max_examples=25, deadline=None)
@given(data=loss_batches())
def test_cispo_matches_verl(aggregation: str, data) -> None:
    *_, clip_low, clip_high = data
    ours = AlgorithmConfig(loss="cispo", clip_low=clip_low, clip_high=clip_high, aggregation=aggregation)
    keys = [("clip_frac", "actor/pg_clipfrac"), ("approx_kl", "actor/ppo_kl")]
    _compare(core_algos.compute_policy_loss_cispo, _verl_config(clip_low, clip_high), ours, data, keys)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@settings(max_examples=40, deadline=None)
@given(data=loss_batches())
def test_kl_estimators_match_verl(estimator: str, data) -> None:
    logprobs, _, ref, *_ = data
    # Push a few log-ratios past k3's clamps so they are compared too.
    ref = ref.copy()
    ref.flat[0] = logprobs.flat[0] + 30.0
    ours = kl_penalty(_t(logprobs), _t(ref), estimator)
    theirs = core_algos.kl_penalty(_t(logprobs), _t(ref), estimator)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=TOL, rtol=0)
    assert math.isfinite(float(ours.sum()))
