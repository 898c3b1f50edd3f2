"""The local sampler's token draws: unseeded rows are exact draws from the sampling distribution
(the one whose logprobs are reported), never outside the top-p nucleus; greedy rows take the
argmax; seeded rows stay reproducible."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.backends.tinker.local.sampling import RowSampling, inverse_cdf_draw, sample_next, sampling_logprobs

DRAWS = 4000


def frequencies(logits: torch.Tensor, row: RowSampling, draws: int = DRAWS) -> torch.Tensor:
    """Token frequencies of ``draws`` rows with the same logits and settings, in one call."""
    batch = logits.expand(draws, -1).clone()
    tokens = sample_next(batch, [row] * draws).tokens
    return torch.bincount(tokens, minlength=logits.shape[-1]).float() / draws


def test_unseeded_draws_follow_the_reported_distribution() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5, 3.0]])
    for temperature in (1.0, 0.7, 2.0):
        row = RowSampling(temperature, 1.0, None)
        expected = sampling_logprobs(logits, torch.tensor([temperature]), torch.tensor([1.0]))[0].exp()
        freq = frequencies(logits, row)
        # 4000 draws: each frequency's standard error is <= 0.008; 5 of them is far outside chance.
        assert torch.allclose(freq, expected, atol=0.04), (temperature, freq, expected)


def test_tokens_outside_the_nucleus_are_never_drawn() -> None:
    torch.manual_seed(1)
    logits = torch.tensor([[4.0, 3.5, 0.0, -2.0, -3.0, -9.0]])
    row = RowSampling(1.0, 0.8, None)
    logp = sampling_logprobs(logits, torch.tensor([1.0]), torch.tensor([0.8]))[0]
    freq = frequencies(logits, row)
    outside = torch.isinf(logp)
    assert bool(outside.any())
    assert float(freq[outside].sum()) == 0.0
    assert torch.allclose(freq[~outside], logp[~outside].exp(), atol=0.04)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(-20, 20), min_size=2, max_size=12),
    st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=6),
    st.floats(0.05, 1.0),
)
def test_each_drawn_token_has_a_finite_reported_logprob(logit_values, temperatures, top_p) -> None:
    logits = torch.tensor([logit_values] * len(temperatures))
    rows = [RowSampling(t, top_p, None) for t in temperatures]
    sampled = sample_next(logits, rows)
    assert all(math.isfinite(lp) for lp in sampled.logprobs.tolist())
    for i, t in enumerate(temperatures):
        if t == 0.0:  # greedy: a most likely token (logits closer than float32 can tell tie)
            logp = torch.log_softmax(logits[i].float(), dim=-1)
            assert float(logp[int(sampled.tokens[i])]) == float(logp.max())


def test_seeded_rows_repeat_and_mix_with_unseeded_rows() -> None:
    logits = torch.randn(3, 50)

    def draw() -> list[int]:
        rows = [
            RowSampling(1.0, 1.0, torch.Generator().manual_seed(7)),
            RowSampling(1.0, 1.0, None),
            RowSampling(0.0, 1.0, None),
        ]
        return sample_next(logits, rows).tokens.tolist()

    first, second = draw(), draw()
    assert first[0] == second[0]  # the seeded row
    assert first[2] == second[2] == int(logits[2].argmax())  # the greedy row


def test_a_draw_at_the_very_top_of_the_cumulative_sum_takes_the_last_likely_token(monkeypatch) -> None:
    """The inverse-CDF draw's edge: a uniform that lands on the row's total (float rounding makes
    it possible) must not fall through to a trailing token of probability 0."""
    logp = torch.log(torch.tensor([[0.5, 0.0, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25, 0.0]]))
    monkeypatch.setattr(torch, "rand", lambda shape, device=None: torch.ones(shape))
    assert inverse_cdf_draw(logp).tolist() == [2, 3]
