"""rllm.tinker_api on its own (no service SDK): the aggregation weights equal rllm.algos'
aggregation (hypothesis), datums are shifted and carry only what their loss needs, and the custom
loss is rllm.algos' loss on the batch."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rllm.algos.config import AlgorithmConfig
from rllm.algos.losses import compute_policy_loss
from rllm.algos.losses.aggregation import aggregate
from rllm.tinker_api import LossPlan, make_custom_loss, plan_loss, to_datums, token_weights
from rllm.types import FloatArray, TokenArray, TrainSequence

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


class _Tensor:
    def __init__(self, values: np.ndarray) -> None:
        self.values = np.asarray(values)

    def to_torch(self) -> torch.Tensor:
        return torch.from_numpy(self.values.copy())


class _Types:
    """Stands in for an SDK's ``types`` module: records what a Datum is built from."""

    class ModelInput:
        @staticmethod
        def from_ints(ints: list[int]) -> list[int]:
            return list(ints)

    @staticmethod
    def Datum(model_input: list[int], loss_fn_inputs: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(
            model_input=model_input, loss_fn_inputs={k: _Tensor(v) for k, v in loss_fn_inputs.items()}
        )


def _seq(tokens: list[int], mask: list[float], advantage: float) -> TrainSequence:
    m = np.array(mask, dtype=np.float32)
    return TrainSequence(
        input_ids=TokenArray(np.array(tokens, dtype=np.int32)),
        loss_mask=FloatArray(m),
        advantages=FloatArray(m * advantage),
        sampler_logprobs=FloatArray(-m),
    )


masks = st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=7), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(masks, st.sampled_from(MODES), st.data())
def test_token_weights_turn_a_token_sum_into_the_aggregation(
    rows: list[list[float]], mode: str, data: st.DataObject
) -> None:
    assume(any(any(r) for r in rows))  # with no trained token rllm.algos' mean is 0/0
    algo = AlgorithmConfig(aggregation=mode)
    width = max(len(r) for r in rows)
    padded = np.array([r + [0.0] * (width - len(r)) for r in rows], dtype=np.float32)
    values = np.array(
        data.draw(st.lists(st.floats(-5, 5), min_size=padded.size, max_size=padded.size)), dtype=np.float32
    ).reshape(padded.shape)
    weights = token_weights([np.array(r, dtype=np.float32) for r in rows], algo)
    ours = sum(float((w * values[i, : len(w)]).sum()) for i, w in enumerate(weights))
    expected = aggregate(torch.from_numpy(values), torch.from_numpy(padded) > 0, mode)
    assert ours == pytest.approx(float(expected), rel=1e-4, abs=1e-4)


def test_datums_are_shifted_and_carry_what_their_loss_needs() -> None:
    batch = [_seq([5, 6, 7, 8], [0, 0, 1, 1], 2.0)]
    algo = AlgorithmConfig()
    (ppo,) = to_datums(batch, algo, plan_loss(algo), _Types)
    assert ppo.model_input == [5, 6, 7]
    assert ppo.loss_fn_inputs["target_tokens"].values.tolist() == [6, 7, 8]
    assert set(ppo.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
    dual = AlgorithmConfig(loss="dual_clip")
    (custom,) = to_datums(batch, dual, plan_loss(dual), _Types)
    assert set(custom.loss_fn_inputs) == {"target_tokens", "weights"}  # all Fireworks accepts
    assert custom.loss_fn_inputs["weights"].values.tolist() == [0.0, 1.0, 1.0]


def test_the_custom_loss_is_rllm_algos_loss_on_the_batch() -> None:
    batch = [_seq([1, 2, 3, 4], [0, 1, 1, 1], 1.0), _seq([4, 3, 2], [0, 0, 1], -0.5)]
    algo = AlgorithmConfig(loss="dual_clip", aggregation="seq-mean-token-mean")
    datums = to_datums(batch, algo, plan_loss(algo), _Types)
    logprobs = [torch.tensor([-0.3, -1.0, -2.0]), torch.tensor([-0.7, -0.1])]
    loss, _ = make_custom_loss(algo, batch)(datums, logprobs)
    lp = torch.tensor([[-0.3, -1.0, -2.0], [-0.7, -0.1, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    adv = mask * torch.tensor([[1.0], [-0.5]])
    old = -mask
    expected, _ = compute_policy_loss(lp, old, adv, mask, algo, sampler_logprobs=old)
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    with pytest.raises(ValueError, match="2"):
        make_custom_loss(algo, batch)(datums[:1], logprobs[:1])


def test_the_loss_plan_is_the_losses_own_declaration() -> None:
    """Which Tinker built-in runs a loss, and whether it gets the clip thresholds, is read off its
    LossSpec (``tinker_loss``, ``clips_ratio``): a registered loss is planned like a built-in."""
    from rllm.algos.registry import register_loss, unregister_loss
    from rllm.tinker_api import BUILTIN_LOSSES, unsupported_algo_options

    def mine(logprobs, old_logprobs, advantages, mask, config):
        return -advantages * logprobs, {}

    assert plan_loss(AlgorithmConfig(loss="ppo_clip", clip_low=0.1, clip_high=0.3)) == LossPlan(
        "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.3}
    )
    assert plan_loss(AlgorithmConfig(loss="importance_sampling")) == LossPlan("importance_sampling", None)
    assert plan_loss(AlgorithmConfig(loss="dual_clip")) == LossPlan("custom", None)
    assert BUILTIN_LOSSES["ppo_clip"] == "ppo" and "dual_clip" not in BUILTIN_LOSSES

    register_loss("plan_twin", clips_ratio=True, tinker_loss="cispo")(mine)
    register_loss("plan_clipped", clips_ratio=True)(mine)
    register_loss("plan_plain")(mine)
    try:
        twin = AlgorithmConfig(loss="plan_twin", tis="trust_region")
        assert plan_loss(twin) == LossPlan("cispo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
        assert unsupported_algo_options(twin, "svc") == []
        clipped = AlgorithmConfig(loss="plan_clipped", tis="trust_region")
        assert plan_loss(clipped) == LossPlan("custom", None)  # run client-side, as dual_clip
        assert unsupported_algo_options(clipped, "svc") == []
        assert plan_loss(AlgorithmConfig(loss="plan_plain")) == LossPlan("custom", None)
    finally:
        for name in ("plan_twin", "plan_clipped", "plan_plain"):
            unregister_loss(name)
