"""Dense on-policy distillation over a teacher's top-k tokens per position (losses
``topk_forward_kl`` and ``topk_reverse_kl``).

At every trained position of the student's own sample the teacher reports its ``k`` most likely
tokens and their logprobs; the student's logprobs of those same tokens come from its full
softmax. Both distributions are coarsened to ``k + 1`` outcomes, the ``k`` tokens and one tail
bucket for the rest of the vocabulary (``log(1 - sum p)``), and the loss is the exact KL between
the two coarse distributions: ``topk_forward_kl`` = KL(teacher || student) (mode-covering; its
gradient on the student's logits is ``p - q`` per outcome, the teacher's whole top-k at once),
``topk_reverse_kl`` = KL(student || teacher) (mode-seeking, the quantity the one-sample ``sampled``
estimate targets). With the tail bucket each is >= 0 and exactly 0, with zero gradient, when the
student matches the teacher on those ``k + 1`` outcomes; without it the forward loss would push
all of the student's mass into the top-k. By the data-processing inequality each is a lower
bound of the full-vocabulary KL.

Peers (checked 2026-12, facts only): TRL's GKD backpropagates a generalized Jensen-Shannon
divergence over the full teacher and student distributions (``beta`` = 0 forward KL, 1 reverse KL);
verl's distillation config has a ``topk`` (default 128) of teacher logprobs and a ``loss_mode`` (k3
by default, JSD with ``jsd_beta``); NeMo-RL's distillation loss takes the teacher's top-k logits
with a forward, reverse or mixed KL; sparse top-k knowledge-distillation code keeps either a
renormalized top-k or a tail ("other") bucket. tinker-cookbook's on-policy distillation uses the
sampled token's teacher - student logprob as a per-token advantage (rLLM's ``distill.loss =
"sampled"``). The measured choice between the two directions on ``say-single`` is in
benchmarks/history/issue-31.md, "Issue #31 round 7 — (c) distillation on the teacher's top-k".
"""

from __future__ import annotations

from typing import Any

import torch

from rllm.algos.config import AlgorithmConfig
from rllm.algos.losses.aggregation import aggregate, masked_mean
from rllm.algos.losses.checks import LossInputError, check_mask, check_tokens
from rllm.algos.registry import TOPK_LOSSES, get_loss

# Tail buckets are kept within [exp(-69), 1 - 1e-12] of mass: finite logs, so a position whose
# top-k holds (nearly) all the mass gives a finite loss whose tail term is negligible.
_TAIL_LOG_MIN = -69.0
_MASS_LOG_MAX = -1e-12


def tail_log(topk_logprobs: torch.Tensor) -> torch.Tensor:
    """log(1 - sum exp(topk_logprobs)) over the last dimension: the log mass outside the top-k."""
    mass = torch.logsumexp(topk_logprobs, dim=-1).clamp(max=_MASS_LOG_MAX)
    return torch.log(-torch.expm1(mass)).clamp(min=_TAIL_LOG_MIN)


