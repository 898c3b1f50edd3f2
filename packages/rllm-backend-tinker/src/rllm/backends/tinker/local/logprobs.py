"""Per-token logprobs (and entropy, and a teacher's top-k) without the whole micro-batch's logits.

A causal LM's forward turns every position's final hidden state into full-vocabulary logits:
positions x vocabulary floats (64 sequences of 104 tokens x 49,152 = 1.3 GB in float32, and the
log-softmax, its exponentials and the gradient each as large again). The loss needs one number
per trained position. So the model's forward runs with its output head skipped (a pre-hook
hands the head zero positions and keeps the hidden states it was given), and the head is then
applied here to chunks of ``chunk`` positions, only at the positions the loss trains
(``mask != 0``; everything else is 0, as the loss masks it): logits -> logsumexp -> the target's
logit minus it. With gradients each chunk runs under ``torch.utils.checkpoint``, so backward
recomputes one chunk's logits at a time instead of keeping them all. Row by row the arithmetic
is the plain ``log_softmax`` + gather of the full logits (tests: values and gradients equal
within 1e-5 in float32, hypothesis over shapes and chunk sizes).

A model whose logits are not ``head(hidden)`` up to a transform named in its config (final-logit
soft-capping, a logit scale) is caught by :func:`check_head` on a few tokens at start-up; it then
takes its own full logits and only the log-softmax is chunked (:class:`LogitHead` ``exact=False``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from rllm.backends.tinker.local.batching import PaddedBatch
from rllm.types.errors import InputError, StateError, UsageError

logger = logging.getLogger(__name__)

# Positions a chunk holds when the caller gives none: its float32 logits stay near 64 MiB.
DEFAULT_CHUNK_BYTES = 64 << 20


def chunk_positions(vocab: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Positions whose float32 logits fit in ``chunk_bytes`` (at least 16)."""
    return max(16, chunk_bytes // (4 * vocab))


@dataclass
class TokenStats:
    """Shifted per-token values of a micro-batch, one sequence a row ([S, L-1]; 0 where the
    loss mask is 0): logprobs of the targets, entropy (when asked) and the student's logprobs of
    a teacher's top-k tokens ([S, L-1, k]) with its log mass outside them (when ids are given)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    topk: torch.Tensor | None = None
    tail: torch.Tensor | None = None


class LogitHead:
    """The model's output head and what its forward does to the head's output (``exact``), or,
    for a model whose logits this cannot reproduce, the model's own logits (``exact=False``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        head = model.get_output_embeddings()  # pyright: ignore[reportCallIssue]
        if not isinstance(head, torch.nn.Module):
            raise UsageError(f"{type(model).__name__} has no output head")
        self.head = head
        self.exact = True
        config: Any = getattr(model, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.softcap = _positive(getattr(text, "final_logit_softcapping", None))
        self.scale = _positive(getattr(text, "logit_scale", None)) or 1.0
        self.divide = _positive(getattr(text, "logits_scaling", None)) or 1.0

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of ``hidden`` [..., H] (or of logits rows when not ``exact``)."""
        if not self.exact:
            return hidden.float()
        logits = self.head(hidden)
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.divide != 1.0:
            logits = logits / self.divide
        logits = logits.float()
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _positive(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and value > 0 else None


@contextmanager
def _head_skipped(head: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Within the block, the calling thread's forward passes give ``head`` zero positions and the
    hidden states it was handed land in the yielded list. Other threads (a sampler sharing the
    module) see the head as it is."""
    thread = threading.get_ident()
    seen: list[torch.Tensor] = []

    def hook(
        module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if threading.get_ident() != thread:
            return None
        if args:
            hidden, rest = args[0], args[1:]
        else:
            hidden, rest = kwargs.pop("input"), ()
        seen.append(hidden)
        return (hidden[..., :0, :], *rest), kwargs

    handle = head.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def model_hidden(model: torch.nn.Module, head: LogitHead, **inputs: Any) -> torch.Tensor:
    """[rows, width, H]: what the output head turns into logits (exact heads), else the logits."""
    if not head.exact:
        return model(**inputs, use_cache=False).logits
    with _head_skipped(head.head) as seen:
        model(**inputs, use_cache=False)
    if len(seen) != 1:
        raise StateError(f"{type(model).__name__}'s forward called its output head {len(seen)} times")
    return seen[0]


def token_stats(
    model: torch.nn.Module,
    head: LogitHead,
    batch: PaddedBatch,
    *,
    chunk: int,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    teacher_ids: torch.Tensor | None = None,
) -> TokenStats:
    """The micro-batch's per-token values at its trained positions (padded or packed rows)."""
    packed = batch.packed
    if packed is None:
        hidden = model_hidden(
            model, head, input_ids=batch.input_ids, attention_mask=batch.attention_mask, **batch.model_inputs
        )
        ids = batch.input_ids
    else:
        hidden = model_hidden(
            model,
            head,
            input_ids=packed.input_ids,
            attention_mask=packed.attention_mask,
            position_ids=packed.position_ids,
        )
        ids = packed.input_ids
    width = hidden.shape[1] - 1
    need = batch.mask != 0
    if packed is None:
        rows = torch.arange(need.shape[0], device=need.device)[:, None].expand_as(need)
        cols = torch.arange(need.shape[1], device=need.device)[None, :].expand_as(need)
    else:
        rows, cols = packed.rows, packed.cols
    flat = (rows * width + cols)[need]
    positions = hidden[:, :-1].reshape(-1, hidden.shape[-1]).index_select(0, flat)
    targets = ids[:, 1:].reshape(-1).index_select(0, flat)
    picked_ids = None if teacher_ids is None else teacher_ids[need]
    parts = chunked_stats(
        head.logits,
        positions,
        targets,
        chunk=chunk,
        with_entropy=with_entropy or entropy_grad,
        entropy_grad=entropy_grad,
        teacher_ids=picked_ids,
    )
    return TokenStats(*(None if p is None else _spread(need, p) for p in parts))  # pyright: ignore[reportArgumentType]


def _spread(need: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Values of the needed positions back in the [S, L-1(, k)] layout, 0 elsewhere."""
    mask = need if values.dim() == 1 else need.unsqueeze(-1).expand(*need.shape, values.shape[-1])
    out = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
    return out.masked_scatter(mask, values)


def chunked_stats(
    to_logits: Callable[[torch.Tensor], torch.Tensor],
    positions: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk: int,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    teacher_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(logprobs [N], entropy [N] | None, top-k [N, k] | None, tail [N] | None) of ``positions``
    [N, H] whose logits are ``to_logits(positions)``, ``chunk`` positions at a time."""
    if chunk < 1:
        raise InputError(f"chunk must be >= 1, got {chunk}")
    grad = torch.is_grad_enabled() and positions.requires_grad
    pieces: list[tuple[torch.Tensor | None, ...]] = []
    for start in range(0, positions.shape[0], chunk):
        end = start + chunk
        ids = None if teacher_ids is None else teacher_ids[start:end]
        args = (to_logits, positions[start:end], targets[start:end], ids, with_entropy, entropy_grad)
        if grad:  # backward recomputes this chunk's logits instead of keeping them
            piece = checkpoint(_chunk_stats, *args, use_reentrant=False, preserve_rng_state=False)
        else:
            piece = _chunk_stats(*args)
        pieces.append(piece)
    if not pieces:
        empty = positions.new_zeros((0,), dtype=torch.float32)
        k = 0 if teacher_ids is None else teacher_ids.shape[-1]
        top = None if teacher_ids is None else positions.new_zeros((0, k), dtype=torch.float32)
        return empty, empty if with_entropy else None, top, None if teacher_ids is None else empty
    out = [None if piece[0] is None else torch.cat(piece) for piece in zip(*pieces, strict=True)]
    assert out[0] is not None
    return out[0], out[1], out[2], out[3]


def _chunk_stats(
    to_logits: Callable[[torch.Tensor], torch.Tensor],
    positions: torch.Tensor,
    targets: torch.Tensor,
    teacher_ids: torch.Tensor | None,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor | None, ...]:
    logits = to_logits(positions)
    log_norm = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    entropy = None
    if with_entropy:
        # A metric unless it is a loss term (entropy_coef): then no backward memory.
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            probs = torch.softmax(logits, dim=-1)
            entropy = log_norm - (probs * logits).sum(-1)
    top = tail = None
    if teacher_ids is not None:
        from rllm.algos.losses.distill import topk_and_tail

        top, tail = topk_and_tail(logits, teacher_ids)
    return logprobs, entropy, top, tail


def check_head(model: torch.nn.Module, head: LogitHead, vocab: int) -> LogitHead:
    """Compare ``head`` with the model's own logits on a few tokens; a head that differs falls
    back to the model's logits (``exact=False``, one warning line naming the model)."""
    device = next(model.parameters()).device
    ids = torch.arange(1, 7, device=device)[None, :] % vocab
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        got = head.logits(model_hidden(model, head, input_ids=ids, attention_mask=mask))
    scale = expected.abs().max().clamp(min=1.0)
    if got.shape == expected.shape and bool(((got - expected).abs() <= 1e-3 * scale).all()):
        return head
    logger.warning(
        "%s: its logits are not head(hidden) as rLLM reads its config; training takes its full logits "
        "(more memory per micro-batch)",
        type(model).__name__,
    )
    head.exact = False
    return head


__all__ = ["LogitHead", "TokenStats", "check_head", "chunk_positions", "chunked_stats", "token_stats"]
