"""The tool-calling loop against a real loopback OpenAI-compatible server (rllm.testing's
MockUpstream, a scripted fake of a model) through a real ``openai.AsyncOpenAI``: a call, its
result and a final answer; malformed arguments, an unknown tool, a stop tool, the turn limit,
the deadline, and tools that refuse or raise. Its argument parser under hypothesis."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("openai")
pytest.importorskip("rllm.testing")

import openai

from rllm.sdk import tool_loop
from rllm.sdk.errors import InfraError
from rllm.sdk.tool_loop import (
    Toolbox,
    ToolError,
    ToolTurn,
    parse_arguments,
    run_tool_loop,
)
from rllm.testing import MockReply, MockUpstream  # a real loopback server; the model is scripted
from rllm.types import AgentConfig, SamplingParams
from rllm.types.errors import InputError, UsageError


def _schema(name: str, **params: str) -> dict[str, Any]:
    props = {key: {"type": kind} for key, kind in params.items()}
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": props}},
    }


SCHEMAS = [_schema("add", a="number", b="number"), _schema("fail"), _schema("finish")]
START = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 2 + 3?"}]


def _call(name: str, arguments: Any = None, call_id: str | None = None) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return {
        "id": call_id or f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


def _final(text: str) -> str | None:
    return text.split("ANSWER:", 1)[1].strip() if "ANSWER:" in text else None


class Tools:
    """Handlers that record what they were called with; ``fail`` raises what the test puts in."""

    def __init__(self, failure: Exception | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.failure = failure

    async def add(self, args: dict[str, Any]) -> str:  # async, as most tools are
        self.calls.append(("add", args))
        return str(args["a"] + args["b"])

    def fail(self, args: dict[str, Any]) -> str:  # plain: run inline
        self.calls.append(("fail", args))
        raise self.failure or AssertionError("no failure set")

    def toolbox(self, **kwargs: Any) -> Toolbox:
        return Toolbox(
            SCHEMAS, {"add": self.add, "fail": self.fail}, stop_tools={"finish": "finished"}, **kwargs
        )


class Model:
    """The scripted model: its replies in order, and every request body it was sent."""

    def __init__(self, *replies: str | MockReply) -> None:
        self.replies = list(replies)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, body: dict[str, Any]) -> str | MockReply:
        self.bodies.append(body)
        return self.replies[len(self.bodies) - 1]

    def tool_results(self, request: int) -> list[str]:
        return [m["content"] for m in self.bodies[request]["messages"] if m["role"] == "tool"]


async def _run(model: Model, toolbox: Toolbox, *, name: str = "mock-model", sampling=None, **kwargs: Any):
    async with MockUpstream(responder=model) as server:
        config = AgentConfig(base_url=server.url, model=name, sampling=sampling or SamplingParams())
        async with openai.AsyncOpenAI(base_url=server.url, api_key="EMPTY", max_retries=0) as client:
            return await run_tool_loop(client, config, START, toolbox, **kwargs)


async def test_a_tool_call_its_result_and_a_final_answer() -> None:
    tools = Tools()
    model = Model(MockReply(tool_calls=[_call("add", {"a": 2, "b": 3})]), "2 + 3 is five. ANSWER: 5")
    result = await _run(model, tools.toolbox(), max_turns=5, max_tokens=77, final_answer=_final)
    assert tools.calls == [("add", {"a": 2, "b": 3})]
    first, second = model.bodies
    assert [t["function"]["name"] for t in first["tools"]] == ["add", "fail", "finish"]
    assert first["model"] == "mock-model" and first["max_tokens"] == 77
    assert first["messages"] == START
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_add", "content": "5"}
    assert second["messages"][-2]["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": '{"a": 2, "b": 3}',
    }
    assert (result.stopped_by, result.answer, result.finished) == ("answer", "5", True)
    assert (len(result.turns), result.tool_calls, result.refused) == (2, 1, 0)
    assert result.turns[0].calls[0].result == "5" and result.turns[1].answer == "5"
    # the conversation returned is the one the model saw, with its last reply
    assert result.messages[:-1] == second["messages"]
    assert result.messages[-1]["content"] == "2 + 3 is five. ANSWER: 5"


async def test_the_rollouts_sampling_parameters_win_over_the_default_max_tokens() -> None:
    model = Model("ANSWER: 1")
    sampling = SamplingParams(max_tokens=9, temperature=0.5)
    await _run(
        model,
        Tools().toolbox(),
        name="m2",
        sampling=sampling,
        max_turns=1,
        max_tokens=77,
        final_answer=_final,
    )
    assert (model.bodies[0]["model"], model.bodies[0]["max_tokens"], model.bodies[0]["temperature"]) == (
        "m2",
        9,
        0.5,
    )


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ('{"a": 2, "b":', 'error: add\'s arguments are not JSON: \'{"a": 2, "b":\''),
        ("[2, 3]", "error: add takes a JSON object of arguments, got an array"),
        ("null", "error: add takes a JSON object of arguments, got null"),
    ],
)
async def test_malformed_arguments_go_back_to_the_model_as_a_tool_error(arguments: str, error: str) -> None:
    tools = Tools()
    model = Model(MockReply(tool_calls=[_call("add", arguments)]), "ANSWER: 5")
    result = await _run(model, tools.toolbox(), max_turns=5, final_answer=_final)
    assert tools.calls == []  # the handler never saw them
    assert model.tool_results(1) == [error]
    assert (result.refused, result.tool_calls, result.answer) == (1, 1, "5")


async def test_an_unknown_tool_goes_back_to_the_model_naming_the_tools() -> None:
    model = Model(MockReply(tool_calls=[_call("multiply", {"a": 2})]), "ANSWER: 6")
    result = await _run(model, Tools().toolbox(), max_turns=5, final_answer=_final)
    assert model.tool_results(1) == ["error: no tool named 'multiply'; the tools are add, fail, finish"]
    assert result.turns[0].calls[0].refused and result.turns[0].calls[0].name == "multiply"


async def test_a_stop_tool_ends_the_loop_after_every_call_of_its_reply_ran() -> None:
    tools = Tools()
    calls = [_call("finish", "not even JSON"), _call("add", {"a": 1, "b": 1}, call_id="c2")]
    model = Model(MockReply(tool_calls=calls))
    result = await _run(model, tools.toolbox(), max_turns=5)
    assert len(model.bodies) == 1 and tools.calls == [("add", {"a": 1, "b": 1})]
    assert [(c.name, c.result, c.stop) for c in result.turns[0].calls] == [
        ("finish", "finished", True),
        ("add", "2", False),
    ]
    assert (result.stopped_by, result.finished, result.tool_calls) == ("stop_tool", True, 1)
    assert result.messages[-2:] == [
        {"role": "tool", "tool_call_id": "call_finish", "content": "finished"},
        {"role": "tool", "tool_call_id": "c2", "content": "2"},
    ]


async def test_until_ends_the_loop_after_the_turn_that_made_it_true() -> None:
    """``until`` is the tools' own state (an environment's ``done``): read after every turn,
    the loop ends once it holds, after every call of that turn ran."""
    tools = Tools()
    calls = [_call("add", {"a": 1, "b": 1}), _call("add", {"a": 2, "b": 2}, call_id="c2")]
    model = Model(MockReply(tool_calls=calls[:1]), MockReply(tool_calls=calls), "never asked")
    result = await _run(model, tools.toolbox(), max_turns=5, until=lambda: len(tools.calls) >= 2)
    assert len(model.bodies) == 2 and len(tools.calls) == 3  # the second turn's calls all ran
    assert (result.stopped_by, result.finished, len(result.turns)) == ("until", True, 2)


async def test_the_turn_limit_ends_a_model_that_never_answers() -> None:
    model = Model(*[MockReply(tool_calls=[_call("add", {"a": i, "b": 0})]) for i in range(5)])
    result = await _run(model, Tools().toolbox(), max_turns=3, final_answer=_final)
    assert len(model.bodies) == 3
    assert (result.stopped_by, result.finished, len(result.turns), result.answer) == (
        "max_turns",
        False,
        3,
        None,
    )


async def test_a_reply_without_tool_calls_or_answer_is_nudged() -> None:
    model = Model("Let me think.", "ANSWER: 5")
    result = await _run(model, Tools().toolbox(), max_turns=3, final_answer=_final, nudge="Use a tool.")
    reply, nudge = model.bodies[1]["messages"][-2:]
    assert (reply["role"], reply["content"]) == ("assistant", "Let me think.")
    assert nudge == {"role": "user", "content": "Use a tool."}
    assert result.turns[0].answer is None and result.answer == "5"


async def test_follow_up_writes_each_next_message_and_never_after_the_last_turn() -> None:
    seen: list[ToolTurn] = []

    async def look(turn: ToolTurn) -> dict[str, Any]:
        seen.append(turn)
        note = "The screen now:" if turn.calls else "Use the tools."
        block = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        return {"role": "user", "content": [{"type": "text", "text": note}, block]}

    model = Model(MockReply(tool_calls=[_call("add", {"a": 1, "b": 2})]), "thinking", "still thinking")
    result = await _run(model, Tools().toolbox(), max_turns=3, follow_up=look)
    looks = [m["content"] for m in model.bodies[2]["messages"] if isinstance(m.get("content"), list)]
    assert [content[0]["text"] for content in looks] == [
        "The screen now:",
        "Use the tools.",
    ]
    assert len(seen) == 2 and result.stopped_by == "max_turns"  # no look after the third turn


async def test_a_deadline_already_past_sends_nothing_and_one_passing_ends_the_loop(monkeypatch) -> None:
    model = Model()
    result = await _run(model, Tools().toolbox(), max_turns=3, deadline=time.monotonic() - 1)
    assert model.bodies == [] and (result.stopped_by, result.turns) == ("deadline", ())

    # The loop's clock, moved by the tool itself: the deadline passes while the tool runs.
    clock = [100.0]
    monkeypatch.setattr(tool_loop, "_now", lambda: clock[0])

    def slow_add(args: dict[str, Any]) -> str:
        clock[0] = 200.0
        return "3"

    toolbox = Toolbox(SCHEMAS[:1], {"add": slow_add})
    model = Model(*[MockReply(tool_calls=[_call("add", {"a": 1, "b": 2})])] * 3)
    result = await _run(model, toolbox, max_turns=3, deadline=150.0)
    assert len(model.bodies) == 1 and (result.stopped_by, len(result.turns)) == ("deadline", 1)


@pytest.mark.parametrize("failure", [ToolError("the disk is full"), KeyError("the disk is full")])
async def test_a_tool_refusal_goes_back_to_the_model(failure: Exception) -> None:
    # ToolError always; KeyError here because the toolbox names it a mistake of the model's
    tools = Tools(failure)
    model = Model(MockReply(tool_calls=[_call("fail")]), "ANSWER: none")
    result = await _run(model, tools.toolbox(model_errors=(KeyError,)), max_turns=3, final_answer=_final)
    assert model.tool_results(1)[0].startswith("error: ") and "the disk is full" in model.tool_results(1)[0]
    assert result.refused == 1 and result.answer == "none"


@pytest.mark.parametrize("failure", [RuntimeError("tool bug"), InfraError("the sandbox died")])
async def test_a_tool_that_raises_ends_the_rollout_with_its_exception(failure: Exception) -> None:
    model = Model(MockReply(tool_calls=[_call("fail", {"x": 1})]), "ANSWER: never asked")
    with pytest.raises(type(failure)) as raised:
        await _run(model, Tools(failure).toolbox(), max_turns=3, final_answer=_final)
    assert raised.value is failure and len(model.bodies) == 1  # not fed back, never retried here
    assert any("raised by tool 'fail'" in note for note in raised.value.__notes__)


async def test_a_tool_returning_no_text_is_refused_loudly() -> None:
    toolbox = Toolbox(SCHEMAS[:1], {"add": lambda args: None})  # type: ignore[arg-type, return-value]
    model = Model(MockReply(tool_calls=[_call("add", {"a": 1, "b": 2})]))
    with pytest.raises(UsageError, match="tool 'add' returned NoneType"):
        await _run(model, toolbox, max_turns=2)


async def test_a_reply_with_no_choices_is_an_infra_error() -> None:
    class NoChoices:  # a server answering 200 with an empty choices list
        class chat:  # the shape of openai's client
            class completions:
                @staticmethod
                async def create(**_: Any) -> Any:
                    return type("Reply", (), {"choices": [], "id": "r1"})()

    with pytest.raises(InfraError, match="'r1' has no choices"):
        await run_tool_loop(
            NoChoices(), AgentConfig(base_url="http://127.0.0.1:9/v1"), START, Tools().toolbox(), max_turns=1
        )


async def test_mistakes_in_the_loops_own_setup_are_refused_before_any_request() -> None:
    tools = Tools()
    with pytest.raises(InputError, match=r"neither \['fail'\]"):
        Toolbox(SCHEMAS, {"add": tools.add}, stop_tools={"finish": "done"})
    with pytest.raises(InputError, match=r"not offered \['sub'\]"):
        Toolbox(SCHEMAS[:1], {"add": tools.add, "sub": tools.add})
    with pytest.raises(InputError, match=r"both \['add'\]"):
        Toolbox(SCHEMAS[:1], {"add": tools.add}, stop_tools={"add": "done"})
    with pytest.raises(InputError, match="offered twice"):
        Toolbox([*SCHEMAS[:1], *SCHEMAS[:1]], {"add": tools.add})
    with pytest.raises(InputError, match="tool schema 0 is not an OpenAI function tool"):
        Toolbox([{"name": "add"}], {"add": tools.add})
    with pytest.raises(UsageError, match="model_errors must be exception classes"):
        tools.toolbox(model_errors=("KeyError",))
    model = Model()
    for bad in ({"max_turns": 0}, {"max_turns": 2, "nudge": "go", "follow_up": lambda turn: None}):
        with pytest.raises((InputError, UsageError)):
            await _run(model, tools.toolbox(), **bad)
    assert model.bodies == []


def test_call_sync_runs_plain_tools_and_refuses_async_ones() -> None:
    tools = Tools(ToolError("no"))
    toolbox = tools.toolbox()
    assert toolbox.call_sync("fail", "{}").result == "error: no"
    assert toolbox.call_sync("finish", "").result == "finished"
    assert toolbox.call_sync("nope", "{}").result.startswith("error: no tool named 'nope'")
    with pytest.raises(UsageError, match="'add' is async"):
        toolbox.call_sync("add", '{"a": 1, "b": 2}')
    with pytest.raises(RuntimeError) as raised:
        Tools(RuntimeError("bug")).toolbox().call_sync("fail", '{"x": 1}')
    assert raised.value.__notes__ == ["raised by tool 'fail' for the call '{\"x\": 1}'"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), _json, max_size=6))
def test_every_json_object_parses_back_to_itself(value: dict[str, Any]) -> None:
    assert parse_arguments("t", json.dumps(value)) == value
    assert parse_arguments("t", json.dumps(value, indent=2, ensure_ascii=False)) == value


@given(st.one_of(st.text(), _json.map(json.dumps)))
def test_anything_else_is_refused_with_a_tool_error_never_a_crash(text: str) -> None:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict) or text == "":
        assert parse_arguments("t", text) == (value if text else {})
        return
    with pytest.raises(ToolError) as refused:
        parse_arguments("t", text)
    assert str(refused.value).startswith("t")


def test_what_is_quoted_back_of_a_long_malformed_call_is_cut() -> None:
    with pytest.raises(ToolError) as refused:
        parse_arguments("t", "{" + "x" * 10_000)
    assert len(str(refused.value)) < 200 and str(refused.value).endswith("...'")
    toolbox = Tools().toolbox()
    assert len(toolbox.call_sync("n" * 10_000, "{}").result) < 300


def test_nesting_deeper_than_the_parser_goes_is_a_tool_error() -> None:
    with pytest.raises(ToolError, match="not JSON"):
        parse_arguments("t", "[" * 100_000)
