"""The tool-calling agent loop: a model, native OpenAI tool calls, and the flow's own tools.

``run_tool_loop`` sends the conversation and a ``Toolbox``'s schemas to an OpenAI-compatible
client, runs each tool call of the reply through the toolbox's handlers, appends the results as
``tool`` messages and asks again, until a stop tool is called, the flow's ``until`` holds (an
environment the tools act on ended the episode), a reply without tool calls holds a final
answer, the turn limit or the deadline. Each model call goes through the flow's own
client, so the gateway records it as a Step (its tool calls on the Step's output) as it does
for any flow; the result records what each turn's calls ran and returned.

What the model got wrong is for it to read, never a crash: a call to a tool that was not
offered, arguments that are not a JSON object, and a ``ToolError`` (or one of the toolbox's
``model_errors``) raised by a handler come back as that call's result, ``error: <why>``.
Anything else a handler raises (a sandbox that died, an ``InfraError``; a bug) ends the rollout
with that exception, the tool's name noted on it: a broken tool is never scored as the model's
mistake.

Needs no ``openai`` import: the client is whatever the flow made (``rllm.sdk.clients``).
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from rllm.sdk.errors import InfraError
from rllm.sdk.session import sampling_kwargs
from rllm.types import AgentConfig
from rllm.types.errors import InputError, UsageError

ToolHandler: TypeAlias = Callable[[dict[str, Any]], str | Awaitable[str]]
StopReason: TypeAlias = Literal["stop_tool", "until", "answer", "max_turns", "deadline"]
FollowUp: TypeAlias = Callable[["ToolTurn"], Awaitable[dict[str, Any] | None]]

_now = time.monotonic  # the deadline's clock (a module name, so a test can move it)
_SHOWN_CHARS = 100  # of a malformed name or argument string quoted back to the model


class ToolError(InputError):
    """Raised by a tool handler when the model's call cannot be run: the message is what the
    model reads (as ``error: <message>``), and the loop goes on."""


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call as run: what the model sent, and what it was answered."""

    id: str
    name: str
    arguments: str
    result: str
    refused: bool = False  # not run as asked: not offered, malformed, or refused by its tool
    stop: bool = False  # a stop tool: the loop ends after this turn


@dataclass(frozen=True)
class ToolTurn:
    """One model call and what came of it."""

    message: dict[str, Any]  # the assistant message, as it went back into the conversation
    calls: tuple[ToolCallRecord, ...]
    answer: str | None = None  # ``final_answer`` of a reply without tool calls


@dataclass(frozen=True)
class ToolLoopResult:
    messages: list[dict[str, Any]]  # the whole conversation, the last reply and results included
    turns: tuple[ToolTurn, ...]
    stopped_by: StopReason
    answer: str | None = None

    @property
    def finished(self) -> bool:
        """The model ended it (a stop tool, ``until``, a final answer); not a limit."""
        return self.stopped_by in ("stop_tool", "until", "answer")

    @property
    def tool_calls(self) -> int:
        """Calls of tools other than stop tools, refused ones included."""
        return sum(not call.stop for turn in self.turns for call in turn.calls)

    @property
    def refused(self) -> int:
        return sum(call.refused for turn in self.turns for call in turn.calls)


def parse_arguments(name: str, arguments: object) -> dict[str, Any]:
    """A tool call's ``arguments`` (a JSON text) as the object it must be; "" or None is ``{}``.
    Anything else raises ``ToolError`` saying what is wrong with it."""
    if arguments is None or arguments == "":
        return {}
    if not isinstance(arguments, str):
        raise ToolError(f"{name}'s arguments must be a JSON object as text, got {type(arguments).__name__}")
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        raise ToolError(f"{name}'s arguments are not JSON: {_shown(arguments)}") from None
    if not isinstance(value, dict):
        raise ToolError(f"{name} takes a JSON object of arguments, got {_json_type(value)}")
    return value


