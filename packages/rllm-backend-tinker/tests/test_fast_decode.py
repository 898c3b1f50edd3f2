"""The local sampler's own decode step (local/fast_decode.py) against transformers' forward, with
real torch on small models built here (random weights, nothing downloaded): Llama with grouped
query heads, Qwen2 with q/k/v biases, Qwen3 with per-head q/k norms, a PEFT LoRA model; rows with
left padding and masked holes; bfloat16's packed products; and the sampler engine, whose decode
must follow its weights across a weight update (the packed copy is rebuilt per version). Each
comparison runs twice: with the native kernels (decode_kernels.c, compiled here: CI installs a C
compiler) and with the step's torch operations."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
)

from rllm.backends.tinker.local import native_kernels
from rllm.backends.tinker.local.fast_decode import PREFILL_STEPS, FastDecoder, pack_linear
from rllm.backends.tinker.local.generation import SamplerEngine
from rllm.backends.tinker.local.generation_types import GenerationRequest
from rllm.backends.tinker.local.model import load_pretrained, load_tokenizer

CPU = torch.device("cpu")
SHAPE = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # two query heads per key/value head
    head_dim=16,
    max_position_embeddings=256,
)
CONFIGS: dict[str, PretrainedConfig] = {
    "llama-gqa": LlamaConfig(**SHAPE),
    "qwen2-bias": Qwen2Config(**SHAPE),  # q/k/v projections with biases
    "qwen3-qk-norm": Qwen3Config(**SHAPE),  # RMSNorm over each head's q and k
}
PROMPTS = [[5, 9, 11, 3, 7, 2], [8, 1], [4, 4, 6, 10]]  # left-padded to the longest


def _model(config: PretrainedConfig, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa")
    with torch.no_grad():  # norms away from 1, so a norm applied wrongly shows
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model.to(dtype).eval()


def _left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The ids and mask of ``prompts`` left-padded to the longest (pad id 0)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    return ids, torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])


def _forward(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    attention: torch.Tensor,
    positions: torch.Tensor,
    cache: object,
) -> torch.Tensor:
    """transformers' forward of ``tokens`` after ``cache`` (grown): the last token's logits."""
    out = model(
        input_ids=tokens,
        attention_mask=attention,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    )
    return out.logits[:, -1]


def _decode_both(
    model: torch.nn.Module, fast: FastDecoder, steps: int = 4
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Greedy decode of PROMPTS with transformers' forward and with ``fast`` from the same prefill;
    one row gets a masked hole (a fused join's) after the prefill. The two sides' logprobs per step."""
    ids, attention = _left_padded(PROMPTS)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True)
        attention[0, 2] = 0  # a hole: row 0 no longer sees its third token
        theirs, ours = out.past_key_values, copy.deepcopy(out.past_key_values)
        tokens = out.logits[:, -1].argmax(-1, keepdim=True)
        pairs = []
        for _ in range(steps):
            attention = torch.cat([attention, attention.new_ones((len(PROMPTS), 1))], -1)
            positions = positions[:, -1:] + 1
            want = _forward(model, tokens, attention, positions, theirs)
            got = fast.step(tokens, attention, positions, ours)
            pairs.append((got.float().log_softmax(-1), want.float().log_softmax(-1)))
            tokens = want.argmax(-1, keepdim=True)
    return pairs


def _build(model: torch.nn.Module, native: bool) -> FastDecoder:
    fast, reason = FastDecoder.build(model, CPU, rows=8, native=native)
    assert fast is not None, reason
    assert (fast.kernels is not None) == native, native_kernels.build()[1]  # native: the kernels ran
    return fast


NATIVE = pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])


@NATIVE
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_fast_step_gives_transformers_logprobs_in_float32(name: str, native: bool) -> None:
    model = _model(CONFIGS[name])
    fast = _build(model, native)
    for got, want in _decode_both(model, fast):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_prefill_through_the_kernels_gives_transformers_logits_and_cache(name: str) -> None:
    """The sampler's prefill of left-padded prompt endings after a shared beginning
    (decoding.py): several tokens a row through ``FastDecoder.prefill``, against transformers'
    forward from the same beginning; then a decode step from each cache."""
    model = _model(CONFIGS[name])
    fast = _build(model, native=True)
    beginning = [5, 9, 11]
    ids, own = _left_padded([[3, 7, 2], [8], [4, 6]])
    attention = torch.cat([own.new_ones((3, len(beginning))), own], -1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, len(beginning) :]
    with torch.inference_mode():
        prefix = model(input_ids=torch.tensor([beginning]), use_cache=True).past_key_values
        prefix.batch_repeat_interleave(3)
        theirs, ours = prefix, copy.deepcopy(prefix)
        want = _forward(model, ids, attention, positions, theirs)
        got = fast.prefill(ids, attention, positions, ours)
        assert got is not None
        torch.testing.assert_close(got.log_softmax(-1), want.log_softmax(-1), atol=1e-5, rtol=0)
        tokens = want.argmax(-1, keepdim=True)
        attention = torch.cat([attention, attention.new_ones((3, 1))], -1)
        positions = positions[:, -1:] + 1
        got, want = (
            fast.step(tokens, attention, positions, ours),
            _forward(model, tokens, attention, positions, theirs),
        )
        torch.testing.assert_close(got.log_softmax(-1), want.log_softmax(-1), atol=1e-5, rtol=0)
    torch_only = _build(model, native=False)
    assert torch_only.prefill(ids, attention, positions, ours) is None  # torch operations: no prefill
    long = torch.zeros((3, PREFILL_STEPS + 1), dtype=torch.long)  # long endings: transformers' attention
    assert fast.prefill(long, torch.ones((3, attention.shape[1] + long.shape[1])), long, ours) is None


