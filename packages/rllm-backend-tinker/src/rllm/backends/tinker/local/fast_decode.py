"""The local sampler's own decode step for Llama-family text models on the CPU (``FastDecoder``).

A decode step at 32 rows is one token per row: its matrix products are small and bound by
memory, and transformers' forward spends as long again around them (per layer: separate q, k, v,
gate and up products, norms and rotary in many small ops, SDPA's flash kernel, which is slow for
one query token on a CPU, and a mask rebuilt per pass). This step does the same arithmetic in
fewer, larger operations:

- each layer's q/k/v projections are one product and gate/up another, with LoRA adapters merged
  into the weights (``W + scale * B @ A``, once per weight version);
- a bfloat16 weight is packed once into oneDNN's blocked layout: the same results as
  ``F.linear`` bit for bit, without reordering the weight on every call (which is most of an
  unpacked product's time at 32 rows; 1.6x faster);
- attention is two batched products over the grouped heads and one softmax in float32, with
  the padding mask built once per step;
- with the native kernels (``native_kernels.py``, C built on first use) a layer's glue is three
  calls instead: residual add + RMSNorm, SiLU(gate) * up, and attention with the head norms,
  rotary and the cache write (34 -> 21 ms a bf16 step at 32 rows on SmolLM2); they also take
  several tokens a row (``prefill``: the prompt endings after a shared beginning).

It reads and grows transformers' own ``DynamicCache`` (prefill, joins and dropped rows stay
transformers' and ``joining.py``'s), so a row's tokens are those of transformers' forward up to
float rounding (float32: identical logprobs to 1e-5; ``tests/test_fast_decode.py``). Anything it
does not know (another architecture, sliding windows, M-RoPE, DoRA, a GPU) keeps transformers'
forward: ``FastDecoder.build`` returns None with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rllm.backends.tinker.local import native_kernels
from rllm.backends.tinker.local.joining import can_extend
from rllm.backends.tinker.local.native_kernels import DecodeKernels
from rllm.types.errors import InputError

logger = logging.getLogger(__name__)

# Text decoders whose layer is: RMSNorm, q/k/v (Qwen3: with per-head RMSNorm on q and k), rotary,
# grouped-query attention, o; RMSNorm, SiLU-gated MLP; residuals around both.
ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})

Linear = Callable[[torch.Tensor], torch.Tensor]


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> Linear:
    """``x -> F.linear(x, weight, bias)`` for 2-D ``x``. A bfloat16 weight is packed once into
    oneDNN's blocked layout (sized for ``rows`` rows; any count works, with the same results as
    ``F.linear``); float32 keeps ``F.linear``: MKL's packed product only pays at exactly the
    packed row count, and oneDNN's float32 one differs from it by ~1e-4."""
    weight = weight.detach().contiguous()
    bias = bias.detach().contiguous() if bias is not None else None
    try:
        if weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
            return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    except (RuntimeError, AttributeError) as exc:  # a torch built without oneDNN
        logger.debug("packed linear unavailable (%s): F.linear", exc)
    return lambda x: F.linear(x, weight, bias)


