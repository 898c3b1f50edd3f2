"""How much memory a training step needs, how much there is, and the micro-batch that fits.

Before its first step the local trainer estimates the step's peak from the model's shape (layers,
hidden and MLP widths, heads, vocabulary), its dtype, what trains (LoRA or every weight) and the
micro-batch: what the process holds already, plus gradients, AdamW's two moments and the
temporaries of its step, plus the activations backward keeps per micro-batch token (every
decoder layer's, or with gradient checkpointing only each layer's input and one layer's worth)
and one chunk of full-vocabulary logits (local/logprobs.py). The per-token activation count is
what a Llama-style layer saves for backward (checked against a census of the tensors autograd
saves, tests/test_tinker_memory.py). It then picks the micro-batch (``micro_batch_tokens``) and
gradient checkpointing that fit the memory available (CPU: the kernel's available memory and the
cgroup's limit; CUDA: the device's free memory), lowers an explicit micro-batch that cannot fit
(one warning line), and refuses a step that cannot fit even one sequence at a time with one line
naming the numbers and the knobs, before the kernel's OOM killer ends the run without a word.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import torch

from rllm.backends.tinker.local.host_memory import budget_bytes, resident_bytes
from rllm.backends.tinker.local.logprobs import chunk_positions
from rllm.backends.tinker.local.packing import plan_packed_micro_batches
from rllm.types import TrainSequence
from rllm.types.errors import InputError

if TYPE_CHECKING:
    from rllm.backends.tinker.config import TinkerBackendConfig

logger = logging.getLogger(__name__)

GIB = 1 << 30
# CPU micro-batches of at most this many padded tokens: a CPU's matmuls are as fast per token at
# this size as at larger ones. A GPU takes the whole mini-batch at once when its memory allows
# (larger matmuls are faster there).
CPU_MICRO_BATCH_TOKENS = 1024
# ... and at most as many as keep this many bytes of activations for backward (at least one
# row): a real model's activations are large per token (SmolLM2-135M + LoRA in float32: 1.3 MiB
# a token, so 1024 tokens kept 1.3 GiB and the process peaked at 4.3 GB), while the glibc heap
# they live in keeps its high-water mark (fragmentation) above the estimate. Below this size a
# CPU step is no slower: each micro-batch's matmuls still have hundreds of rows.
CPU_ACTIVATION_BYTES = 512 << 20
# Positions of one logits chunk (local/logprobs.py): their float32 logits in this many bytes.
LOGITS_CHUNK_BYTES = {"cpu": 64 << 20, "cuda": 512 << 20}
# On CPU, freed blocks the allocator has not handed back yet: a share of the working set.
CPU_SLACK = 0.15


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know of a model (the text model's, for a vision-language one)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params: int  # every parameter, tied ones once
    trainable: int  # the parameters AdamW updates
    param_bytes: int  # bytes per parameter (the model's dtype; activations have it too)
    lora_width: int = 0  # per decoder layer, the sum of its LoRA adapters' ranks (0: full fine-tuning)
    qk_norm: bool = False  # per-head norms of queries and keys (Qwen3): they keep their inputs too

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape:
        config: Any = getattr(model, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden = int(text.hidden_size)
        heads = int(text.num_attention_heads)
        params = list(model.parameters())
        layers = int(text.num_hidden_layers)
        lora = sum(
            int(m.out_features)
            for name, m in model.named_modules()
            if ".lora_A." in f".{name}." and isinstance(m, torch.nn.Linear)
        )
        head = model.get_output_embeddings()  # pyright: ignore[reportCallIssue]
        weight = getattr(head, "weight", None)
        vocab = int(weight.shape[0]) if isinstance(weight, torch.Tensor) else int(text.vocab_size)
        return cls(
            layers=layers,
            hidden=hidden,
            intermediate=int(getattr(text, "intermediate_size", None) or 4 * hidden),
            heads=heads,
            kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
            vocab=vocab,
            params=sum(p.numel() for p in params),
            trainable=sum(p.numel() for p in params if p.requires_grad),
            param_bytes=params[0].element_size(),
            lora_width=lora // max(1, layers),
            qk_norm=any(name.endswith("q_norm") for name, _ in model.named_modules()),
        )

    @classmethod
    def llama_like(
        cls,
        *,
        layers: int,
        hidden: int,
        intermediate: int,
        heads: int,
        kv_heads: int,
        vocab: int,
        param_bytes: int,
        head_dim: int | None = None,
        tied: bool = True,
        lora_rank: int = 0,
        qk_norm: bool = False,
    ) -> ModelShape:
        """A Llama/Qwen-style decoder described by its config numbers alone (no weights)."""
        d = head_dim or hidden // heads
        q, kv = heads * d, kv_heads * d
        per_layer = hidden * q * 2 + hidden * kv * 2 + 3 * hidden * intermediate + 2 * hidden
        per_layer += 2 * d if qk_norm else 0
        params = layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden
        # LoRA on all seven linear layers: A is [r, in], B is [out, r].
        lora = lora_rank * (2 * (hidden + q) + 2 * (hidden + kv) + 3 * (hidden + intermediate)) * layers
        return cls(
            layers=layers,
            hidden=hidden,
            intermediate=intermediate,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=d,
            vocab=vocab,
            params=params + lora,
            trainable=lora if lora_rank else params,
            param_bytes=param_bytes,
            lora_width=7 * lora_rank,
            qk_norm=qk_norm,
        )

    def layer_activation_elements(self, attention_len: int = 0) -> int:
        """Values one decoder layer keeps for backward per token: the inputs of its norms and
        linear layers, the rotated queries and keys, attention's output and log-sum-exp, the MLP's
        gate, up and product; trainable norm weights also keep their normalised inputs, LoRA keeps
        each adapter's rank-wide middle; eager attention (``attention_len`` > 0) its softmax."""
        h, q, kv, d = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.head_dim
        count = 4 * h + 3 * q + 2 * kv + 4 * self.intermediate + 2 * d + self.heads
        count += self.lora_width if self.lora_width else 2 * h
        count += (q + kv) if self.qk_norm else 0
        return count + self.heads * attention_len


