"""LocalTrainer: forward_backward with rllm.algos' loss, AdamW optim_step, and train_step.

One ``train_step`` = ``ppo_epochs`` x ``mini_batches`` optimizer steps. Each mini-batch's
gradient is accumulated over micro-batches, each micro-batch loss weighted by its share of the
mini-batch (tokens for token-level aggregations, sequences for sequence-level ones) so the
accumulated gradient equals that of the whole mini-batch.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import numpy as np
import torch

from rllm.algos.config import AlgorithmConfig
from rllm.algos.losses import zero_advantage_rows_inert
from rllm.algos.registry import get_loss
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.local import recompute
from rllm.backends.tinker.local.batching import (
    PaddedBatch,
    check_sequences,
    pad,
    split_inert_rows,
    split_micro_batches,
)
from rllm.backends.tinker.local.host_memory import release_free_memory
from rllm.backends.tinker.local.logprobs import LogitHead, check_head, token_stats
from rllm.backends.tinker.local.loss import policy_loss
from rllm.backends.tinker.local.memory import MemoryPlan, StepPlanner
from rllm.backends.tinker.local.packing import pack_layout, plan_packed_micro_batches
from rllm.backends.tinker.local.reference import ReferencePolicy
from rllm.backends.tinker.local.topk import topk_distill_loss
from rllm.backends.tinker.local.vision import VisionInputs
from rllm.tinker_api.batching import split_mini_batches
from rllm.types import FloatArray, TrainSequence
from rllm.types.errors import InputError

if TYPE_CHECKING:
    from rllm.backends.tinker.local.model import PolicyModel

# Loss metrics that micro-batches add up (global denominators); the rest are token-weighted means.
_SUMMED_METRICS = {"loss", "policy_loss", "num_tokens"}


def make_optimizer(params: list[torch.nn.Parameter], config: TinkerBackendConfig) -> torch.optim.AdamW:
    """AdamW over ``params`` with the backend config's settings (each policy's trainer its own)."""
    return torch.optim.AdamW(
        params,
        lr=config.learning_rate,
        betas=config.betas,
        eps=config.eps,
        weight_decay=config.weight_decay,
        foreach=True,
    )


class LocalTrainer:
    """Owns the optimizer of a (possibly LoRA-wrapped) causal LM."""

    def __init__(
        self,
        model: PolicyModel,
        config: TinkerBackendConfig,
        device: torch.device,
        pad_id: int,
        reference_loader: Callable[[], torch.nn.Module] | None = None,
        vision: VisionInputs | None = None,
    ) -> None:
        self.model = model
        self.vision = vision
        self.config = config
        self.device = device
        self.pad_id = pad_id
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise InputError("the model has no trainable parameters (check lora.target_modules)")
        self.optimizer = make_optimizer(self.params, config)
        head = model.get_output_embeddings()
        assert head is not None  # causal and image-text-to-text LMs have an output head
        self.vocab_size = int(head.weight.shape[0])
        # Logprobs from the final hidden states, the head applied a chunk at a time (local/logprobs.py).
        self.head = check_head(model, LogitHead(model), self.vocab_size)
        self.optimizer_steps = 0
        checkpointable = recompute.install(model) > 0
        if config.gradient_checkpointing is True and not checkpointable:
            raise InputError(
                f"gradient_checkpointing=true, but {type(model).__name__} has no decoder layers that can "
                'recompute (transformers\' GradientCheckpointingLayer); set it to false or "auto"'
            )
        # Micro-batch, checkpointing and logits chunk from the step's memory estimate (local/memory.py).
        self.memory = StepPlanner(model, config, device, checkpointable)
        # What a packed micro-batch's attention mask is built for (see local/packing.py).
        self._attention = str(getattr(model.config, "_attn_implementation", None) or "eager")
        self._dtype = next(model.parameters()).dtype
        self.reference = ReferencePolicy(model, self.head, self.vocab_size, reference_loader)

    def plan_memory(
        self, batch: list[TrainSequence], groups: list[list[int]], algo: AlgorithmConfig | None = None
    ) -> MemoryPlan:
        """The memory plan covering ``batch`` cut into ``groups`` (made before the first step;
        InputError when a step cannot fit, see local/memory.py)."""
        reference = self.reference.bytes_to_load() if algo is not None and algo.kl_coef > 0 else 0
        return self.memory.plan_for(
            batch, groups, optimizer_allocated=bool(self.optimizer.state), reference_bytes=reference
        )

    def plan_memory_at_start(self, rows: int, row_tokens: int, algo: AlgorithmConfig) -> MemoryPlan:
        """The memory plan for a step of ``rows`` sequences of ``row_tokens`` tokens, cut into the
        configured mini-batches, before the first rollout (InputError when it cannot fit); not
        kept: the first step plans again from its real rows."""
        groups = split_mini_batches(max(1, rows), self.config.mini_batches, None)
        largest = max(len(group) for group in groups)
        reference = self.reference.bytes_to_load() if algo.kl_coef > 0 else 0
        return self.memory.plan_for_sizes(
            row_tokens, largest * row_tokens, optimizer_allocated=False, reference_bytes=reference, keep=False
        )

    def _plan(self) -> MemoryPlan:
        plan = self.memory.plan
        assert plan is not None  # every entry point plans before its first forward pass
        return plan

    # the Tinker-style primitives -------------------------------------------------------------
    def forward_backward(
        self,
        batch: list[TrainSequence],
        indices: list[int],
        algo: AlgorithmConfig,
        old_logprobs: dict[int, torch.Tensor] | None,
        record_logprobs: bool = False,
    ) -> dict[str, float]:
        """Accumulate the gradient of the loss over ``batch[indices]``; returns metrics.

        Micro-batches pass the mini-batch's token and sequence counts to the loss, so their
        losses (and gradients) sum to the mini-batch's. Micro-batches without a trained token
        are skipped (they carry no gradient). So are sequences whose advantages are 0 at every
        trained token where the loss gives them no gradient (``zero_advantage_rows_inert``, no
        ``max_mismatch``, and no ``record_logprobs``: token truth measures every row): they
        count in the denominators only, so the gradient is the whole mini-batch's, and when
        nothing else is left the gradient is zero and the optimizer still steps (as it would on
        the whole batch; Adam's momentum moves on). Per-token metrics are then over the sequences computed. ``record_logprobs`` writes
        the policy's logprobs onto each computed sequence's ``trainer_logprobs`` (token truth:
        the engine compares them with the sampler's).
        """
        plan = self.plan_memory(batch, [indices], algo)
        rows, inert_tokens, inert_sequences = indices, 0.0, 0.0
        # Token truth wants every row's trainer logprobs: rows are left out only where they were
        # taken already (several updates a batch record them in a snapshot first).
        if not record_logprobs and zero_advantage_rows_inert(algo) and algo.max_mismatch is None:
            rows, inert_tokens, inert_sequences = split_inert_rows(batch, indices)
        padded = [p for p in self._pieces(batch, rows) if p.num_tokens > 0] if rows else []
        computed_tokens = sum(p.num_tokens for p in padded)
        num_tokens = computed_tokens + inert_tokens
        num_sequences = float(sum(int((p.mask.sum(-1) > 0).sum()) for p in padded)) + inert_sequences
        sums: dict[str, float] = defaultdict(float)
        if not padded and inert_tokens > 0:
            # The whole batch's gradient is zero: the optimizer steps on zeros, not on nothing
            # (gradients accumulated by an earlier call stay as they are).
            for param in self.params:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
            sums["loss"] = sums["policy_loss"] = 0.0
        entropy_grad = algo.entropy_coef != 0
        # Distillation toward the teacher's top-k (local/topk.py) instead of a policy loss.
        topk = get_loss(algo.loss).teacher_topk
        for piece in padded:
            with recompute.recomputing(plan.checkpointing):
                logprobs, metrics = self._piece_backward(
                    piece, algo, old_logprobs, num_tokens, num_sequences, topk=topk, entropy_grad=entropy_grad
                )
            if record_logprobs:
                record_trainer_logprobs(batch, piece.indices, logprobs)
            share = piece.num_tokens / computed_tokens  # for averaging per-token metrics
            for key, value in metrics.items():
                sums[key] += float(value) * (1.0 if key in _SUMMED_METRICS else share)
            gap = (logprobs - piece.sampler_logprobs).abs()
            diff = torch.where(piece.mask > 0, gap, torch.zeros_like(gap)).sum() / piece.num_tokens
            sums["sampler_logprob_abs_diff"] += float(diff) * share
        sums["num_sequences"] = num_sequences
        sums["num_tokens"] = num_tokens
        sums["inert_sequences"] = inert_sequences
        return dict(sums)

    def _piece_backward(
        self,
        piece: PaddedBatch,
        algo: AlgorithmConfig,
        old_logprobs: dict[int, torch.Tensor] | None,
        num_tokens: float,
        num_sequences: float,
        *,
        topk: bool,
        entropy_grad: bool,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch's forward and backward; (its detached logprobs, its loss metrics)."""
        chunk = self._plan().logits_chunk
        if topk:
            logprobs, loss, metrics = topk_distill_loss(
                self.model, self.head, piece, algo, num_tokens, num_sequences, chunk=chunk
            )
        else:
            stats = token_stats(
                self.model, self.head, piece, chunk=chunk, with_entropy=True, entropy_grad=entropy_grad
            )
            logprobs, entropy = stats.logprobs, stats.entropy
            if old_logprobs is None:
                old = logprobs.detach()
            else:
                old = _stack_rows([old_logprobs[i] for i in piece.indices], logprobs.shape[1], self.device)
            ref = self.reference.logprobs(piece, chunk=chunk) if algo.kl_coef > 0 else None
            loss, metrics = policy_loss(
                logprobs,
                old,
                piece.advantages,
                piece.mask,
                algo,
                sampler_logprobs=piece.sampler_logprobs,
                ref_logprobs=ref,
                entropy=entropy,
                num_tokens=num_tokens,
                num_sequences=num_sequences,
            )
        loss.backward()
        return logprobs.detach(), metrics

    def optim_step(self, guard: Callable[[], AbstractContextManager[None]] | None = None) -> float:
        """Clip the global grad norm, apply AdamW, clear gradients; returns the pre-clip norm.

        A step without any gradient (a mini-batch with no trained token) changes nothing."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return 0.0
        if self.config.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.config.grad_clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([g.detach().norm() for g in grads]))
        with guard() if guard is not None else contextlib.nullcontext():
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        return float(norm)

    def train_step(
        self,
        batch: list[TrainSequence],
        algo: AlgorithmConfig,
        guard: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> dict[str, float]:
        """All mini-batch updates of one batch; metrics averaged over the optimizer steps."""
        started = time.perf_counter()
        check_sequences(batch, self.vocab_size)
        if not any(np.frombuffer(s.loss_mask, dtype=np.float32)[1:].any() for s in batch):
            raise InputError(
                "train_step got a batch without a trained token (every loss_mask is 0 after token 0)"
            )
        cfg = self.config
        groups = split_mini_batches(len(batch), cfg.mini_batches, cfg.shuffle_seed)
        plan = self.plan_memory(batch, groups, algo)  # before any work: refuses a step that cannot fit
        old = None
        if len(groups) * cfg.ppo_epochs > 1:  # later updates need the pre-update policy's logprobs
            old = self._snapshot_logprobs(batch, groups)
            for i, row in old.items():
                record_trainer_logprobs(batch, [i], row.unsqueeze(0))
        totals: dict[str, float] = defaultdict(float)
        grad_norms: list[float] = []
        for _ in range(cfg.ppo_epochs):
            for indices in groups:
                # One update: its forward pass sees the weights the sampler sampled with.
                metrics = self.forward_backward(batch, indices, algo, old, record_logprobs=old is None)
                grad_norms.append(self.optim_step(guard))
                for key, value in metrics.items():
                    totals[key] += value
        steps = len(grad_norms)
        out = {
            key: value / steps
            for key, value in totals.items()
            if key not in ("num_tokens", "num_sequences", "inert_sequences")
        }
        out["num_tokens"] = totals["num_tokens"] / cfg.ppo_epochs
        # Sequences left out of the passes (advantage 0 everywhere, see forward_backward).
        out["inert_sequences"] = totals["inert_sequences"] / cfg.ppo_epochs
        out["num_sequences"] = float(len(batch))
        out["grad_norm"] = sum(grad_norms) / steps
        out["grad_norm_max"] = max(grad_norms)
        out["optimizer_steps"] = float(steps)
        out["lr"] = float(self.optimizer.param_groups[0]["lr"])
        out["micro_batch_tokens"] = float(plan.micro_batch_tokens)
        out["memory_estimate_gb"] = plan.estimate.total / 1e9
        out["train_step_s"] = time.perf_counter() - started
        # The step's working memory is free now: give it back (the next phase may run elsewhere).
        release_free_memory()
        return out

    def eval_loss(self, batch: list[TrainSequence]) -> dict[str, float]:
        """Held-out negative log-likelihood of the loss-mask tokens (mean per token), no update."""
        check_sequences(batch, self.vocab_size)
        everything = list(range(len(batch)))
        self.plan_memory(batch, [everything])
        total, count = 0.0, 0.0
        with torch.no_grad():
            for padded in self._pieces(batch, everything):
                logprobs = token_stats(
                    self.model, self.head, padded, chunk=self._plan().logits_chunk
                ).logprobs
                total += float(-(logprobs * padded.mask).sum())
                count += padded.num_tokens
        release_free_memory()
        if count == 0:
            raise InputError("eval_loss got a batch without a trained token (every loss_mask is 0)")
        return {"loss": total / count, "num_tokens": count}

    def set_learning_rate_scale(self, scale: float) -> float:
        """Set every parameter group's LR to ``learning_rate * scale`` (a schedule's factor)."""
        lr = self.config.learning_rate * scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _pieces(self, batch: list[TrainSequence], indices: list[int]) -> list[PaddedBatch]:
        """``batch[indices]`` as micro-batches: padded one sequence a row, or packed (``pack_tokens``)."""
        cfg = self.config
        micro = self._plan().micro_batch_tokens
        if not cfg.pack_tokens:
            return [self._pad(batch, piece) for piece in split_micro_batches(batch, indices, micro)]
        pieces: list[PaddedBatch] = []
        for rows in plan_packed_micro_batches(batch, indices, cfg.pack_tokens, micro):
            padded = pad(batch, [i for row in rows for i in row], self.pad_id, self.device)
            padded.packed = pack_layout(batch, rows, self.pad_id, self.device, self._attention, self._dtype)
            pieces.append(padded)
        return pieces

    def _pad(self, batch: list[TrainSequence], piece: list[int]) -> PaddedBatch:
        padded = pad(batch, piece, self.pad_id, self.device)
        if any(batch[i].images for i in piece):
            if self.vision is None:
                raise InputError("train_step got sequences with images, but the model takes no image inputs")
            dtype = next(self.model.parameters()).dtype
            width = padded.input_ids.shape[1]
            padded.model_inputs = self.vision.model_inputs(
                [batch[i] for i in piece], width, self.device, dtype
            )
        return padded

    def _snapshot_logprobs(
        self, batch: list[TrainSequence], groups: list[list[int]]
    ) -> dict[int, torch.Tensor]:
        snapshot: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for indices in groups:
                for padded in self._pieces(batch, indices):
                    logprobs = token_stats(
                        self.model, self.head, padded, chunk=self._plan().logits_chunk
                    ).logprobs
                    for row, i in enumerate(padded.indices):
                        snapshot[i] = logprobs[row, : len(batch[i].input_ids) - 1]
        return snapshot


def record_trainer_logprobs(batch: list[TrainSequence], indices: list[int], logprobs: torch.Tensor) -> None:
    """Write rows of shifted logprobs ([rows, >= n-1], column j = token j+1) onto the sequences'
    ``trainer_logprobs``, aligned with ``input_ids`` (0 at token 0 and outside completions)."""
    rows = logprobs.float().cpu().numpy()
    for row, i in enumerate(indices):
        seq = batch[i]
        n = len(seq.input_ids)
        values = np.zeros(n, dtype=np.float32)
        values[1:] = rows[row, : n - 1]
        values *= np.frombuffer(seq.loss_mask, dtype=np.float32) > 0
        seq.trainer_logprobs = FloatArray(values.tobytes())


def _stack_rows(rows: list[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32, device=device)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out