def effective_weight(module: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``module``'s weight and bias as its forward applies them: a PEFT LoRA layer's base weight
    plus each active adapter's ``scale * B @ A``. Raises InputError for what a merged weight
    cannot express (DoRA, adapters on the bias, another layer type)."""
    if isinstance(module, nn.Linear):
        return module.weight, module.bias
    base = getattr(module, "base_layer", None)
    if not isinstance(base, nn.Linear) or not hasattr(module, "get_delta_weight"):
        raise InputError(f"{type(module).__name__} is not a linear layer")
    weight = base.weight
    if getattr(module, "merged", False) or getattr(module, "disable_adapters", False):
        return weight, base.bias  # merged: the base already holds the adapters
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if module.use_dora.get(name, False) or getattr(module, "lora_bias", {}).get(name, False):
            raise InputError(f"adapter {name!r} uses DoRA or a LoRA bias")
        weight = weight + module.get_delta_weight(name).to(weight.dtype)
    return weight, base.bias


def _joined(modules: list[Any], rows: int) -> Linear:
    """One packed product for several linear layers that read the same input (outputs side by side)."""
    parts = [effective_weight(m) for m in modules]
    if len(parts) == 1:  # no copy of an unmerged weight
        return pack_linear(*parts[0], rows)
    weight = torch.cat([w for w, _ in parts])
    biases = [b for _, b in parts]
    if all(b is None for b in biases):
        bias = None
    else:
        bias = torch.cat(
            [b if b is not None else w.new_zeros(w.shape[0]) for (w, _), b in zip(parts, biases, strict=True)]
        )
    return pack_linear(weight, bias, rows)


# A layer's keys and values grow into buffers with this many spare columns, so a decode step
# writes one column instead of copying the whole cache (``torch.cat``: a fifth of a step at 32
# rows and 60 columns). Attention runs over the whole buffer, spare columns masked: a product
# over a contiguous buffer costs less than one over a narrower view (which torch copies first).
ROOM = 32
# The longest prompt endings ``prefill`` takes through the native kernels: their attention runs
# query by query, which past this many tokens a row is slower than transformers' batched
# attention (SmolLM2, 16 rows, bf16: 35 vs 61 ms at 8 tokens, 108 vs 120 at 32, 412 vs 370 at 128;
# benchmarks/history/issue-48.md, "round 6").
PREFILL_STEPS = 64


def _reserve(layer: object, steps: int = 1) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
    """Make room for ``steps`` more columns in a ``DynamicLayer``: its buffers [B, kv_heads, W,
    dim] and the first column ``c`` the steps' keys and values go to (the caller writes them). The
    layer's keys and values become views of the buffers' first ``c + steps`` columns (kept on it as
    ``rllm_buffers``); whoever replaces them (dropped rows, joins) leaves tensors that are not, and
    the next step moves them into fresh buffers."""
    old_keys, old_values = layer.keys, layer.values  # type: ignore[attr-defined]
    buffers = getattr(layer, "rllm_buffers", None)
    width = old_keys.shape[-2]
    if not (
        buffers is not None
        and old_keys.data_ptr() == buffers[0].data_ptr()
        and old_values.data_ptr() == buffers[1].data_ptr()
        and old_keys.shape[0] == buffers[0].shape[0]
        and old_keys.stride() == buffers[0].stride()
        and width + steps <= buffers[0].shape[-2]
    ):
        rows, heads, _, dim = old_keys.shape
        # Zeros, not garbage: masked columns still enter the torch step's product (0 * NaN would not vanish).
        buffers = (
            old_keys.new_zeros((rows, heads, width + steps + ROOM, dim)),
            old_values.new_zeros((rows, heads, width + steps + ROOM, dim)),
        )
        buffers[0][:, :, :width] = old_keys
        buffers[1][:, :, :width] = old_values
        layer.rllm_buffers = buffers  # type: ignore[attr-defined]
    end = width + steps
    layer.keys, layer.values = buffers[0][:, :, :end], buffers[1][:, :, :end]  # type: ignore[attr-defined]
    return buffers, width


def _mask(attention: torch.Tensor, width: int) -> torch.Tensor:
    """[B, 1, 1, width] float32: 0 where a row sees the column (``attention`` [B, T] is 1), the
    float32 minimum elsewhere (the buffer's spare columns past T included)."""
    mask = torch.full((attention.shape[0], width), torch.finfo(torch.float32).min, device=attention.device)
    mask[:, : attention.shape[1]].masked_fill_(attention != 0, 0.0)
    return mask[:, None, None, :]


@dataclass
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: Linear
    o: Linear
    gate_up: Linear
    down: Linear
    q_norm: torch.Tensor | None  # Qwen3: RMSNorm over each head's q and k before rotary
    k_norm: torch.Tensor | None


def unsupported(model: Any, device: torch.device) -> str:
    """Why ``FastDecoder`` cannot run ``model`` on ``device`` ("" when it can)."""
    if device.type != "cpu":
        return f"device {device.type} (the packed kernels are the CPU's)"
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        return f"architecture {kind!r} (known: {', '.join(sorted(ARCHITECTURES))})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {getattr(config, 'hidden_act', None)!r}"
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True):
        return "a sliding attention window"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        return "layers other than full attention"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return f"{type(model).__name__} has no decoder layers with rotary embeddings"
    return ""


class FastDecoder:
    """One decode step of a Llama-family model over transformers' ``DynamicCache`` (see the module
    docstring). Built per weight version: ``build`` again after the weights change."""

    def __init__(self, model: Any, rows: int, kernels: DecodeKernels | None = None) -> None:
        # ``model``: a transformers causal LM of ARCHITECTURES (attributes read by name).
        config, inner = model.config, model.model
        self.heads: int = config.num_attention_heads
        self.kv_heads: int = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim: int = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.intermediate: int = config.intermediate_size
        self.eps: float = config.rms_norm_eps
        self.embed: nn.Module = inner.embed_tokens
        self.rotary: nn.Module = inner.rotary_emb
        self.final_norm: torch.Tensor = inner.norm.weight
        # The native kernels where they take this dtype and head size (else torch operations).
        supported = kernels is not None and kernels.supports(self.final_norm.dtype, self.head_dim)
        self.kernels: DecodeKernels | None = (
            kernels if supported and self.heads % self.kv_heads == 0 else None
        )
        self.head = _joined([model.lm_head], rows)
        self.layers: list[_Layer] = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            self.layers.append(
                _Layer(
                    input_norm=layer.input_layernorm.weight,
                    post_norm=layer.post_attention_layernorm.weight,
                    qkv=_joined([attn.q_proj, attn.k_proj, attn.v_proj], rows),
                    o=_joined([attn.o_proj], rows),
                    gate_up=_joined([mlp.gate_proj, mlp.up_proj], rows),
                    down=_joined([mlp.down_proj], rows),
                    q_norm=q_norm.weight if q_norm is not None else None,
                    k_norm=k_norm.weight if k_norm is not None else None,
                )
            )

    @classmethod
    def build(
        cls, model: nn.Module, device: torch.device, rows: int, native: bool = True
    ) -> tuple[FastDecoder | None, str]:
        """The decoder for ``model``'s current weights, or None and the reason it cannot run; with
        the native kernels (``native_kernels.py``) where they load and ``native`` holds."""
        get_base = getattr(model, "get_base_model", None)  # a PEFT model: its transformers model
        base: Any = get_base() if callable(get_base) else model
        reason = unsupported(base, device)
        if reason:
            return None, reason
        try:
            return cls(base, rows, native_kernels.load() if native else None), ""
        except (InputError, AttributeError) as exc:
            return None, str(exc)

    def usable(self, cache: object, positions: torch.Tensor) -> bool:
        """Whether this step can run on ``cache`` (plain dynamic layers) and ``positions`` (1-D
        rotary positions, not M-RoPE's three axes)."""
        return positions.dim() == 2 and can_extend(cache)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # transformers' LlamaRMSNorm: normalised in float32, cast back, then scaled.
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    def step(
        self, tokens: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: object
    ) -> torch.Tensor:
        """The logits [B, vocab] after ``tokens`` [B, 1] at ``positions`` [B, 1], each row seeing
        the columns where ``attention`` [B, T] (the cache's width + 1) is 1; the cache grows by
        one column (the tokens' keys and values)."""
        if self.kernels is not None:
            return self._native_step(self.kernels, tokens, attention, positions, cache)
        rows, heads, kv_heads, dim = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
        group = heads // kv_heads
        h = self.embed(tokens)[:, 0]  # [B, hidden]
        cos, sin = self.rotary(h[:, None], positions)  # [B, 1, dim]: broadcast over the heads
        half = dim // 2
        masks: dict[int, torch.Tensor] = {}  # by buffer width: the columns each row may not see
        scale = dim**-0.5
        for layer, cached in zip(self.layers, cache.layers, strict=True):  # type: ignore[attr-defined]
            x = self._norm(h, layer.input_norm)
            qkv = layer.qkv(x).view(rows, heads + 2 * kv_heads, dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                qk = torch.cat(
                    [
                        self._norm(qkv[:, :heads], layer.q_norm),
                        self._norm(qkv[:, heads:-kv_heads], layer.k_norm),
                    ],
                    1,
                )
            else:
                qk = qkv[:, : heads + kv_heads]
            qk = qk * cos + torch.cat([-qk[..., half:], qk[..., :half]], -1) * sin
            (keys, values), column = _reserve(cached)  # [B, kv_heads, W, dim]
            keys[:, :, column] = qk[:, heads:]
            values[:, :, column] = qkv[:, heads + kv_heads :]
            mask = masks.get(keys.shape[-2])
            if mask is None:
                mask = masks[keys.shape[-2]] = _mask(attention, keys.shape[-2])
            query = qk[:, :heads].reshape(rows, kv_heads, group, dim)  # head i reads kv head i // group
            scores = torch.matmul(query, keys.transpose(-1, -2)).float() * scale + mask
            weights = torch.softmax(scores, -1).to(values.dtype)
            out = torch.matmul(weights, values).reshape(rows, heads * dim)
            h = h + layer.o(out)
            gate_up = layer.gate_up(self._norm(h, layer.post_norm))
            gate, up = gate_up[:, : self.intermediate], gate_up[:, self.intermediate :]
            h = h + layer.down(F.silu(gate) * up)
        return self.head(self._norm(h, self.final_norm))

    def prefill(
        self, tokens: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: object
    ) -> torch.Tensor | None:
        """Like ``step`` for several tokens a row (``tokens`` and ``positions`` [B, S], each token
        seeing the columns before it and itself where ``attention`` [B, T + S] is 1): the last
        token's logits [B, vocab], the cache grown by S columns. None where transformers' forward
        is the one to run (no native kernels, or S > PREFILL_STEPS): the caller runs that."""
        if self.kernels is None or tokens.shape[1] > PREFILL_STEPS:
            return None
        return self._native_step(self.kernels, tokens, attention, positions, cache)

    def _native_step(
        self,
        kernels: DecodeKernels,
        tokens: torch.Tensor,
        attention: torch.Tensor,
        positions: torch.Tensor,
        cache: object,
    ) -> torch.Tensor:
        """``step`` (and ``prefill``) with a layer's glue in three native calls: attend (head norms,
        rotary, the cache columns, attention), add_norm (residual add + the next RMSNorm), silu_mul.
        A row's S tokens are S rows of the products."""
        rows, steps = tokens.shape
        h = self.embed(tokens).reshape(rows * steps, -1).contiguous()  # a fresh tensor: updated in place
        cos, sin = self.rotary(h.view(rows, steps, -1), positions)
        rotary = (cos.reshape(rows * steps, -1).contiguous(), sin.reshape(rows * steps, -1).contiguous())
        attention = attention.to(torch.int64).contiguous()
        x = torch.empty_like(h)  # the current normed input
        out = h.new_empty((rows * steps, self.heads * self.head_dim))
        act = h.new_empty((rows * steps, self.intermediate))
        kernels.add_norm(h, None, self.layers[0].input_norm, x, self.eps)
        for index, (layer, cached) in enumerate(zip(self.layers, cache.layers, strict=True)):  # type: ignore[attr-defined]
            buffers, column = _reserve(cached, steps)
            kernels.attend(
                layer.qkv(x),
                rotary,
                (layer.q_norm, layer.k_norm),
                self.eps,
                buffers,
                column,
                attention,
                out,
                self.heads,
                steps,
            )
            kernels.add_norm(h, layer.o(out), layer.post_norm, x, self.eps)
            kernels.silu_mul(layer.gate_up(x), act)
            following = self.layers[index + 1].input_norm if index + 1 < len(self.layers) else self.final_norm
            kernels.add_norm(h, layer.down(act), following, x, self.eps)
        return self.head(x.view(rows, steps, -1)[:, -1].contiguous())  # the last token's logits