@dataclass(frozen=True)
class StepEstimate:
    """A training step's peak, in bytes, by what holds it."""

    resident: int  # held before the step: weights, the process itself, optimizer state so far
    gradients: int
    optimizer: int  # AdamW moments still to be allocated
    optimizer_step: int  # temporaries of the optimizer step (activations are gone by then)
    activations: int  # one micro-batch's, kept for backward, plus backward's own working set
    logits: int  # one chunk of full-vocabulary logits, its softmax and gradient
    slack: int = 0  # freed memory the CPU allocator keeps
    tokens: int = 0  # the micro-batch's padded tokens
    checkpointing: bool = False

    @property
    def total(self) -> int:
        working = max(self.activations + self.logits + self.slack, self.optimizer_step)
        return self.resident + self.gradients + self.optimizer + working

    def describe(self) -> str:
        parts = [
            f"held {gib(self.resident)}",
            f"grads {gib(self.gradients)}",
            f"AdamW {gib(self.optimizer)}",
            f"activations {gib(self.activations)} for {self.tokens} tokens"
            + (" (checkpointed)" if self.checkpointing else ""),
            f"logits {gib(self.logits)}",
        ]
        return f"{gib(self.total)} GiB ({', '.join(parts)})"


def gib(value: float) -> str:
    return f"{value / GIB:.2f}" if value >= GIB else f"{value / GIB:.3f}"


def activation_bytes(shape: ModelShape, tokens: int, *, checkpointing: bool, attention_len: int = 0) -> int:
    """Bytes backward keeps for ``tokens`` padded tokens, plus backward's working set (about one
    layer's worth), plus the final hidden states the logits are computed from."""
    layer = shape.layer_activation_elements(attention_len) * shape.param_bytes
    if checkpointing:  # each layer keeps its input; one layer at a time is recomputed
        per_token = shape.layers * shape.hidden * shape.param_bytes + 2 * layer
    else:
        per_token = (shape.layers + 1) * layer
    per_token += 3 * shape.hidden * max(4, shape.param_bytes)
    return tokens * per_token


def logits_bytes(shape: ModelShape, chunk: int) -> int:
    """One chunk's logits in the model's dtype, then float32 logits, exponentials, softmax and
    gradient (and the entropy's product when it is computed)."""
    return chunk * shape.vocab * (5 * 4 + (shape.param_bytes if shape.param_bytes != 4 else 0))


def estimate_step(
    shape: ModelShape,
    tokens: int,
    *,
    checkpointing: bool,
    chunk: int,
    resident: int,
    optimizer_allocated: bool = False,
    attention_len: int = 0,
    device_type: str = "cpu",
) -> StepEstimate:
    """The peak of a step whose micro-batches hold ``tokens`` padded tokens."""
    trainable = shape.trainable * shape.param_bytes
    activations = activation_bytes(shape, tokens, checkpointing=checkpointing, attention_len=attention_len)
    logits = logits_bytes(shape, min(chunk, tokens))  # a micro-batch never has more positions
    return StepEstimate(
        resident=resident,
        gradients=trainable,
        optimizer=0 if optimizer_allocated else 2 * trainable,
        optimizer_step=trainable,
        activations=activations,
        logits=logits,
        slack=int(CPU_SLACK * (activations + logits)) if device_type == "cpu" else 0,
        tokens=tokens,
        checkpointing=checkpointing,
    )


