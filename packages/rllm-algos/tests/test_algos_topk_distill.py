"""The dense top-k distillation losses (rllm.algos.losses.distill) against a numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.algos.config import AlgorithmConfig
from rllm.algos.losses import compute_policy_loss
from rllm.algos.losses.checks import LossInputError
from rllm.algos.losses.distill import compute_topk_distill_loss, topk_and_tail
from rllm.types import ConfigError

VOCAB = 12


def draw(
    seed: int, k: int, batch: int = 3, tokens: int = 5
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Student logits [B, T, V], teacher top-k logprobs and ids [B, T, k], and a mask with
    untrained positions (a prompt prefix, a padded tail)."""
    rng = np.random.default_rng(seed)
    # float32 values, as the backend and the teacher's JSON hold them; the reference computes in float64.
    student_logits = rng.normal(0, 2, (batch, tokens, VOCAB)).astype(np.float32).astype(np.float64)
    teacher_logits = rng.normal(0, 1.5, (batch, tokens, VOCAB))
    teacher_all = teacher_logits - np.log(np.exp(teacher_logits).sum(-1, keepdims=True))
    ids = np.argsort(-teacher_all, axis=-1)[..., :k]
    teacher = np.take_along_axis(teacher_all, ids, -1).astype(np.float32).astype(np.float64)
    mask = np.ones((batch, tokens))
    mask[:, :2] = 0  # the prompt
    mask[-1, -1] = 0  # padding
    return student_logits, teacher, ids, mask


def reference(
    student_logits: np.ndarray, teacher: np.ndarray, ids: np.ndarray, mask: np.ndarray, reverse: bool
) -> float:
    """The KL over the top-k plus one tail bucket, a token mean over trained positions, in float64."""
    student_all = student_logits - np.log(np.exp(student_logits).sum(-1, keepdims=True))
    student = np.take_along_axis(student_all, ids, -1)
    rest = np.exp(student_all).sum(-1, keepdims=True) - np.exp(student).sum(-1, keepdims=True)
    p = np.concatenate([np.exp(student), rest], -1)
    q = np.concatenate([np.exp(teacher), 1 - np.exp(teacher).sum(-1, keepdims=True)], -1)
    a, b = (p, q) if reverse else (q, p)
    kl = (a * (np.log(a) - np.log(b))).sum(-1)
    return float((kl * mask).sum() / mask.sum())


def torch_loss(
    student_logits: np.ndarray,
    teacher: np.ndarray,
    ids: np.ndarray,
    mask: np.ndarray,
    loss: str,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """The loss as a backend computes it: the student's top-k and tail from its full logits."""
    logits = torch.tensor(student_logits, dtype=dtype, requires_grad=True)
    student, tail = topk_and_tail(logits, torch.tensor(ids))
    out, metrics = compute_topk_distill_loss(
        student,
        torch.tensor(teacher, dtype=dtype),
        torch.tensor(mask),
        AlgorithmConfig(loss=loss),
        student_tail=tail,
    )
    out.backward()
    assert logits.grad is not None
    return out.detach(), logits.grad, metrics


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, VOCAB - 1), reverse=st.booleans())
def test_the_loss_equals_the_numpy_reference(seed: int, k: int, reverse: bool) -> None:
    logits, teacher, ids, mask = draw(seed, k)
    loss, _, metrics = torch_loss(
        logits, teacher, ids, mask, "topk_reverse_kl" if reverse else "topk_forward_kl"
    )
    want = reference(logits, teacher, ids, mask, reverse)
    assert float(loss) == pytest.approx(want, abs=1e-5, rel=1e-5)
    assert metrics["distill/topk_kl"] == pytest.approx(want, abs=1e-5, rel=1e-5)
    assert metrics["num_tokens"] == mask.sum()


@pytest.mark.parametrize("loss_name", ["topk_forward_kl", "topk_reverse_kl"])
@pytest.mark.parametrize("k", [1, 4, VOCAB])
def test_a_teacher_equal_to_the_student_is_the_minimum_with_zero_gradient(loss_name: str, k: int) -> None:
    logits, _, _, mask = draw(7, k)
    student_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ids = np.argsort(-student_all, axis=-1)[..., :k]  # the teacher is the student: its own top-k
    teacher = np.take_along_axis(student_all, ids, -1)
    loss, grad, _ = torch_loss(logits, teacher, ids, mask, loss_name, torch.float64)
    assert abs(float(loss)) < 1e-9
    assert float(grad.abs().max()) < 1e-9
    # Any other student is worse: the minimum is there.
    moved = logits + np.random.default_rng(1).normal(0, 0.5, logits.shape)
    assert float(torch_loss(moved, teacher, ids, mask, loss_name, torch.float64)[0]) > float(loss) + 1e-4


@pytest.mark.parametrize("loss_name", ["topk_forward_kl", "topk_reverse_kl"])
def test_untrained_positions_never_count(loss_name: str) -> None:
    """Prompt, tool-output and padding positions (mask 0) change neither the loss nor any
    gradient, whatever they hold (even NaN), and get no gradient themselves."""
    logits, teacher, ids, mask = draw(3, 4)
    base, base_grad, _ = torch_loss(logits, teacher, ids, mask, loss_name)
    other_teacher, other_logits = teacher.copy(), logits.copy()
    untrained = mask == 0
    other_teacher[untrained] = np.nan
    other_logits[untrained] = 50.0
    loss, grad, _ = torch_loss(other_logits, other_teacher, ids, mask, loss_name)
    assert float(loss) == float(base)
    assert torch.equal(grad[torch.tensor(~untrained)], base_grad[torch.tensor(~untrained)])
    assert float(grad[torch.tensor(untrained)].abs().max()) == 0.0


def test_bad_inputs_are_clear_errors() -> None:
    logits, teacher, ids, mask = draw(5, 3)
    student = torch.log_softmax(torch.tensor(logits, dtype=torch.float32), -1).gather(-1, torch.tensor(ids))
    config = AlgorithmConfig(loss="topk_forward_kl")
    bad = teacher.copy()
    bad[0, 3, 1] = np.inf
    with pytest.raises(LossInputError, match=r"teacher_topk.*\[0, 3\]"):
        compute_topk_distill_loss(student, torch.tensor(bad), torch.tensor(mask), config)
    with pytest.raises(LossInputError, match="k=2, the teacher's has k=3"):
        compute_topk_distill_loss(student[..., :2], torch.tensor(teacher), torch.tensor(mask), config)
    with pytest.raises(LossInputError, match=r"\[batch, tokens, k\]"):
        compute_topk_distill_loss(student[0], torch.tensor(teacher), torch.tensor(mask), config)
    with pytest.raises(LossInputError, match="not a top-k distillation loss"):
        compute_topk_distill_loss(student, torch.tensor(teacher), torch.tensor(mask), AlgorithmConfig())
    # The policy-loss entry point has no teacher top-k to give it: refused, never a silent loss.
    lp = torch.zeros(mask.shape)
    with pytest.raises(LossInputError, match="compute_topk_distill_loss"):
        compute_policy_loss(lp, None, None, torch.tensor(mask), config)


@pytest.mark.parametrize("option", [{"kl_coef": 0.1}, {"entropy_coef": 0.01}, {"tis": "token"}])
def test_options_the_topk_loss_does_not_apply_are_refused(option: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=next(iter(option))):
        AlgorithmConfig(loss="topk_forward_kl", **option)  # type: ignore[arg-type]
