"""Policy losses, KL, TIS and aggregation on hand-computed cases."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rllm.algos import AlgorithmConfig  # noqa: E402
from rllm.algos.losses import LossInputError, aggregate, compute_policy_loss, kl_penalty, tis_weights  # noqa: E402


def _one_token(ratio: float, adv: float, **cfg):
    lp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    loss, metrics = compute_policy_loss(
        lp, old, torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1), AlgorithmConfig(**cfg)
    )
    return loss.item(), metrics


@pytest.mark.parametrize(
    ("ratio", "adv", "cfg", "expected", "clipped"),
    [
        (1.5, 1.0, {}, -1.2, 1.0),  # too far up with A>0: clipped at 1+0.2
        (1.5, 1.0, {"clip_high": 0.28}, -1.28, 1.0),  # clip-higher
        (0.5, 1.0, {}, -0.5, 0.0),  # below the band with A>0: pessimistic unclipped term
        (0.5, -1.0, {}, 0.8, 1.0),  # below the band with A<0: clipped at 1-0.2
        (0.5, -1.0, {"clip_low": 0.1}, 0.9, 1.0),  # asymmetric lower bound
        (5.0, -1.0, {}, 5.0, 0.0),  # ppo_clip alone does not bound A<0 with a huge ratio
        (5.0, -1.0, {"loss": "dual_clip"}, 3.0, 0.0),  # ... dual-clip caps it at c * |A|
        (5.0, -1.0, {"loss": "importance_sampling"}, 5.0, None),
        (5.0, -1.0, {"loss": "cispo"}, 1.2 * math.log(5.0), 1.0),  # -sg(clip(r)) * A * log pi
    ],
)
def test_single_token_values(ratio, adv, cfg, expected, clipped) -> None:
    value, metrics = _one_token(ratio, adv, **cfg)
    assert value == pytest.approx(expected)
    if clipped is not None:
        assert metrics["clip_frac"] == clipped
    if cfg.get("loss") == "dual_clip":
        assert metrics["clip_frac_lower"] == 1.0
    assert metrics["approx_kl"] == pytest.approx(-math.log(ratio))


def test_cispo_gradient_flows_through_clipped_tokens() -> None:
    lp = torch.tensor([[math.log(5.0)]], dtype=torch.float64, requires_grad=True)
    loss, _ = compute_policy_loss(
        lp,
        torch.zeros(1, 1, dtype=torch.float64),
        torch.tensor([2.0], dtype=torch.float64),
        torch.ones(1, 1),
        AlgorithmConfig(loss="cispo"),
    )
    loss.backward()
    assert lp.grad.item() == pytest.approx(-1.2 * 2.0)
    lp.grad = None
    loss, _ = compute_policy_loss(
        lp,
        torch.zeros(1, 1, dtype=torch.float64),
        torch.tensor([2.0], dtype=torch.float64),
        torch.ones(1, 1),
        AlgorithmConfig(loss="ppo_clip"),
    )
    loss.backward()
    assert lp.grad.item() == 0.0  # PPO gives no gradient once clipped


def test_gspo_uses_sequence_geometric_mean_ratio() -> None:
    lp = torch.tensor([[0.1, 0.3, 9.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = compute_policy_loss(
        lp, old, torch.tensor([1.0], dtype=torch.float64), mask, AlgorithmConfig(loss="gspo", clip_high=0.5)
    )
    seq_ratio = math.exp((0.1 + 0.3) / 2)  # masked token excluded
    assert loss.item() == pytest.approx(-seq_ratio)
    loss.backward()
    assert lp.grad.tolist()[0] == pytest.approx([-seq_ratio / 2, -seq_ratio / 2, 0.0])
    assert metrics["clip_frac"] == 0.0


def test_cross_entropy_is_masked_nll_without_old_or_advantages() -> None:
    lp = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    loss, _ = compute_policy_loss(
        lp, None, None, torch.tensor([[1, 0], [1, 1]]), AlgorithmConfig(loss="cross_entropy")
    )
    assert loss.item() == pytest.approx((1 + 3 + 4) / 3)


def _loops(loss_mat, mask, mode, scale=None):
    seqs = [[loss_mat[b][t] for t in range(len(mask[b])) if mask[b][t]] for b in range(len(mask))]
    tokens = [x for s in seqs for x in s]
    nonempty = [s for s in seqs if s]
    if mode == "token-mean":
        return sum(tokens) / len(tokens)
    if mode == "token-sum":
        return sum(tokens)
    if mode == "seq-mean-token-sum":
        return sum(sum(s) for s in nonempty) / len(nonempty)
    if mode == "seq-mean-token-mean":
        return sum(sum(s) / len(s) for s in nonempty) / len(nonempty)
    return sum(sum(s) for s in nonempty) / len(nonempty) / (scale or len(mask[0]))


@pytest.mark.parametrize(
    "mode",
    ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"],
)
@pytest.mark.parametrize("scale", [None, 7.0])
def test_aggregation_modes(mode: str, scale) -> None:
    g = torch.Generator().manual_seed(3)
    loss_mat = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=g) > 0.4
    mask[2] = False  # a sequence without trained tokens does not count
    mask[0, 0] = True
    got = aggregate(loss_mat, mask, mode, loss_scale_factor=scale).item()
    assert got == pytest.approx(_loops(loss_mat.tolist(), mask.tolist(), mode, scale))


def test_global_denominators_make_microbatches_add_up() -> None:
    g = torch.Generator().manual_seed(4)
    loss_mat = torch.randn(6, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(6, 5, generator=g) > 0.3
    mask[:, 0] = True
    full = aggregate(loss_mat, mask, "token-mean")
    n = float(mask.sum())
    parts = aggregate(loss_mat[:3], mask[:3], "token-mean", num_tokens=n) + aggregate(
        loss_mat[3:], mask[3:], "token-mean", num_tokens=n
    )
    assert parts.item() == pytest.approx(full.item())
    full = aggregate(loss_mat, mask, "seq-mean-token-mean")
    parts = aggregate(loss_mat[:2], mask[:2], "seq-mean-token-mean", num_sequences=6.0) + aggregate(
        loss_mat[2:], mask[2:], "seq-mean-token-mean", num_sequences=6.0
    )
    assert parts.item() == pytest.approx(full.item())


def test_kl_estimators() -> None:
    lp = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    ref = torch.tensor([-1.5, -1.0], dtype=torch.float64)
    d = lp - ref
    assert kl_penalty(lp, ref, "k1").tolist() == pytest.approx(d.tolist())
    assert kl_penalty(lp, ref, "k2").tolist() == pytest.approx((0.5 * d * d).tolist())
    k3 = [math.exp(-x) - 1 + x for x in d.tolist()]
    assert kl_penalty(lp, ref, "k3").tolist() == pytest.approx(k3)
    assert (kl_penalty(torch.randn(100), torch.randn(100), "k3") >= 0).all()


def test_kl_penalty_added_with_coefficient() -> None:
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    base, _ = compute_policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), AlgorithmConfig())
    with_kl, metrics = compute_policy_loss(
        lp,
        lp,
        torch.tensor([1.0]),
        torch.ones(1, 2),
        AlgorithmConfig(kl_coef=0.1, kl_estimator="k1"),
        ref_logprobs=ref,
    )
    assert with_kl.item() == pytest.approx(base.item() + 0.1 * (0.5 - 1.0) / 2)
    assert metrics["kl"] == pytest.approx(-0.25)


def test_tis_weights_token_and_sequence() -> None:
    old = torch.tensor([[0.0, 0.0, 0.0]])
    rollout = torch.tensor([[-0.1, -2.0, 0.5]])
    mask = torch.tensor([[True, True, False]])
    w, capped = tis_weights(old, rollout, mask, "token", 2.0)
    assert w[0, :2].tolist() == pytest.approx([math.exp(0.1), 2.0])
    assert capped[0].tolist()[:2] == [False, True]
    w, _ = tis_weights(old, rollout, mask, "sequence", 100.0)
    assert w[0].tolist() == pytest.approx([math.exp(2.1)] * 3)  # masked token's ratio not included


def test_tis_reweights_policy_loss() -> None:
    lp = torch.zeros(1, 2)
    loss, metrics = compute_policy_loss(
        lp,
        lp,
        torch.tensor([1.0]),
        torch.ones(1, 2),
        AlgorithmConfig(tis="token", tis_cap=1.5),
        sampler_logprobs=torch.tensor([[-0.2, -3.0]]),
    )
    assert loss.item() == pytest.approx(-(math.exp(0.2) + 1.5) / 2)
    assert metrics["tis/capped_frac"] == 0.5


def test_masked_tokens_never_contribute_even_when_nan() -> None:
    g = torch.Generator().manual_seed(5)
    lp = torch.randn(3, 4, generator=g, dtype=torch.float64) - 1
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]])
    args = {"old": lp + 0.1, "adv": torch.randn(3, 4, generator=g, dtype=torch.float64), "ref": lp - 0.2}
    for loss_name in ("ppo_clip", "dual_clip", "gspo", "cispo", "importance_sampling", "cross_entropy"):
        cfg = AlgorithmConfig(
            loss=loss_name, kl_coef=0.05, aggregation="seq-mean-token-mean", entropy_coef=0.01
        )
        results = []
        for fill in (0.0, float("nan"), float("inf")):
            x = lp.clone().masked_fill(mask == 0, fill).requires_grad_(True)
            poisoned = {k: v.masked_fill(mask == 0, fill) for k, v in args.items()}
            loss, _ = compute_policy_loss(
                x,
                poisoned["old"],
                poisoned["adv"],
                mask,
                cfg,
                ref_logprobs=poisoned["ref"],
                entropy=torch.ones(3, 4).masked_fill(mask == 0, fill),
            )
            loss.backward()
            assert torch.isfinite(x.grad).all()
            assert (x.grad[mask == 0] == 0).all(), loss_name
            results.append((loss.item(), x.grad.clone()))
        assert results[0][0] == results[1][0] == results[2][0]
        assert torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"logprobs": torch.zeros(2, 4)}, r"`logprobs` has shape \(2, 4\), expected \(2, 3\)"),
        (
            {"old": torch.tensor([[0.0, float("nan"), 0.0], [0.0] * 3])},
            r"`old_logprobs` is nan at trained token \[0, 1\]",
        ),
        ({"adv": torch.tensor([1.0, 2.0, 3.0])}, "one per sequence"),
        (
            {"adv": torch.tensor([[float("inf")] * 3, [0.0] * 3])},
            r"`advantages` is inf at trained token \[0, 0\]",
        ),
        ({"mask": torch.zeros(2, 3)}, "selects no trained token"),
        ({"mask": torch.full((2, 3), 0.5)}, "only 0 and 1"),
        ({"mask": torch.ones(0, 3), "logprobs": torch.zeros(0, 3)}, "empty batch"),
        ({"logprobs": torch.zeros(2, 3, dtype=torch.long)}, "floating-point"),
        ({"config": AlgorithmConfig(kl_coef=0.1)}, "`ref_logprobs` is required"),
        ({"config": AlgorithmConfig(tis="sequence")}, "`sampler_logprobs` is required"),
    ],
)
def test_bad_input_named(change: dict, message: str) -> None:
    args = {
        "logprobs": torch.zeros(2, 3),
        "old": torch.zeros(2, 3),
        "adv": torch.ones(2),
        "mask": torch.ones(2, 3),
        "config": AlgorithmConfig(),
    }
    args.update(change)
    with pytest.raises(ValueError, match=message):
        compute_policy_loss(args["logprobs"], args["old"], args["adv"], args["mask"], args["config"])


def test_loss_input_error_is_a_value_error() -> None:
    assert issubclass(LossInputError, ValueError)