def fresh_resident(shape: ModelShape, *, copies: float = 1.0, runtime: int = 0) -> int:
    """What a process holds before its first step: ``copies`` of the weights (a sampler's copy of
    a LoRA model shares the frozen base: count it as trainable / params) and ``runtime``."""
    return int(copies * shape.params * shape.param_bytes) + runtime


@dataclass(frozen=True)
class StepRequest:
    """What the config and the batch ask of a step."""

    micro_batch_tokens: int | Literal["auto"]  # 0: the whole mini-batch at once
    checkpointing: bool | Literal["auto"]
    logits_chunk: int | Literal["auto"]
    batch_tokens: int  # the largest mini-batch's padded tokens
    longest: int  # the longest row: no micro-batch holds less
    attention_len: int = 0  # eager attention's row length (its softmax grows with it)


@dataclass(frozen=True)
class MemoryPlan:
    micro_batch_tokens: int
    checkpointing: bool
    logits_chunk: int
    estimate: StepEstimate
    budget: int
    warning: str = ""  # one line when an explicit setting was lowered

    def line(self) -> str:
        return (
            f"training memory: micro_batch_tokens={self.micro_batch_tokens}, gradient_checkpointing="
            f"{str(self.checkpointing).lower()}, logits in chunks of {self.logits_chunk} positions; "
            f"estimated step peak {self.estimate.describe()} of {gib(self.budget)} GiB available"
        )