def topk_and_tail(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The student's logprobs of the teacher's tokens ``ids`` [..., k] and the log of its mass on
    every other token [...], from its full ``logits`` [..., V]. The tail comes from the other
    logits themselves, not from ``1 - sum p``: in float32 that difference is noise once the top-k
    holds nearly all the mass (as a trained LM's often does), and the forward loss's gradient
    divides by it."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    log_norm = torch.logsumexp(logits, dim=-1, keepdim=True)
    top = logits.gather(-1, ids) - log_norm
    # A finite floor, not -inf: when ids cover the whole vocabulary the tail's gradient must be 0, not NaN.
    rest = logits.scatter(-1, ids, torch.finfo(logits.dtype).min)
    tail = (torch.logsumexp(rest, dim=-1, keepdim=True) - log_norm).squeeze(-1).clamp(min=_TAIL_LOG_MIN)
    return top, tail


def topk_kl(
    student: torch.Tensor, teacher: torch.Tensor, *, reverse: bool, student_tail: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-position KL over the ``k + 1`` outcomes (top-k tokens and the tail), [..., k] -> [...].

    ``student`` / ``teacher``: logprobs of the teacher's top-k tokens under each model (the
    student's from its full softmax); ``student_tail``: the student's log mass outside them
    (``topk_and_tail``; else ``1 - sum p``, exact only in high precision). The teacher's tail is
    ``1 - sum q`` (its top-k is all a teacher reports). Computed in float64."""
    student64, teacher64 = student.double(), teacher.double()
    tail = tail_log(student64) if student_tail is None else student_tail.double()
    s = torch.cat([student64, tail.unsqueeze(-1)], dim=-1)
    t = torch.cat([teacher64, tail_log(teacher64).unsqueeze(-1)], dim=-1)
    if reverse:
        return (s.exp() * (s - t)).sum(-1).to(student.dtype)
    return (t.exp() * (t - s)).sum(-1).to(student.dtype)


def check_topk(name: str, values: torch.Tensor, mask: torch.Tensor, k: int | None = None) -> torch.Tensor:
    """A [batch, tokens, k] tensor aligned with ``mask``, finite at trained positions; returned
    with untrained positions set to a uniform -log(k) (finite, so no NaN reaches a gradient)."""
    if (
        not isinstance(values, torch.Tensor)
        or values.dim() != 3
        or tuple(values.shape[:2]) != tuple(mask.shape)
    ):
        shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise LossInputError(
            f"`{name}` must be [batch, tokens, k] like the mask {tuple(mask.shape)}, got {shape}"
        )
    if k is not None and values.shape[-1] != k:
        raise LossInputError(f"`{name}` has k={values.shape[-1]}, the teacher's has k={k}")
    if not values.is_floating_point():
        raise LossInputError(f"`{name}` must be a floating-point tensor, got {values.dtype}")
    bad = ~torch.isfinite(values.detach()).all(-1) & mask
    if bad.any():
        row, col = (int(v) for v in bad.nonzero()[0])
        raise LossInputError(
            f"`{name}` is not finite at trained token [{row}, {col}]: {values[row, col].tolist()}"
        )
    filler = torch.full((), -float(torch.log(torch.tensor(float(values.shape[-1])))), dtype=values.dtype)
    return torch.where(mask.unsqueeze(-1), values, filler.to(values.device))


def compute_topk_distill_loss(
    student_topk: torch.Tensor,
    teacher_topk: torch.Tensor,
    mask: torch.Tensor,
    config: AlgorithmConfig,
    *,
    student_tail: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar top-k distillation loss of one (micro-)batch and its metrics.

    ``student_topk`` / ``teacher_topk``: [batch, tokens, k] logprobs of the teacher's top-k tokens
    at each position, under the student (with gradient) and the teacher; ``student_tail``
    [batch, tokens]: the student's log mass outside them (``topk_and_tail``; a backend with the
    full logits should pass it, see there); ``mask`` [batch, tokens]
    is 1 at trained tokens only (prompt, tool-output and padding positions never count). The
    per-position KL is aggregated with ``config.aggregation`` (``num_tokens`` / ``num_sequences``:
    the whole mini-batch's counts, as in ``compute_policy_loss``)."""
    spec = get_loss(config.loss)
    if not spec.teacher_topk:
        raise LossInputError(
            f"loss {config.loss!r} is not a top-k distillation loss ({', '.join(TOPK_LOSSES)})"
        )
    mask = check_mask(mask)
    teacher = check_topk("teacher_topk", teacher_topk, mask)
    student = check_topk("student_topk", student_topk, mask, k=teacher.shape[-1])
    tail = None
    if student_tail is not None:
        tail = check_tokens("student_tail", student_tail, mask)
        tail = torch.where(mask, tail, tail_log(student).detach())  # untrained: any finite value
    token_loss = topk_kl(
        student, teacher.to(student.dtype), reverse=config.loss == "topk_reverse_kl", student_tail=tail
    )
    loss = aggregate(
        token_loss,
        mask,
        config.aggregation,
        loss_scale_factor=config.loss_scale_factor,
        num_tokens=num_tokens,
        num_sequences=num_sequences,
    )
    with torch.no_grad():
        metrics = {
            "policy_loss": loss.item(),
            "distill/topk_kl": masked_mean(token_loss.detach(), mask).item(),
            "distill/topk_mass_teacher": masked_mean(teacher.exp().sum(-1), mask).item(),
            "distill/topk_mass_student": masked_mean(student.detach().exp().sum(-1), mask).item(),
            "num_tokens": float(mask.sum().item()),
            "loss": loss.item(),
        }
    if not torch.isfinite(loss):
        raise LossInputError(f"the top-k distillation loss is not finite ({loss.item()}); metrics: {metrics}")
    return loss, metrics


def policy_call_refused(*_: Any, **__: Any) -> Any:
    """The registry's target for the top-k losses: they need the student's logprobs of the
    teacher's tokens, which ``compute_policy_loss`` (one logprob per token) does not carry."""
    raise LossInputError(
        "the top-k distillation losses run through rllm.algos.losses.distill.compute_topk_distill_loss "
        "with the teacher's top-k, not compute_policy_loss; a backend that cannot must refuse them in validate"
    )


__all__ = [
    "check_topk",
    "compute_topk_distill_loss",
    "policy_call_refused",
    "tail_log",
    "topk_and_tail",
    "topk_kl",
]