class Toolbox:
    """The tools a model is offered (OpenAI function schemas) and what runs each call.

    ``handlers`` maps a tool's name to ``fn(arguments: dict) -> str`` (plain or async): the text
    the model reads. ``stop_tools`` maps the name of a tool that ends the loop to the result the
    model is sent for it (its arguments are not read). Every offered tool has exactly one of the
    two. ``model_errors``: exception types a handler raises for a call the model got wrong (say
    ``DesktopInputError``), answered like ``ToolError``.
    """

    def __init__(
        self,
        schemas: Sequence[Mapping[str, Any]],
        handlers: Mapping[str, ToolHandler],
        *,
        stop_tools: Mapping[str, str] | None = None,
        model_errors: tuple[type[Exception], ...] = (),
    ) -> None:
        self.schemas = [dict(schema) for schema in schemas]
        self.names = tuple(_schema_name(schema, i) for i, schema in enumerate(self.schemas))
        self.handlers = dict(handlers)
        self.stop_tools = dict(stop_tools or {})
        self.model_errors = tuple(model_errors)
        _check_names(self.names, self.handlers, self.stop_tools)
        if not all(isinstance(kind, type) and issubclass(kind, Exception) for kind in self.model_errors):
            raise UsageError(f"model_errors must be exception classes, got {self.model_errors!r}")

    def resolve(self, name: object, arguments: object) -> tuple[ToolHandler, dict[str, Any]]:
        """The handler of a call to ``name`` and its parsed arguments; ``ToolError`` if the call
        names no handled tool or its arguments are not a JSON object."""
        handler = self.handlers.get(name) if isinstance(name, str) else None
        if handler is None:
            raise ToolError(f"no tool named {_shown(name)}; the tools are {', '.join(self.names)}")
        return handler, parse_arguments(str(name), arguments)

    async def call(self, name: object, arguments: object, call_id: str = "") -> ToolCallRecord:
        """Run one call; what the model got wrong comes back refused, anything else raises."""
        if isinstance(name, str) and name in self.stop_tools:
            return self._record(call_id, name, arguments, self.stop_tools[name], stop=True)
        try:
            handler, args = self.resolve(name, arguments)
            result = handler(args)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            return self._refused(call_id, name, arguments, exc)
        return self._record(call_id, name, arguments, _checked_result(name, result))

    def call_sync(self, name: object, arguments: object, call_id: str = "") -> ToolCallRecord:
        """``call`` for tools whose handlers are plain functions (a script, a tool's own tests)."""
        if isinstance(name, str) and name in self.stop_tools:
            return self._record(call_id, name, arguments, self.stop_tools[name], stop=True)
        try:
            handler, args = self.resolve(name, arguments)
            result = handler(args)
        except Exception as exc:
            return self._refused(call_id, name, arguments, exc)
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if callable(close):
                close()  # never awaited: said once here, not again as a "never awaited" warning
            raise UsageError(f"tool {name!r} is async: run it with Toolbox.call")
        return self._record(call_id, name, arguments, _checked_result(name, result))

    def _refused(self, call_id: str, name: object, arguments: object, exc: Exception) -> ToolCallRecord:
        """The record of a call the model got wrong; any other exception raised again, noted."""
        if isinstance(exc, (ToolError, *self.model_errors)):
            return self._record(call_id, name, arguments, f"error: {exc}", refused=True)
        exc.add_note(f"raised by tool {name!r} for the call {_shown(arguments)}")
        raise exc

    @staticmethod
    def _record(
        call_id: str,
        name: object,
        arguments: object,
        result: str,
        *,
        refused: bool = False,
        stop: bool = False,
    ) -> ToolCallRecord:
        return ToolCallRecord(
            id=call_id,
            name=name if isinstance(name, str) else repr(name),
            arguments=arguments if isinstance(arguments, str) else json.dumps(arguments, default=repr),
            result=result,
            refused=refused,
            stop=stop,
        )