def cpu_micro_batch_tokens(shape: ModelShape, attention_len: int = 0) -> int:
    """The CPU's "auto" micro-batch: ``CPU_MICRO_BATCH_TOKENS``, or fewer where that many tokens
    would keep more than ``CPU_ACTIVATION_BYTES`` of activations (without checkpointing)."""
    per_token = activation_bytes(shape, 1, checkpointing=False, attention_len=attention_len)
    return max(1, min(CPU_MICRO_BATCH_TOKENS, CPU_ACTIVATION_BYTES // max(1, per_token)))


def plan_step(
    shape: ModelShape,
    request: StepRequest,
    *,
    resident: int,
    budget: int,
    device_type: str,
    can_checkpoint: bool,
    optimizer_allocated: bool = False,
) -> MemoryPlan:
    """The micro-batch and checkpointing that fit ``budget`` bytes (see the module docstring);
    InputError with one line when not even one row fits."""
    chunk = request.logits_chunk
    if chunk == "auto":
        chunk = chunk_positions(shape.vocab, LOGITS_CHUNK_BYTES.get(device_type, LOGITS_CHUNK_BYTES["cpu"]))
    longest = max(1, request.longest)
    asked = request.micro_batch_tokens
    if asked == "auto":
        target = (
            cpu_micro_batch_tokens(shape, request.attention_len)
            if device_type == "cpu"
            else request.batch_tokens
        )
        target = min(target, request.batch_tokens)
    else:
        target = asked or request.batch_tokens
    target = max(target, longest)

    def estimate(tokens: int, ckpt: bool) -> StepEstimate:
        return estimate_step(
            shape,
            tokens,
            checkpointing=ckpt,
            chunk=chunk,
            resident=resident,
            optimizer_allocated=optimizer_allocated,
            attention_len=request.attention_len,
            device_type=device_type,
        )

    def fits(ckpt: bool) -> int:
        """The most tokens that fit with ``ckpt`` (0: not even the fixed part and the optimizer
        step). Activations (and their slack) grow with the tokens; the logits chunk is counted
        at the target's size."""
        empty, full = estimate(0, ckpt), estimate(target, ckpt)
        if empty.total > budget:
            return 0
        fixed = empty.total - empty.optimizer_step  # held, gradients, AdamW
        slack = CPU_SLACK if device_type == "cpu" else 0.0
        logits = full.logits * (1 + slack)
        per_token = max(1.0, full.activations * (1 + slack) / target)
        return max(0, int((budget - fixed - logits) // per_token))

    if request.checkpointing == "auto":
        ckpt = False
        if fits(False) < target and can_checkpoint and fits(True) > fits(False):
            ckpt = True
    else:
        ckpt = request.checkpointing
    tokens = min(target, fits(ckpt))
    if tokens < longest:
        helps = can_checkpoint and not ckpt and fits(True) >= longest
        raise InputError(_refusal(shape, estimate(longest, ckpt), budget, longest, helps))
    plan = MemoryPlan(tokens, ckpt, chunk, estimate(tokens, ckpt), budget)
    if asked != "auto" and tokens < target:
        wanted = estimate(target, ckpt)
        setting = f"micro_batch_tokens={asked}" + (" (no cut)" if asked == 0 else "")
        plan = replace(
            plan,
            warning=(
                f"backend.options.{setting} needs an estimated {gib(wanted.total)} GiB at the step's "
                f"peak, {gib(budget)} GiB available: lowered to micro_batch_tokens={tokens} "
                f"(estimated {gib(plan.estimate.total)} GiB)"
            ),
        )
    return plan


def _refusal(
    shape: ModelShape, estimate: StepEstimate, budget: int, longest: int, checkpointing_helps: bool
) -> str:
    knobs = []
    if checkpointing_helps:
        knobs.append("backend.options.gradient_checkpointing=true")
    if not shape.lora_width:
        knobs.append("backend.options.lora.rank > 0")
    knobs += ["shorter sequences", "a machine with more memory (or backend.options.memory_limit_gb)"]
    return (
        f"a training step needs an estimated {estimate.describe()} at its peak with one {longest}-token "
        f"row per micro-batch, but {gib(budget)} GiB is available: try {', '.join(knobs)}"
    )


class StepPlanner:
    """The trainer's memory plan: made before its first step, and again only when a batch needs
    more than it covers (longer rows, a larger mini-batch, a reference model still to load); the
    budget is measured once, at the first plan."""

    def __init__(
        self, model: torch.nn.Module, config: TinkerBackendConfig, device: torch.device, can_checkpoint: bool
    ) -> None:
        self.shape = ModelShape.of(model)
        self.config = config
        self.device = device
        self.can_checkpoint = can_checkpoint
        self.eager = str(getattr(getattr(model, "config", None), "_attn_implementation", "")) == "eager"
        self.plan: MemoryPlan | None = None
        self._budget: int | None = None
        self._covers = (0, 0, 0)

    def plan_for(
        self,
        batch: list[TrainSequence],
        groups: list[list[int]],
        *,
        optimizer_allocated: bool,
        reference_bytes: int = 0,
    ) -> MemoryPlan:
        longest, batch_tokens = self._sizes(batch, groups)
        return self.plan_for_sizes(
            longest, batch_tokens, optimizer_allocated=optimizer_allocated, reference_bytes=reference_bytes
        )

    def plan_for_sizes(
        self,
        longest: int,
        batch_tokens: int,
        *,
        optimizer_allocated: bool,
        reference_bytes: int = 0,
        keep: bool = True,
    ) -> MemoryPlan:
        """``plan_for`` a batch whose longest row is ``longest`` tokens and whose largest
        mini-batch pads to ``batch_tokens``. ``keep=False`` (the check when the run starts, from
        the run's expected shape): the plan and the memory available are not kept, so the first
        step plans from its own rows and what the process holds then."""
        need = (longest, batch_tokens, reference_bytes)
        if keep and self.plan is not None and all(n <= c for n, c in zip(need, self._covers, strict=True)):
            return self.plan
        budget = self._budget
        if budget is None:
            budget = budget_bytes(self.device, self.config.memory_limit_gb)
            if keep:
                self._budget = budget
        cfg = self.config
        request = StepRequest(
            micro_batch_tokens=cfg.micro_batch_tokens,
            checkpointing=cfg.gradient_checkpointing,
            logits_chunk=cfg.logits_chunk_tokens,
            batch_tokens=batch_tokens,
            longest=longest,
            attention_len=longest if self.eager else 0,
        )
        plan = plan_step(
            self.shape,
            request,
            resident=resident_bytes(self.device) + reference_bytes,
            budget=budget,
            device_type=self.device.type,
            can_checkpoint=self.can_checkpoint,
            optimizer_allocated=optimizer_allocated,
        )
        if plan.warning:
            logger.warning(plan.warning)
        logger.info(plan.line())
        if keep:
            self.plan = plan
            self._covers = tuple(max(n, c) for n, c in zip(need, self._covers, strict=True))  # pyright: ignore[reportAttributeAccessIssue]
        return plan

    def _sizes(self, batch: list[TrainSequence], groups: list[list[int]]) -> tuple[int, int]:
        """(the longest row, the largest mini-batch's padded tokens) as the trainer lays them out."""
        longest = batch_tokens = 0
        for group in groups:
            if not group:
                continue
            if self.config.pack_tokens:
                rows = plan_packed_micro_batches(batch, group, self.config.pack_tokens, 0)[0]
                widths = [sum(len(batch[i].input_ids) for i in row) for row in rows]
            else:
                widths = [len(batch[i].input_ids) for i in group]
            longest = max(longest, max(widths))
            batch_tokens = max(batch_tokens, len(widths) * max(widths))
        return longest, batch_tokens


__all__ = [
    "CPU_ACTIVATION_BYTES",
    "CPU_MICRO_BATCH_TOKENS",
    "GIB",
    "MemoryPlan",
    "ModelShape",
    "StepEstimate",
    "StepPlanner",
    "StepRequest",
    "activation_bytes",
    "cpu_micro_batch_tokens",
    "estimate_step",
    "fresh_resident",
    "logits_bytes",
    "plan_step",
]
