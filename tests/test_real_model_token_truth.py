"""Token truth on a real model: three turns of a chat with SmolLM2-135M-Instruct (its byte-level
BPE tokenizer and ChatML template, as `rllm model import` wrote them) through the real gateway in
cumulative mode, sampled by the local tinker backend's sampler (its own decode step for Llama
models: local/fast_decode.py). Each turn's prompt extends the
previous prompt and completion token for token, the last prompt is exactly the template's text,
and every sampled token's logprob is transformers' forward pass over the same ids."""

from __future__ import annotations

import itertools
from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllm.backends.tinker import TinkerBackend
from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer

pytestmark = pytest.mark.real_model
QUESTIONS = ["What is 2 + 3?", "And 4 + 4?", "Thanks. Now name a colour."]


async def test_three_turns_are_token_true_with_a_real_bpe_tokenizer(smollm2: Path) -> None:
    # The sampler's own copy of the weights: its decode steps run the fast step (fast_decode.py).
    backend = TinkerBackend({"model": str(smollm2), "dtype": "float32", "torch_threads": 2})
    await backend.start()
    try:
        config = GatewayConfig(
            upstreams=backend.inference_urls(),
            tokenizer_path=str(smollm2),
            tokenizer_mode="cumulative",
            health_interval_s=0,
        )
        async with GatewayServer(config) as gateway, GatewayClient(gateway.url) as client:
            chat = openai.AsyncOpenAI(base_url=client.session_url("three"), api_key="x")
            messages: list[dict[str, str]] = []
            for question in QUESTIONS:
                messages.append({"role": "user", "content": question})
                answer = await chat.chat.completions.create(
                    model=backend.served_model_name(),
                    messages=messages,
                    max_tokens=24,
                    seed=7,  # pyright: ignore[reportArgumentType]
                )
                messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
            traces = await client.get_traces("three")
        engine = backend.service.engine
        assert engine is not None and engine.fast is not None  # SmolLM2 (llama) decoded by the fast step
    finally:
        await backend.close()

    assert len(traces) == 3 and all(t.status == "ok" for t in traces)
    assert [t.segment for t in traces] == [0, 0, 0]
    for before, after in itertools.pairwise(traces):
        sent = [*before.prompt_ids, *before.completion_ids]
        assert list(after.prompt_ids[: len(sent)]) == sent  # the sampled tokens, not a re-tokenization
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    expected = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(traces[-1].prompt_ids, skip_special_tokens=False) == expected

    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    for trace in traces:
        prompt, completion = list(trace.prompt_ids), list(trace.completion_ids)
        assert completion and len(trace.completion_logprobs) == len(completion)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        forward = torch.log_softmax(logits.float(), dim=-1)[torch.arange(len(completion)), completion]
        torch.testing.assert_close(
            torch.tensor(list(trace.completion_logprobs), dtype=torch.float32), forward, atol=1e-3, rtol=0
        )
