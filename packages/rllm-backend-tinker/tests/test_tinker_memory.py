"""The training step's memory estimate and plan (local/memory.py): it grows as a step's memory
does, it matches what autograd keeps, and a step that cannot fit is lowered or refused with one
line, against a memory limit the test passes in (never the machine's)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.backends.tinker.config import parse_config
from rllm.backends.tinker.local import memory
from rllm.backends.tinker.local.memory import (
    GIB,
    ModelShape,
    StepRequest,
    activation_bytes,
    estimate_step,
    fresh_resident,
    plan_step,
)
from rllm.backends.tinker.local.model import load_policy
from rllm.backends.tinker.local.trainer import LocalTrainer
from rllm.types import FloatArray, TokenArray, TrainSequence
from rllm.types.errors import ConfigError, InputError

SMOLLM2 = {"layers": 30, "hidden": 576, "intermediate": 1536, "heads": 9, "kv_heads": 3, "vocab": 49152}


def smollm2(param_bytes: int = 4, lora_rank: int = 16, **changes: int) -> ModelShape:
    return ModelShape.llama_like(**{**SMOLLM2, **changes}, param_bytes=param_bytes, lora_rank=lora_rank)


def estimate(
    shape: ModelShape, tokens: int, checkpointing: bool = False, chunk: int = 256
) -> memory.StepEstimate:
    resident = fresh_resident(shape, runtime=GIB // 2)
    return estimate_step(shape, tokens, checkpointing=checkpointing, chunk=chunk, resident=resident)


def peak(shape: ModelShape, tokens: int, checkpointing: bool = False, chunk: int = 256) -> int:
    return estimate(shape, tokens, checkpointing, chunk).total


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 48),
    hidden=st.sampled_from([64, 576, 1024, 4096]),
    vocab=st.integers(100, 200_000),
    tokens=st.integers(1, 32_768),
    rank=st.sampled_from([0, 8, 16]),
    ckpt=st.booleans(),
)
def test_the_estimate_grows_with_tokens_vocabulary_and_layers(
    layers: int, hidden: int, vocab: int, tokens: int, rank: int, ckpt: bool
) -> None:
    shape = smollm2(layers=layers, hidden=hidden, vocab=vocab, lora_rank=rank)
    base = peak(shape, tokens, ckpt)
    # More tokens: more activations; the peak grows unless the optimizer step is the peak.
    more = estimate(shape, tokens + 1, ckpt)
    assert more.activations > estimate(shape, tokens, ckpt).activations and more.total >= base
    assert peak(shape, 2 * tokens + 4096, ckpt) > base or rank == 0
    assert peak(smollm2(layers=layers + 1, hidden=hidden, vocab=vocab, lora_rank=rank), tokens, ckpt) > base
    assert (
        peak(smollm2(layers=layers, hidden=hidden, vocab=vocab + 1000, lora_rank=rank), tokens, ckpt) > base
    )
    # A wider logits chunk holds more (up to the micro-batch's own positions).
    many = tokens + 512
    wider = estimate(shape, many, ckpt, chunk=512)
    assert wider.logits > estimate(shape, many, ckpt).logits and wider.total >= peak(shape, many, ckpt)
    assert (
        estimate(shape, min(tokens, 256), ckpt, chunk=512).logits
        == estimate(shape, min(tokens, 256), ckpt).logits
    )
    if not ckpt and layers > 2:  # checkpointing keeps one value per layer and token, not all of them
        recomputed = estimate(shape, tokens, True)
        assert recomputed.activations < estimate(shape, tokens).activations and recomputed.total <= base
    if rank:  # full fine-tuning adds every weight's gradient and two AdamW moments
        assert peak(smollm2(layers=layers, hidden=hidden, vocab=vocab, lora_rank=0), tokens, ckpt) > base


def test_smollm2_figures_are_what_its_shape_says() -> None:
    """135M parameters; LoRA rank 16 on every linear layer trains 4.9M of them."""
    assert smollm2(lora_rank=0).params == 134_515_008
    assert smollm2().trainable == 4_884_480


def saved_bytes(model: torch.nn.Module, tokens: torch.Tensor) -> int:
    """Bytes autograd keeps for backward (distinct storages, parameters excluded)."""
    storages: dict[int, int] = {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=tokens, use_cache=False)
    return sum(size for ptr, size in storages.items() if ptr not in params)


def llama(layers: int, attention: str, rank: int) -> torch.nn.Module:
    config = LlamaConfig(
        hidden_size=192, intermediate_size=512, num_attention_heads=6, num_key_value_heads=2,
        num_hidden_layers=layers, vocab_size=300, head_dim=32,
    )  # fmt: skip
    config._attn_implementation = attention
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    if rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=rank, target_modules="all-linear", task_type="CAUSAL_LM"))
    return model


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("rank", [0, 8])
def test_the_per_token_activations_match_what_autograd_keeps(attention: str, rank: int) -> None:
    """One decoder layer's saved tensors per token, counted by autograd's saved-tensor hooks
    (three layers minus two), against the estimate's formula."""
    tokens = torch.randint(0, 300, (3, 48), generator=torch.Generator().manual_seed(0))
    per_layer = saved_bytes(llama(3, attention, rank), tokens) - saved_bytes(
        llama(2, attention, rank), tokens
    )
    measured = per_layer / tokens.numel()
    shape = ModelShape.of(llama(2, attention, rank))
    assert shape.lora_width == 7 * rank and (shape.trainable < shape.params) == bool(rank)
    formula = shape.layer_activation_elements(48 if attention == "eager" else 0) * 4
    assert abs(formula - measured) / measured < 0.1, (formula, measured)


