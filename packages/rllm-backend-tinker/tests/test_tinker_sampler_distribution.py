"""The local sampler's draws follow the model, on every path a row can take through a batch (#35
round 10). Logprobs that match the trainer's do not prove it: rows sharing a prefill could share
random numbers, a token could be taken from the wrong row after a join or a cache expand, or
top-p / temperature could apply to the wrong slice of a batch.

For fixed prompts, 2000 draws (1000 for (b)) of the first two tokens go through (a) batches whose rows share one
prefill (the gateway's n = 1 calls of a group, as prefetch releases them), (b) one request per
row, each its own batch, (c) rows joining a running batch (some of whose rows end at that very
step), (d) batches of several prompts, settings and request shapes (n = 16 beside n = 1 calls).
Each path's draws are compared with the model's own softmax (a plain forward pass, no cache),
for the first token and for the joint of the first two, at temperature 1 and at temperature
0.7 / top_p 0.9, by a chi-square test and a total-variation bound; and two rows of one batch
must agree as often as independent draws do (sum of p_i^2), no more.

Thresholds come from the statistics (a correct sampler fails a check with probability <= 1e-6),
and the global generator the unseeded rows draw from is seeded per check: nothing can flake.

Real parts: the tiny model built at test time (its final norm scaled so that its next-token
distributions are peaked and differ between prompts: a row mix-up shows), its SamplerEngine on
its own thread, a real event loop.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from rllm.backends.tinker.local.generation import GeneratedSequence, GenerationRequest, SamplerEngine
from rllm.backends.tinker.local.model import load_pretrained, load_tokenizer

DRAWS = 2000
ALPHA = 1e-6  # the false-alarm probability of each check for a correct sampler
LOGIT_SCALE = 8.0  # scales the final norm: logits x 8, so p(top token) is ~0.2-0.5, not ~0.04
MAX_BATCH = 64
# ~50 CPU seconds of sampling in all (most of it (b)'s 2000 one-row batches).
pytestmark = pytest.mark.slow

PROMPTS = {"A": "say: apple", "B": "say: river stone cloud tiger", "C": "say: lemon piano"}


@dataclass(frozen=True)
class Setting:
    temperature: float
    top_p: float


PLAIN = Setting(1.0, 1.0)  # what the configs use (rollout.sampling.temperature = 1)
NUCLEUS = Setting(0.7, 0.9)


@dataclass
class _Hold:
    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


class _GatedModel:
    """The model, whose next forward passes can be held: while one waits, the engine's thread
    is inside it, so what the test submits meanwhile is queued and reaches the engine together,
    at a known step (the next batch, or the running batch's next decode step)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.config = model.config
        self._holds: list[_Hold] = []

    def hold(self, passes: int) -> list[_Hold]:
        """Hold each of the next ``passes`` forward passes until its ``release`` is set."""
        self._holds = [_Hold() for _ in range(passes)]
        return list(self._holds)

    def __call__(self, **kwargs: Any) -> Any:
        if self._holds:
            hold = self._holds.pop(0)
            hold.started.set()
            assert hold.release.wait(60), "the test never released a held forward pass"
        return self.model(**kwargs)


@dataclass
class Sampler:
    engine: SamplerEngine
    gate: _GatedModel
    prompts: dict[str, list[int]]


@pytest.fixture(scope="module")
def sampler(tiny_model_path: Path) -> Iterator[Sampler]:
    model = load_pretrained(str(tiny_model_path), torch.float32, torch.device("cpu")).eval()
    with torch.no_grad():
        cast(Any, model).model.norm.weight.mul_(LOGIT_SCALE)
    tokenizer = load_tokenizer(str(tiny_model_path))
    gate = _GatedModel(model)
    engine = SamplerEngine(cast(torch.nn.Module, gate), tokenizer, torch.device("cpu"), max_batch=MAX_BATCH)
    engine.start()
    prompts = {k: list(tokenizer(t, add_special_tokens=False)["input_ids"]) for k, t in PROMPTS.items()}
    assert len({len(p) for p in prompts.values()}) == 3  # different lengths: left padding too
    try:
        yield Sampler(engine, gate, prompts)
    finally:
        engine.stop()


# The model's own distributions -------------------------------------------------------------------


def nucleus_probs(logits: torch.Tensor, setting: Setting) -> torch.Tensor:
    """softmax(logits / T) cut to the top-p nucleus (the fewest most likely tokens whose mass
    reaches top_p) and renormalised, per row: written out here, not the sampler's own function."""
    probs = torch.softmax(logits.double() / setting.temperature, dim=-1)
    if setting.top_p >= 1.0:
        return probs
    out = torch.zeros_like(probs)
    for r in range(probs.shape[0]):
        mass = 0.0
        for token in probs[r].argsort(descending=True).tolist():
            out[r, token] = probs[r, token]
            mass += float(probs[r, token])
            if mass >= setting.top_p:
                break
    return out / out.sum(-1, keepdim=True)


def model_joint(model: torch.nn.Module, prompt: list[int], setting: Setting) -> torch.Tensor:
    """p(t1, t2 | prompt) [V, V] by plain forward passes over the whole sequence (no KV cache,
    no padding, no batch neighbours): the first token's softmax times every t1's next one."""
    with torch.no_grad():
        first = model(input_ids=torch.tensor([prompt])).logits[:, -1]
        vocab = first.shape[-1]
        both = torch.tensor([[*prompt, t] for t in range(vocab)])
        second = model(input_ids=both).logits[:, -1]
    return nucleus_probs(first, setting)[0][:, None] * nucleus_probs(second, setting)


# Statistics ------------------------------------------------------------------------------------


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's goodness-of-fit p-value of ``counts`` against ``probs`` (flattened), cells whose
    expected count is under 5 pooled into one."""
    counts, probs = counts.flatten().double(), probs.flatten().double()
    n = float(counts.sum())
    expected = probs * n
    big = expected >= 5
    observed = [*counts[big].tolist(), float(counts[~big].sum())]
    wanted = [*expected[big].tolist(), float(expected[~big].sum())]
    if wanted[-1] == 0:
        observed, wanted = observed[:-1], wanted[:-1]
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, wanted, strict=True))
    dof = len(wanted) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def tv_bound(probs: torch.Tensor, n: int) -> float:
    """A bound the total variation between ``probs`` and the frequencies of n independent draws
    from it exceeds with probability <= ALPHA: E[TV] <= sum_i sqrt(p_i (1 - p_i) / n) / 2, and
    one draw moves TV by at most 1/n (McDiarmid: P(TV > E + t) <= exp(-2 n t^2))."""
    p = probs.flatten().double()
    mean = float((p * (1 - p) / n).sqrt().sum()) / 2
    return mean + math.sqrt(math.log(1 / ALPHA) / (2 * n))


def binomial_two_sided_p(k: int, n: int, q: float) -> float:
    """Exact two-sided binomial p-value (sum of the outcomes no more likely than k)."""

    def log_pmf(i: int) -> float:
        return (
            math.lgamma(n + 1)
            - math.lgamma(i + 1)
            - math.lgamma(n - i + 1)
            + i * math.log(q)
            + (n - i) * math.log1p(-q)
        )

    at_k = log_pmf(k)
    return min(1.0, sum(math.exp(log_pmf(i)) for i in range(n + 1) if log_pmf(i) <= at_k + 1e-9))


@dataclass
class Draws:
    """One prompt's draws: (t1, t2) per row, and disjoint pairs of rows that ran in one batch."""

    tokens: list[tuple[int, int]]
    pairs: list[tuple[tuple[int, int], tuple[int, int]]]


def check_follows_model(draws: Draws, joint: torch.Tensor, what: str) -> None:
    vocab = joint.shape[0]
    counts = torch.zeros(vocab, vocab, dtype=torch.float64)
    for t1, t2 in draws.tokens:
        counts[t1, t2] += 1
    n = len(draws.tokens)
    outside = float(counts[joint == 0].sum())
    assert outside == 0, f"{what}: {outside:.0f} draws outside the top-p nucleus"
    for name, c, p in (("first token", counts.sum(1), joint.sum(1)), ("two tokens", counts, joint)):
        tv = float((c / n - p).abs().sum()) / 2
        bound = tv_bound(p, n)
        assert tv <= bound, f"{what}, {name}: total variation {tv:.3f} > {bound:.3f} ({n} draws)"
        chi_p = chi_square_p(c, p)
        assert chi_p >= ALPHA, f"{what}, {name}: chi-square p = {chi_p:.2e} ({n} draws, TV {tv:.3f})"


def check_rows_independent(draws: Draws, joint: torch.Tensor, what: str) -> None:
    """Two rows of one batch agree as often as two independent draws (sum p_i^2), on the first
    token and on both: shared random numbers or a copied row would agree far more often."""
    assert len(draws.pairs) >= 500, what
    for name, q, same in (
        ("first token", float((joint.sum(1) ** 2).sum()), lambda a, b: a[0] == b[0]),
        ("two tokens", float((joint**2).sum()), lambda a, b: a == b),
    ):
        agree = sum(same(a, b) for a, b in draws.pairs)
        p = binomial_two_sided_p(agree, len(draws.pairs), q)
        assert p >= ALPHA, (
            f"{what}, {name}: rows of one batch agree {agree}/{len(draws.pairs)} times, "
            f"independent draws {q * len(draws.pairs):.1f} (p = {p:.2e})"
        )


# The paths -------------------------------------------------------------------------------------


def _request(prompt: list[int], setting: Setting, max_tokens: int = 2, n: int = 1) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=prompt,
        max_tokens=max_tokens,
        temperature=setting.temperature,
        top_p=setting.top_p,
        n=n,
        ignore_eos=True,  # every row draws exactly max_tokens tokens
    )