async def run_tool_loop(
    client: Any,
    config: AgentConfig,
    messages: Sequence[Mapping[str, Any]],
    toolbox: Toolbox,
    *,
    max_turns: int,
    max_tokens: int | None = None,
    final_answer: Callable[[str], str | None] | None = None,
    nudge: str | None = None,
    follow_up: FollowUp | None = None,
    deadline: float | None = None,
    until: Callable[[], bool] | None = None,
) -> ToolLoopResult:
    """Run the loop on ``client.chat.completions.create`` (``config.model``, the rollout's
    sampling parameters; ``max_tokens`` unless the rollout sets one) from ``messages``.

    It ends after the turn where a stop tool was called (every call of that reply is still run),
    after which ``until()`` is true (the tools' own state says the task is over: an environment
    that ended its episode), where a reply without tool calls has a ``final_answer`` (not None), after ``max_turns``
    model calls, or once ``time.monotonic()`` is past ``deadline`` (checked before each call).
    Otherwise the next user message is ``follow_up(turn)``'s (None: none), or without one,
    ``nudge`` after a reply without tool calls.
    """
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise InputError(f"max_turns must be a whole number of at least 1, got {max_turns!r}")
    if nudge is not None and follow_up is not None:
        raise UsageError(
            "give run_tool_loop a nudge or a follow_up, not both: follow_up writes every next message"
        )
    if not messages:
        raise InputError("run_tool_loop needs at least one message to start from")
    conversation = [dict(message) for message in messages]
    request = sampling_kwargs(config)
    if max_tokens is not None:
        request = {"max_tokens": max_tokens, **request}
    turns: list[ToolTurn] = []
    while True:
        if deadline is not None and _now() >= deadline:
            return ToolLoopResult(conversation, tuple(turns), "deadline")
        turn = await _one_turn(client, config.model, conversation, toolbox, request, final_answer)
        turns.append(turn)
        stopped: StopReason | None = None
        if any(call.stop for call in turn.calls):
            stopped = "stop_tool"
        elif until is not None and until():
            stopped = "until"
        elif turn.answer is not None:
            stopped = "answer"
        elif len(turns) >= max_turns:
            stopped = "max_turns"
        elif deadline is not None and _now() >= deadline:
            stopped = "deadline"
        if stopped is not None:
            return ToolLoopResult(conversation, tuple(turns), stopped, turn.answer)
        if follow_up is not None:
            message = await follow_up(turn)
        else:
            message = {"role": "user", "content": nudge} if nudge is not None and not turn.calls else None
        if message is not None:
            conversation.append(message)


async def _one_turn(
    client: Any,
    model: str,
    conversation: list[dict[str, Any]],
    toolbox: Toolbox,
    request: dict[str, Any],
    final_answer: Callable[[str], str | None] | None,
) -> ToolTurn:
    reply = await client.chat.completions.create(
        model=model, messages=conversation, tools=toolbox.schemas, **request
    )
    if not reply.choices:
        raise InfraError(f"the model server's reply {getattr(reply, 'id', '')!r} has no choices")
    message = reply.choices[0].message
    dumped = message.model_dump(exclude_none=True)
    conversation.append(dumped)
    calls: list[ToolCallRecord] = []
    for call in message.tool_calls or []:
        function = getattr(call, "function", None)  # None: a non-function (custom) tool call
        record = await toolbox.call(
            getattr(function, "name", None), getattr(function, "arguments", None), call_id=call.id
        )
        calls.append(record)
        conversation.append({"role": "tool", "tool_call_id": call.id, "content": record.result})
    answer = final_answer(message.content or "") if final_answer is not None and not calls else None
    return ToolTurn(dumped, tuple(calls), answer)


def _schema_name(schema: Mapping[str, Any], index: int) -> str:
    function = schema.get("function") if isinstance(schema, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name or schema.get("type") != "function":
        raise InputError(
            f"tool schema {index} is not an OpenAI function tool "
            '({"type": "function", "function": {"name": ..., "parameters": ...}})'
        )
    return name


def _check_names(names: tuple[str, ...], handlers: Mapping[str, Any], stop_tools: Mapping[str, str]) -> None:
    if len(set(names)) != len(names):
        raise InputError(f"a tool is offered twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
    both = sorted(set(handlers) & set(stop_tools))
    unhandled = [n for n in names if n not in handlers and n not in stop_tools]
    unoffered = sorted(set(handlers) - set(names)) + sorted(set(stop_tools) - set(names))
    if both or unhandled or unoffered:
        raise InputError(
            f"a toolbox's tools must each have one handler or stop result: both {both}, "
            f"neither {unhandled}, not offered {unoffered}"
        )
    bad = sorted(n for n, fn in handlers.items() if not callable(fn))
    bad += sorted(n for n, text in stop_tools.items() if not isinstance(text, str))
    if bad:
        raise UsageError(f"handlers must be callables and stop results strings: not so for {bad}")


def _checked_result(name: object, result: object) -> str:
    if not isinstance(result, str):
        raise UsageError(f"tool {name!r} returned {type(result).__name__}, not the str the model reads")
    return result


def _shown(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    return repr(text[:_SHOWN_CHARS] + ("..." if len(text) > _SHOWN_CHARS else ""))


def _json_type(value: object) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