def request(
    micro: int | str = "auto", ckpt: bool | str = "auto", batch: int = 8192, longest: int = 128
) -> StepRequest:
    return StepRequest(
        micro_batch_tokens=micro,  # pyright: ignore[reportArgumentType]
        checkpointing=ckpt,  # pyright: ignore[reportArgumentType]
        logits_chunk="auto",
        batch_tokens=batch,
        longest=longest,
    )


def plan(
    budget_gib: float, req: StepRequest, device: str = "cpu", shape: ModelShape | None = None
) -> memory.MemoryPlan:
    shape = shape or smollm2()
    return plan_step(
        shape,
        req,
        resident=fresh_resident(shape, runtime=GIB // 2),
        budget=int(budget_gib * GIB),
        device_type=device,
        can_checkpoint=True,
    )


# rllm.tiny's model (the main job's): 2 layers, hidden 128, 2 heads.
TINY = {"layers": 2, "hidden": 128, "intermediate": 256, "heads": 2, "kv_heads": 2, "vocab": 300}


def test_auto_takes_the_cpu_micro_batch_when_it_fits_and_says_nothing_more() -> None:
    chosen = plan(20, request())
    assert chosen.micro_batch_tokens == memory.cpu_micro_batch_tokens(smollm2())
    assert not chosen.checkpointing and not chosen.warning
    assert chosen.estimate.total <= 4 * GIB  # SmolLM2 + LoRA 16 in float32 on CPU
    assert plan(20, request(batch=300)).micro_batch_tokens == 300  # never more than the mini-batch
    assert plan(80, request(), device="cuda").micro_batch_tokens == 8192  # a GPU takes it all at once


def test_the_cpu_micro_batch_keeps_a_real_models_activations_under_the_cap() -> None:
    """Auto on CPU: at most CPU_MICRO_BATCH_TOKENS, and no more tokens than keep
    CPU_ACTIVATION_BYTES of activations (SmolLM2-135M's 1.3 MiB a token: 398 tokens with LoRA,
    which is 3 of the learning benchmark's 104-token rows); a tiny model takes the whole 1024."""
    cap = memory.CPU_ACTIVATION_BYTES
    for shape in (smollm2(), smollm2(lora_rank=0), smollm2(param_bytes=2)):
        tokens = memory.cpu_micro_batch_tokens(shape)
        assert tokens < memory.CPU_MICRO_BATCH_TOKENS
        assert activation_bytes(shape, tokens, checkpointing=False) <= cap
        assert activation_bytes(shape, tokens + 1, checkpointing=False) > cap
        assert plan(20, request(), shape=shape).micro_batch_tokens == tokens
    assert memory.cpu_micro_batch_tokens(smollm2()) == 398
    tiny = ModelShape.llama_like(**TINY, param_bytes=4)
    assert memory.cpu_micro_batch_tokens(tiny) == memory.CPU_MICRO_BATCH_TOKENS
    assert plan(20, request(), shape=tiny).micro_batch_tokens == memory.CPU_MICRO_BATCH_TOKENS
    # Eager attention's softmax grows with the row: longer rows, fewer tokens.
    assert memory.cpu_micro_batch_tokens(smollm2(), attention_len=4096) < memory.cpu_micro_batch_tokens(
        smollm2()
    )
    # A row whose activations alone exceed the cap is still one micro-batch (never refused for it).
    long_rows = plan(20, request(longest=2048))
    assert long_rows.micro_batch_tokens == 2048 and not long_rows.warning
    assert plan(80, request(), device="cuda").micro_batch_tokens == 8192  # no cap on a GPU


def test_the_learning_benchmarks_step_is_planned_under_4_gib_on_cpu() -> None:
    """SmolLM2 + LoRA 16, 64 rows of 104 tokens, with what ``rllm train`` holds (the trainer's
    weights, the sampler's LoRA copy, the runtime): the plan's estimate is well under 4 GiB."""
    shape = smollm2()
    resident = fresh_resident(shape, copies=1 + shape.trainable / shape.params, runtime=GIB // 2)
    chosen = plan_step(
        shape,
        StepRequest("auto", "auto", "auto", batch_tokens=64 * 104, longest=104),
        resident=resident,
        budget=20 * GIB,
        device_type="cpu",
        can_checkpoint=True,
    )
    assert chosen.micro_batch_tokens == 398 and not chosen.checkpointing
    assert chosen.estimate.activations <= memory.CPU_ACTIVATION_BYTES
    assert chosen.estimate.total <= 2.5 * GIB


def test_auto_turns_checkpointing_on_when_memory_would_shrink_the_micro_batch() -> None:
    auto = memory.cpu_micro_batch_tokens(smollm2())
    roomy = plan(20, request())
    tight_budget = (roomy.estimate.total - roomy.estimate.activations // 2) / GIB
    tight = plan(tight_budget, request())
    assert tight.checkpointing and tight.micro_batch_tokens == auto
    assert tight.estimate.total <= tight_budget * GIB
    without = plan(tight_budget, request(ckpt=False))
    assert not without.checkpointing and without.micro_batch_tokens < auto


@pytest.mark.parametrize("micro", [4096, 0])
def test_an_explicit_micro_batch_that_cannot_fit_is_lowered_with_one_line(micro: int) -> None:
    wanted = micro or 8192
    budget = peak(smollm2(), wanted // 2, chunk=341) / GIB  # 341: the auto chunk for SmolLM2's vocabulary
    lowered = plan(budget, request(micro=micro, ckpt=False))
    assert wanted // 2 - 8 <= lowered.micro_batch_tokens < wanted
    assert lowered.estimate.total <= budget * GIB
    line = lowered.warning
    assert "\n" not in line and f"micro_batch_tokens={micro}" in line
    assert f"lowered to micro_batch_tokens={lowered.micro_batch_tokens}" in line and "GiB" in line
    assert ("(no cut)" in line) == (micro == 0)
    assert not plan(20, request(micro=micro)).warning  # it fits: honoured as given


def test_a_step_that_cannot_fit_one_row_is_refused_with_one_line_naming_the_knobs() -> None:
    shape = smollm2(lora_rank=0)
    budget = peak(shape, 1024, checkpointing=False, chunk=341) / GIB - 0.01
    with pytest.raises(InputError) as refused:
        plan(budget, request(ckpt=False, longest=1024), shape=shape)
    message = str(refused.value)
    assert "\n" not in message and f"{budget:.2f} GiB is available" in message and "1024-token row" in message
    assert "gradient_checkpointing=true" in message and "lora.rank" in message
    # With checkpointing allowed ("auto") the same budget fits.
    assert plan(budget, request(longest=1024), shape=shape).checkpointing
    with pytest.raises(InputError, match="memory_limit_gb") as hopeless:
        plan(0.5, request())  # less than the weights themselves
    assert "gradient_checkpointing=true" not in str(hopeless.value)  # it was on already


def trainer(path: Path, **options: object) -> LocalTrainer:
    config = parse_config({"model": str(path), "dtype": "float32", "torch_threads": 2, **options})
    return LocalTrainer(
        load_policy(config, torch.device("cpu"), torch.float32), config, torch.device("cpu"), 0
    )


def batch(n: int = 6, length: int = 12) -> list[TrainSequence]:
    return [
        TrainSequence(
            input_ids=TokenArray([(3 * i + j) % 20 + 1 for j in range(length)]),
            loss_mask=FloatArray([0.0] * 4 + [1.0] * (length - 4)),
            advantages=FloatArray([1.0 if i % 2 else -1.0] * length),
            sampler_logprobs=FloatArray([0.0] * 4 + [-1.0] * (length - 4)),
        )
        for i in range(n)
    ]


def test_the_trainer_refuses_a_step_over_its_memory_limit_before_any_work(tiny_model_path: Path) -> None:
    small = trainer(tiny_model_path, memory_limit_gb=0.01)
    before = [p.detach().clone() for p in small.params]
    with pytest.raises(InputError, match=r"0\.010? GiB is available") as refused:
        small.train_step(batch(), AlgorithmConfig())
    assert "\n" not in str(refused.value)
    assert small.optimizer_steps == 0 and not small.optimizer.state
    assert all(torch.equal(a, b) for a, b in zip(before, small.params, strict=True))


def test_the_plan_at_start_refuses_what_cannot_fit_and_leaves_the_first_step_its_own_plan(
    tiny_model_path: Path,
) -> None:
    """The check when a run starts (before any rollout, from the run's shape) refuses as the first
    step would, and keeps neither its plan nor the memory it measured: the first step plans from
    its real rows and what the process holds by then."""
    small = trainer(tiny_model_path, memory_limit_gb=0.01)
    with pytest.raises(InputError, match=r"0\.010? GiB is available") as refused:
        small.plan_memory_at_start(8, 3, AlgorithmConfig())
    assert "\n" not in str(refused.value) and "one 3-token row per micro-batch" in str(refused.value)
    roomy = trainer(tiny_model_path)
    at_start = roomy.plan_memory_at_start(8, 3, AlgorithmConfig())
    assert at_start.micro_batch_tokens >= 3 and roomy.memory.plan is None
    roomy.train_step(batch(), AlgorithmConfig())
    assert roomy.memory.plan is not None and roomy.memory.plan is not at_start


def test_the_trainer_lowers_its_micro_batch_under_a_limit_and_trains_the_same(
    tiny_model_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With what the process holds pinned (the limit is then the only variable), a limit below
    the whole batch's estimate lowers micro_batch_tokens=0 (one warning line); the update is the
    same as the uncut batch's."""
    monkeypatch.setattr(memory, "resident_bytes", lambda device: 0)
    lora = {"rank": 4}
    whole = trainer(tiny_model_path, micro_batch_tokens=0, lora=lora)
    shape = whole.memory.shape
    chunk = whole.memory.plan_for(batch(), [list(range(6))], optimizer_allocated=False).logits_chunk
    half = estimate_step(shape, 36, checkpointing=False, chunk=chunk, resident=0).total
    limited = trainer(tiny_model_path, micro_batch_tokens=0, lora=lora, memory_limit_gb=half / GIB)
    with caplog.at_level(logging.WARNING, logger="rllm.backends.tinker.local.memory"):
        lowered = limited.train_step(batch(), AlgorithmConfig())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert 12 <= lowered["micro_batch_tokens"] < 72  # at least one 12-token row, less than all six
    assert f"lowered to micro_batch_tokens={int(lowered['micro_batch_tokens'])}" in warnings[0]
    assert lowered["memory_estimate_gb"] * 1e9 <= half
    reference = whole.train_step(batch(), AlgorithmConfig())
    assert reference["micro_batch_tokens"] == 72
    assert lowered["loss"] == pytest.approx(reference["loss"], abs=1e-6)
    for a, b in zip(whole.params, limited.params, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_activation_bytes_of_checkpointing_keep_one_value_per_layer_and_token() -> None:
    shape = smollm2()
    per_token = activation_bytes(shape, 1, checkpointing=True) - 2 * shape.layer_activation_elements() * 4
    assert per_token == shape.layers * shape.hidden * 4 + 3 * shape.hidden * 4


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"micro_batch_token": 512}, "backend.options.micro_batch_token: unknown key"),
        ({"gradient_checkpoint": True}, "backend.options.gradient_checkpoint: unknown key"),
        ({"micro_batch_tokens": -1}, "backend.options.micro_batch_tokens"),
        ({"micro_batch_tokens": "big"}, "backend.options.micro_batch_tokens"),
        ({"gradient_checkpointing": "sometimes"}, "backend.options.gradient_checkpointing"),
        ({"logits_chunk_tokens": 0}, "backend.options.logits_chunk_tokens"),
        ({"memory_limit_gb": -2}, "backend.options.memory_limit_gb"),
    ],
)
def test_memory_options_with_typos_or_bad_values_are_refused_by_name(
    options: dict[str, object], key: str
) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config({"model": "m", **options})


def test_memory_options_take_auto_numbers_and_booleans() -> None:
    config = parse_config({"model": "m"})
    assert (config.micro_batch_tokens, config.gradient_checkpointing, config.logits_chunk_tokens) == (
        "auto",
    ) * 3
    assert config.memory_limit_gb == 0
    config = parse_config(
        {"model": "m", "micro_batch_tokens": 0, "gradient_checkpointing": True, "logits_chunk_tokens": 64}
    )
    assert (config.micro_batch_tokens, config.gradient_checkpointing, config.logits_chunk_tokens) == (
        0,
        True,
        64,
    )


def test_the_remote_service_refuses_only_an_explicit_micro_batch() -> None:
    lora = {"rank": 8}
    TinkerBackend({"service": "remote", "model": "m", "lora": lora}).validate(AlgorithmConfig())
    TinkerBackend({"service": "remote", "model": "m", "lora": lora, "micro_batch_tokens": 0}).validate(
        AlgorithmConfig()
    )
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        TinkerBackend({"service": "remote", "model": "m", "lora": lora, "micro_batch_tokens": 512}).validate(
            AlgorithmConfig()
        )
