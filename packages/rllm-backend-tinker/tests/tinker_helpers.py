"""Helpers shared by the tinker backend tests (named uniquely: test modules import it by path)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from rllm.backends.tinker import TinkerBackend
from rllm.backends.tinker.local.generation import SamplerEngine
from rllm.backends.tinker.local.model import load_pretrained, load_tokenizer
from rllm.types import FloatArray, TokenArray, TrainSequence

WORDS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "plum"]


def started_backend(model: Path, **options: object) -> TinkerBackend:
    """A started local backend (from sync code). Its sampler runs on its own threads, so any
    event loop can use it afterwards."""
    return asyncio.run(start_backend(model, **options))


async def start_backend(model: Path, **options: object) -> TinkerBackend:
    """Device stays "auto" (CUDA when the machine has one, so the tests run where users train),
    but dtype defaults to float32: the exact-match tolerances below hold only in full precision.
    The default precision (bf16 on CUDA) has its own test, test_tinker_cuda_bf16.py."""
    backend = TinkerBackend({"model": str(model), "torch_threads": 2, "dtype": "float32", **options})
    await backend.start()
    return backend


@contextmanager
def running_sampler_engine(model: Path) -> Iterator[SamplerEngine]:
    """The local sampler's engine alone (no backend, no HTTP) on ``model``, in float32 on CPU,
    started for the block and stopped after it."""
    loaded = load_pretrained(str(model), torch.float32, torch.device("cpu")).eval()
    engine = SamplerEngine(loaded, load_tokenizer(str(model)), torch.device("cpu"), max_batch=64)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's weights live: inputs must be built there (CPU or CUDA)."""
    return next(model.parameters()).device


def cpu_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached CPU copies of every parameter (comparable with any other model, on any device)."""
    return {name: param.detach().cpu().clone() for name, param in model.named_parameters()}


def prompt_ids(backend: TinkerBackend, word: str) -> list[int]:
    tokenizer = backend.service.tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"say: {word}"}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def reply_sequence(backend: TinkerBackend, word: str, reply: str, advantage: float) -> TrainSequence:
    """Prompt 'say: word' + the reply's tokens and EOS, trained with one advantage."""
    tokenizer = backend.service.tokenizer
    prompt = prompt_ids(backend, word)
    response = [*tokenizer(reply, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    tokens = prompt + response
    logprobs = policy_logprobs(backend, tokens)
    return TrainSequence(
        input_ids=TokenArray(tokens),
        loss_mask=FloatArray([0.0] * len(prompt) + [1.0] * len(response)),
        advantages=FloatArray([advantage] * len(tokens)),
        sampler_logprobs=FloatArray([0.0] * len(prompt) + logprobs[len(prompt) - 1 :]),
    )


def policy_logprobs(
    backend: TinkerBackend, tokens: list[int], model: torch.nn.Module | None = None
) -> list[float]:
    """Teacher-forced log p(tokens[i] | tokens[:i]) for i >= 1 under the trainer's model."""
    return teacher_forced_logprobs(
        model if model is not None else backend.service.trainer.model, tokens
    ).tolist()


def teacher_forced_logprobs(
    model: torch.nn.Module, tokens: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """log p(tokens[i] | tokens[:i]) for i >= 1 by one full forward pass, as float32 on the CPU
    (computed on the model's device, so it works for CPU and CUDA models alike)."""
    device = model_device(model)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens], device=device)).logits[0, :-1].float() / temperature
        targets = torch.tensor(tokens[1:], device=device)[:, None]
        logp = torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1)
    return logp.cpu()


def reply_logprob(
    backend: TinkerBackend, word: str, reply: str, model: torch.nn.Module | None = None
) -> float:
    """Total logprob of the reply (and EOS) after 'say: word' (trainer's model unless given)."""
    tokenizer = backend.service.tokenizer
    prompt = prompt_ids(backend, word)
    tokens = [*prompt, *tokenizer(reply, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    return sum(policy_logprobs(backend, tokens, model)[len(prompt) - 1 :])


def contrast_batch(backend: TinkerBackend) -> list[TrainSequence]:
    """Two prompts, each with a rewarded reply (its own word) and a penalised one."""
    return [
        reply_sequence(backend, "apple", "apple", 1.0),
        reply_sequence(backend, "apple", "banana", -1.0),
        reply_sequence(backend, "plum", "plum", 1.0),
        reply_sequence(backend, "plum", "cherry", -1.0),
    ]