@NATIVE
def test_lora_adapters_are_merged_into_the_fast_step(native: bool) -> None:
    base = _model(CONFIGS["llama-gqa"])
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    # init_lora_weights=False: B is random too, so the adapters change every product.
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    )
    model.eval()
    fast = _build(model, native)
    plain = _build(_model(CONFIGS["llama-gqa"]), native)
    for (got, want), (unmerged, _) in zip(_decode_both(model, fast), _decode_both(model, plain), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert (unmerged - want).abs().max() > 1e-3  # the adapters matter: without them it differs


@NATIVE
def test_bfloat16_packed_products_equal_f_linear_and_the_step_stays_close(native: bool) -> None:
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no oneDNN bfloat16 kernels (the fast step uses F.linear there)")
    torch.manual_seed(1)
    weight, bias = torch.randn(96, 64).bfloat16(), torch.randn(96).bfloat16()
    linear = pack_linear(weight, bias, rows=32)
    for rows in (1, 5, 32, 40):
        x = torch.randn(rows, 64).bfloat16()
        assert torch.equal(linear(x), torch.nn.functional.linear(x, weight, bias))
    model = _model(CONFIGS["qwen3-qk-norm"], torch.bfloat16)
    fast = _build(model, native)
    for got, want in _decode_both(model, fast):
        # bf16 rounds differently in transformers' SDPA and here; both are bf16 (~3 digits).
        assert (got - want).abs().mean() < 0.02


def test_models_it_does_not_know_keep_transformers_forward() -> None:
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=50))
    fast, reason = FastDecoder.build(gpt2, CPU, rows=8)
    assert fast is None and "gpt2" in reason
    mistral = AutoModelForCausalLM.from_config(MistralConfig(**SHAPE, sliding_window=4))
    assert FastDecoder.build(mistral, CPU, rows=8) == (None, "a sliding attention window")
    fast, reason = FastDecoder.build(_model(CONFIGS["llama-gqa"]), torch.device("cuda"), rows=8)
    assert fast is None and "cuda" in reason
    dora = get_peft_model(
        _model(CONFIGS["llama-gqa"]), LoraConfig(r=2, target_modules=["q_proj"], use_dora=True)
    )
    fast, reason = FastDecoder.build(dora, CPU, rows=8)  # a magnitude vector: no merged weight says it
    assert fast is None and "DoRA" in reason


def _greedy(engine: SamplerEngine, prompt: list[int]) -> tuple[list[int], list[float]]:
    request = GenerationRequest(prompt_ids=prompt, max_tokens=6, temperature=0.0, ignore_eos=True)
    sequence = engine.submit(request).result(timeout=120)[0]
    return sequence.completion_ids, sequence.completion_logprobs


def test_the_engine_decodes_with_the_fast_step_and_follows_a_weight_update(tiny_model_path: Path) -> None:
    """Sampled logprobs equal transformers' scoring of the same tokens, before and after a weight
    update: a packed copy left from the old weights would sample the old model."""
    model = load_pretrained(str(tiny_model_path), torch.float32, CPU).eval()
    engine = SamplerEngine(model, load_tokenizer(str(tiny_model_path)), CPU, max_batch=8)
    engine.start()
    try:
        prompt = [1, 5, 6, 7]
        head = model.get_output_embeddings().weight

        def perturb() -> None:
            with torch.no_grad():
                head.add_(torch.randn_like(head))

        before = None
        for update in range(2):
            tokens, logprobs = _greedy(engine, prompt)
            assert engine.fast is not None and engine.fast is not before  # built for this version
            scored = engine.prompt_logprobs(prompt + tokens)[len(prompt) :]
            assert scored == pytest.approx(logprobs, abs=1e-4), f"after {update} updates"
            before = engine.fast
            engine.update_weights(perturb)
    finally:
        engine.stop()


def test_a_fast_step_that_cannot_be_built_leaves_transformers_forward_and_says_so(
    tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no oneDNN kernel for this CPU")

    monkeypatch.setattr(FastDecoder, "build", broken)
    model = load_pretrained(str(tiny_model_path), torch.float32, CPU).eval()
    engine = SamplerEngine(model, load_tokenizer(str(tiny_model_path)), CPU, max_batch=8)
    engine.start()
    try:
        with caplog.at_level(logging.WARNING):
            prompt = [1, 5, 6, 7]
            tokens, logprobs = _greedy(engine, prompt)
        assert engine.fast is None and not engine.fast_decode
        assert engine.prompt_logprobs(prompt + tokens)[len(prompt) :] == pytest.approx(logprobs, abs=1e-4)
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(lines) == 1 and "no oneDNN kernel" in lines[0] and "sampler_fast_decode=false" in lines[0]
    finally:
        engine.stop()