def _first_two(seq: GeneratedSequence) -> tuple[int, int]:
    assert len(seq.completion_ids) == 2
    return seq.completion_ids[0], seq.completion_ids[1]


def _pairs(rows: list[tuple[int, int]]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    return [(rows[i], rows[i + 1]) for i in range(0, len(rows) - 1, 2)]


def _one_batch(s: Sampler, requests: list[GenerationRequest]) -> list[list[GeneratedSequence]]:
    """``requests`` as one batch, submitted as the gateway does (``submit_async``): they are
    queued while the engine is held inside a one-token blocker request, so all are there when
    its next batch starts (checked)."""
    [hold] = s.gate.hold(1)
    before = s.engine.batches_run
    blocker = s.engine.submit(_request(s.prompts["C"], PLAIN, max_tokens=1))
    assert hold.started.wait(60)

    async def main() -> list[list[GeneratedSequence]]:
        waiters = [s.engine.submit_async(r) for r in requests]
        # call_soon is FIFO: the release runs after submit_async's hand-over to the queue.
        asyncio.get_running_loop().call_soon(hold.release.set)
        return list(await asyncio.gather(*waiters))

    answers = asyncio.run(main())
    blocker.result(60)
    assert s.engine.batches_run - before == 2
    return answers


def shared_prefill(s: Sampler, setting: Setting) -> Draws:
    """(a) batches of 64 n = 1 calls of one prompt: one prefill row, copied to every row."""
    draws = Draws([], [])
    while len(draws.tokens) < DRAWS:
        shared_before = s.engine.rows_shared
        answers = _one_batch(s, [_request(s.prompts["A"], setting)] * MAX_BATCH)
        assert s.engine.rows_shared - shared_before == MAX_BATCH - 1
        rows = [_first_two(a[0]) for a in answers]
        draws.tokens += rows
        draws.pairs += _pairs(rows)
    return draws


def one_by_one(s: Sampler, setting: Setting) -> Draws:
    """(b) one request per row, each answered before the next is sent: a batch of one. Half the
    draws (two forward passes per draw; the checks' bounds are computed for the count drawn)."""
    before = s.engine.batches_run
    count = DRAWS // 2
    tokens = [
        _first_two(s.engine.submit(_request(s.prompts["A"], setting)).result(60)[0]) for _ in range(count)
    ]
    assert s.engine.batches_run - before == count
    return Draws(tokens, [])


def joined(s: Sampler, setting: Setting) -> Draws:
    """(c) 61 n = 1 calls of prompt A join a running batch at its third forward pass, the step at
    which the two one-token prompt-C rows that joined it at its second end (the cache drops
    them as the newcomers come); the batch's own prompt-B row runs on."""
    draws = Draws([], [])
    while len(draws.tokens) < DRAWS:
        prefill, second = s.gate.hold(2)
        joined_before = s.engine.rows_joined
        runner = s.engine.submit(_request(s.prompts["B"], setting, max_tokens=6))
        assert prefill.started.wait(60)
        short = [s.engine.submit(_request(s.prompts["C"], setting, max_tokens=1)) for _ in range(2)]
        prefill.release.set()
        assert second.started.wait(60)  # the forward pass that the short rows joined
        joiners = [s.engine.submit(_request(s.prompts["A"], setting)) for _ in range(MAX_BATCH - 3)]
        second.release.set()
        rows = [_first_two(f.result(60)[0]) for f in joiners]
        for f in [runner, *short]:
            f.result(60)
        assert s.engine.rows_joined - joined_before == 2 + MAX_BATCH - 3
        draws.tokens += rows
        draws.pairs += _pairs(rows)
    return draws


def mixed(s: Sampler, setting: Setting) -> dict[str, Draws]:
    """(d) batches of three prompts: prompt A as one n = 16 request, prompts B and C as 16 n = 1
    calls each, interleaved (C at the other setting, and one greedy C row beside them)."""
    other = NUCLEUS if setting == PLAIN else PLAIN
    greedy = Setting(0.0, 1.0)
    draws = {"A": Draws([], []), "B": Draws([], []), "C": Draws([], [])}
    while len(draws["A"].tokens) < DRAWS:
        calls = [_request(s.prompts["A"], setting, n=16)]
        for _ in range(16):
            calls += [_request(s.prompts["B"], setting), _request(s.prompts["C"], other)]
        calls.append(_request(s.prompts["C"], greedy))
        answers = _one_batch(s, calls)
        a_rows = [_first_two(seq) for seq in answers[0]]
        b_rows = [_first_two(a[0]) for a in answers[1:-1:2]]
        c_rows = [_first_two(a[0]) for a in answers[2:-1:2]]
        for key, rows in (("A", a_rows), ("B", b_rows), ("C", c_rows)):
            draws[key].tokens += rows
            draws[key].pairs += _pairs(rows)
        greedy_row = _first_two(answers[-1][0])
        assert greedy_row == greedy_tokens(s, "C"), "the greedy row is not the argmax"
    return draws


def greedy_tokens(s: Sampler, key: str) -> tuple[int, int]:
    prompt = s.prompts[key]
    with torch.no_grad():
        t1 = int(s.gate.model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax())
        t2 = int(s.gate.model(input_ids=torch.tensor([[*prompt, t1]])).logits[0, -1].argmax())
    return t1, t2


# The tests -------------------------------------------------------------------------------------

PATHS: dict[str, Callable[[Sampler, Setting], Draws]] = {
    "shared prefill": shared_prefill,
    "one request per row": one_by_one,
    "joined rows": joined,
}


@pytest.mark.parametrize("setting", [PLAIN, NUCLEUS], ids=["t1", "t0.7-p0.9"])
@pytest.mark.parametrize("path", list(PATHS))
def test_draws_follow_the_model(sampler: Sampler, path: str, setting: Setting) -> None:
    torch.manual_seed(1000)  # the unseeded rows draw from the global generator
    draws = PATHS[path](sampler, setting)
    joint = model_joint(sampler.gate.model, sampler.prompts["A"], setting)
    check_follows_model(draws, joint, f"{path}, {setting}")
    if draws.pairs:
        check_rows_independent(draws, joint, f"{path}, {setting}")


@pytest.mark.parametrize("setting", [PLAIN, NUCLEUS], ids=["t1", "t0.7-p0.9"])
def test_draws_of_a_mixed_batch_follow_each_rows_own_prompt_and_setting(
    sampler: Sampler, setting: Setting
) -> None:
    torch.manual_seed(2000)
    other = NUCLEUS if setting == PLAIN else PLAIN
    for key, draws in mixed(sampler, setting).items():
        row_setting = other if key == "C" else setting
        joint = model_joint(sampler.gate.model, sampler.prompts[key], row_setting)
        check_follows_model(draws, joint, f"mixed batch, prompt {key}, {row_setting}")
        check_rows_independent(draws, joint, f"mixed batch, prompt {key}, {row_setting}")


def test_the_checks_catch_correlated_and_misplaced_draws(sampler: Sampler) -> None:
    """The checks' power: rows that copy their neighbour's draw, and draws of another prompt,
    are refused at this number of draws."""
    torch.manual_seed(3000)
    draws = shared_prefill(sampler, PLAIN)
    joint = model_joint(sampler.gate.model, sampler.prompts["A"], PLAIN)
    copied = Draws(draws.tokens, [(a, a) if i % 4 == 0 else (a, b) for i, (a, b) in enumerate(draws.pairs)])
    with pytest.raises(AssertionError, match="agree"):
        check_rows_independent(copied, joint, "a quarter of the pairs copied")
    other = model_joint(sampler.gate.model, sampler.prompts["B"], PLAIN)
    with pytest.raises(AssertionError, match=r"total variation|chi-square"):
        check_follows_model(draws, other, "prompt A's draws against prompt B")
    hotter = model_joint(sampler.gate.model, sampler.prompts["A"], Setting(1.3, 1.0))
    with pytest.raises(AssertionError, match=r"total variation|chi-square"):
        check_follows_model(draws, hotter, "temperature 1 draws against temperature 1.3")
