"""Tool calls on the local sampler server (what `rllm serve` answers an agent that uses OpenAI
function calling): a reply in the model's tool-call format comes back as ``tool_calls``, as vLLM
answers with a tool-call parser and as the cumulative gateway answers in training, so the same
agent gets the same calls in eval and in training; a model whose template has no tool-call format
is refused with a 400 naming ``tools`` instead of having its tools silently dropped.

The tiny model here is taught one call for real (cross-entropy steps on the local trainer, then a
weight sync), so the call the server parses is one its sampler generated.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from rllm.algos import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.gateway.toolcalls import PROBE_TOOLS, UNSUPPORTED_TOOLS
from rllm.tiny import write_random_llama
from rllm.types import FloatArray, TokenArray, TrainSequence

# A hermes-style template (Qwen's family: tools in the system turn, calls as <tool_call> JSON).
HERMES_TEMPLATE = (
    "{% if tools %}<|system|>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|end|>\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>\n"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}\n"
    "</tool_call>{% endfor %}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ASK = [{"role": "user", "content": "the weather in Paris"}]


def _write_tool_model(path: Path) -> Path:
    """A random 2-layer Llama beside a byte-level BPE tokenizer with the hermes template (trained
    on text holding the call, so the call is a few tokens the tiny model learns in a few steps)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|pad|>"]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    core.train_from_iterator([CALL, json.dumps(PROBE_TOOLS), ASK[0]["content"]] * 50, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|end|>", pad_token="<|pad|>")
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    tokenizer.chat_template = HERMES_TEMPLATE
    return write_random_llama(path, tokenizer)


async def _teach_the_call(backend: TinkerBackend) -> None:
    """Cross-entropy steps on prompt (with the tools) + CALL until greedy sampling writes it."""
    tokenizer = backend.service.tokenizer
    text = tokenizer.apply_chat_template(ASK, tools=PROBE_TOOLS, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    reply = [*tokenizer(CALL, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    sequence = TrainSequence(
        input_ids=TokenArray(prompt + reply),
        loss_mask=FloatArray([0.0] * len(prompt) + [1.0] * len(reply)),
        advantages=FloatArray([1.0] * (len(prompt) + len(reply))),
        sampler_logprobs=FloatArray([0.0] * (len(prompt) + len(reply))),
    )
    client = openai.AsyncOpenAI(base_url=backend.inference_urls()[0], api_key="unused", max_retries=0)
    for _ in range(200):
        await backend.train_step([sequence], AlgorithmConfig(loss="cross_entropy", tis="none"))
        await backend.sync_weights()
        answer = await client.completions.create(model="m", prompt=text, max_tokens=len(reply), temperature=0)
        if answer.choices[0].text == CALL:
            return
    raise AssertionError(f"the tiny model did not learn the call: {answer.choices[0].text!r}")


@pytest.fixture(scope="module")
def tool_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinkerBackend]:
    model = _write_tool_model(tmp_path_factory.mktemp("hermes") / "model")
    backend = TinkerBackend(
        {"model": str(model), "torch_threads": 2, "dtype": "float32", "learning_rate": 2e-3}
    )

    async def start() -> None:
        await backend.start()
        await _teach_the_call(backend)

    asyncio.run(start())
    yield backend
    asyncio.run(backend.close())


def _client(backend: TinkerBackend) -> openai.OpenAI:
    return openai.OpenAI(base_url=backend.inference_urls()[0], api_key="unused", max_retries=0)


def test_a_reply_in_the_models_format_comes_back_as_tool_calls(tool_backend: TinkerBackend) -> None:
    answer = _client(tool_backend).chat.completions.create(
        model="m",
        messages=ASK,
        tools=PROBE_TOOLS,
        temperature=0,
        max_tokens=40,  # type: ignore[arg-type]
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]


def test_a_streamed_reply_carries_the_same_tool_calls(tool_backend: TinkerBackend) -> None:
    chunks = list(
        _client(tool_backend).chat.completions.create(
            model="m",
            messages=ASK,
            tools=PROBE_TOOLS,
            temperature=0,
            max_tokens=40,
            stream=True,  # type: ignore[arg-type]
        )
    )
    deltas = [c.choices[0] for c in chunks if c.choices]
    calls = [call for d in deltas for call in d.delta.tool_calls or []]
    assert [(c.index, c.function.name) for c in calls] == [(0, "get_weather")]  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr,arg-type]
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["tool_calls"]


def test_a_called_tool_in_the_history_renders_its_arguments_as_the_template_expects(
    tool_backend: TinkerBackend,
) -> None:
    """The API carries arguments as JSON text; the template must get the object (as vLLM does),
    or the history would not be the text the model wrote."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny"},
    ]
    answer = _client(tool_backend).chat.completions.create(
        model="m",
        messages=messages,  # type: ignore[arg-type]
        tools=PROBE_TOOLS,  # type: ignore[arg-type]
        max_tokens=1,
        extra_body={"return_token_ids": True},
    )
    tokenizer = tool_backend.service.tokenizer
    objects = [
        *ASK,
        {
            **messages[1],
            "tool_calls": [{**call, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        messages[2],
    ]
    text = tokenizer.apply_chat_template(
        objects, tools=PROBE_TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert CALL in text
    assert answer.model_dump()["prompt_token_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_tools_for_a_template_without_a_tool_format_are_refused(sampler_backend: TinkerBackend) -> None:
    client = _client(sampler_backend)
    with pytest.raises(openai.BadRequestError, match=re.escape(UNSUPPORTED_TOOLS)) as refused:
        client.chat.completions.create(model="m", messages=ASK, tools=PROBE_TOOLS, max_tokens=2)  # type: ignore[arg-type]
    assert refused.value.body["param"] == "tools"  # type: ignore[index]
    # The same request without tools is answered.
    assert client.chat.completions.create(model="m", messages=ASK, max_tokens=2).choices
