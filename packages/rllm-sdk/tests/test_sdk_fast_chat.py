"""rllm.sdk.fast_chat: a flow client's ``chat.completions.create`` answered in process in one hop
sends what openai's own path sends and returns what it returns (the same ChatCompletion, the same
errors); everything it does not cover takes openai's path."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("openai")

from typing import Annotated

import openai
from openai._utils._transform import PropertyInfo
from openai.resources.chat.completions import AsyncCompletions
from typing_extensions import TypedDict

from rllm.sdk import fast_chat
from rllm.sdk.clients import async_openai, serve_in_process
from rllm.types import AgentConfig

ROOT = "http://127.0.0.1:7"
# openai's path sends this header, the one-hop path does not: it tells the two apart.
OPENAI_PATH = "x-stainless-retry-count"
# Headers the gateway reads (auth, session, role) and the content type: both paths send the same.
COMPARED = ("authorization", "content-type", "accept", "user-agent", "x-rllm-session", "x-rllm-role")


class Recorder:
    """An in-process handler that records each call and answers with a chat completion that
    echoes the body (or with ``status`` and an OpenAI-style error)."""

    def __init__(self, status: int = 200, decline: bool = False) -> None:
        self.calls: list[dict[str, Any]] = []
        self.status = status
        self.decline = decline

    async def __call__(self, method: str, path: str, query: str, headers: dict[str, str], body: bytes):
        self.calls.append({"method": method, "path": path, "query": query, "headers": headers, "body": body})
        if self.decline and OPENAI_PATH not in headers:  # not taken by the one-hop path's offer
            return None
        out = {"content-type": "application/json", "x-request-id": f"req-{len(self.calls)}"}
        if self.status != 200:
            error = {"error": {"message": f"refused {self.status}", "type": "invalid_request_error"}}
            return self.status, out, json.dumps(error).encode()
        reply = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "length",
                    "message": {"role": "assistant", "content": _canonical(body)},
                    "logprobs": {
                        "content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]
                    },
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            "token_ids": [1, 2, 3],  # an extra field, as the gateway's answers carry
        }
        return 200, out, json.dumps(reply).encode()


def _canonical(body: bytes) -> str:
    return json.dumps(json.loads(body), sort_keys=True)


async def _both(recorder: Recorder, call: Any, **client_kwargs: Any) -> tuple[Any, Any]:
    """``call(create)`` with the flow client's create, then with openai's own, on one client."""
    stop = serve_in_process(ROOT, recorder)
    try:
        client = async_openai(AgentConfig(base_url=f"{ROOT}/sessions/s1/v1", api_key="tok"), **client_kwargs)
        results = []
        for create in (
            client.chat.completions.create,
            lambda **kw: AsyncCompletions.create(client.chat.completions, **kw),
        ):
            try:
                results.append(await call(create))
            except openai.OpenAIError as exc:
                results.append(exc)
        return results[0], results[1]
    finally:
        stop()


def _same_call(fast: dict[str, Any], slow: dict[str, Any]) -> None:
    assert OPENAI_PATH not in fast["headers"] and OPENAI_PATH in slow["headers"]
    assert (fast["method"], fast["path"], fast["query"]) == (slow["method"], slow["path"], slow["query"])
    assert json.loads(fast["body"]) == json.loads(slow["body"])
    assert {k: fast["headers"].get(k) for k in COMPARED} == {k: slow["headers"].get(k) for k in COMPARED}


text = st.text(max_size=20)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": text},
    optional={"name": st.text(alphabet="abcxyz_", min_size=1, max_size=8)},
)
optional_params = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": st.integers(1, 64),
        "temperature": st.floats(0, 2, allow_nan=False),
        "top_p": st.floats(0, 1, allow_nan=False),
        "n": st.integers(1, 4),
        "seed": st.integers(-(2**31), 2**31),
        "stop": st.one_of(text, st.lists(text, max_size=3)),
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(0, 5),
        "user": text,
        "metadata": st.dictionaries(st.text(alphabet="kv", min_size=1, max_size=4), text, max_size=3),
        "logit_bias": st.dictionaries(st.integers(0, 999).map(str), st.integers(-100, 100), max_size=3),
        "stream": st.just(False),
        "frequency_penalty": st.just(openai.NOT_GIVEN),  # omitted values are left out by both
    },
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(message, min_size=1, max_size=3),
    model=st.text(min_size=1, max_size=12),
    params=optional_params,
)
def test_the_one_hop_sends_and_returns_what_openai_does(messages, model, params):
    recorder = Recorder()

    async def call(create):
        return await create(model=model, messages=messages, **params)

    fast, slow = asyncio.run(_both(recorder, call))
    _same_call(*recorder.calls)
    assert fast.model_dump() == slow.model_dump()
    assert type(fast) is type(slow) and type(fast.choices[0].message) is type(slow.choices[0].message)
    assert (fast._request_id, slow._request_id) == ("req-1", "req-2")


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422, 429, 500, 503])
def test_an_error_status_raises_openais_own_error(status):
    async def call(create):
        return await create(model="m", messages=[{"role": "user", "content": "x"}])

    fast, slow = asyncio.run(_both(Recorder(status), call))
    assert type(fast) is type(slow) and isinstance(fast, openai.APIStatusError)
    assert (fast.status_code, str(fast), fast.body) == (slow.status_code, str(slow), slow.body)
    assert fast.request_id == slow.request_id.replace("2", "1")


def test_a_client_with_its_own_headers_sends_them_in_one_hop():
    recorder = Recorder()

    async def call(create):
        return await create(model="m", messages=[{"role": "user", "content": "x"}])

    asyncio.run(_both(recorder, call, default_headers={"X-RLLM-Role": "judge"}))
    _same_call(*recorder.calls)
    assert recorder.calls[0]["headers"]["x-rllm-role"] == "judge"


@pytest.mark.parametrize(
    "extra",
    [
        {"extra_headers": {"X-Trace": "1"}},
        {"extra_body": {"top_k": 5}},
        {"extra_query": {"q": "1"}},
        {"timeout": 5.0},
        {"messages": ({"role": "user", "content": "a tuple of messages"},)},  # openai makes it a list
    ],
    ids=["extra_headers", "extra_body", "extra_query", "timeout", "tuple"],
)
def test_what_the_one_hop_does_not_cover_takes_openais_path(extra):
    recorder = Recorder()

    async def call(create):
        kwargs = {"model": "m", "messages": [{"role": "user", "content": "x"}], **extra}
        return await create(**kwargs)

    fast, slow = asyncio.run(_both(recorder, call))
    assert all(OPENAI_PATH in c["headers"] for c in recorder.calls)
    assert json.loads(recorder.calls[0]["body"]) == json.loads(recorder.calls[1]["body"])
    assert fast.model_dump() == slow.model_dump()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model": "m"},  # no messages
        {"model": "m", "messages": [], "no_such_argument": 1},
        {"model": "m", "messages": [], "response_format": openai.BaseModel},  # openai refuses a class here
    ],
    ids=["missing", "unknown", "class"],
)
def test_openais_own_argument_errors_stand(kwargs):
    async def call(create):
        try:
            await create(**kwargs)
        except TypeError as exc:
            return str(exc)
        return "accepted"

    recorder = Recorder()
    fast, slow = asyncio.run(_both(recorder, call))
    assert fast == slow != "accepted" and not recorder.calls


def test_a_call_the_handler_declines_goes_openais_way():
    recorder = Recorder(decline=True)

    async def call(create):
        return await create(model="m", messages=[{"role": "user", "content": "x"}])

    fast, slow = asyncio.run(_both(recorder, call))
    # The flow client's create was offered in one hop (declined), then answered on openai's path;
    # openai's own create went its path only.
    assert [OPENAI_PATH in c["headers"] for c in recorder.calls] == [False, True, True]
    assert fast.model_dump() == slow.model_dump()


def test_raw_responses_and_streams_are_openais():
    recorder = Recorder()

    async def call(create):
        return await create(model="m", messages=[{"role": "user", "content": "x"}])

    async def raw():
        stop = serve_in_process(ROOT, recorder)
        try:
            client = async_openai(AgentConfig(base_url=f"{ROOT}/v1", api_key="tok"))
            response = await client.chat.completions.with_raw_response.create(**_minimal())
            return response.headers["x-request-id"], response.parse().choices[0].message.content
        finally:
            stop()

    request_id, content = asyncio.run(raw())
    assert request_id == "req-1" and content and OPENAI_PATH in recorder.calls[0]["headers"]
    assert fast_chat._plain_body({**_minimal(), "stream": True}) is None


def _minimal() -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "x"}]}


class Renamed(TypedDict, total=False):
    card_id: Annotated[str, PropertyInfo(alias="cardID")]


class Holder(TypedDict, total=False):  # a renamed field one level down
    cards: list[Renamed]


def test_the_one_hop_is_on_for_this_openai_and_off_where_a_field_is_renamed():
    assert fast_chat._create_parameters() is not None  # openai's chat params rename nothing today
    assert fast_chat._has_field_transform(Holder, set())
    assert not fast_chat._has_field_transform(dict[str, list[int]], set())


def test_rllm_fast_chat_0_sends_every_call_openais_way(monkeypatch):
    monkeypatch.setenv("RLLM_FAST_CHAT", "0")
    recorder = Recorder()

    async def call(create):
        return await create(**_minimal())

    fast, slow = asyncio.run(_both(recorder, call))
    assert all(OPENAI_PATH in c["headers"] for c in recorder.calls)
    assert fast.model_dump() == slow.model_dump()


# --- the answer's parsing: strict validation where it passes, openai's construct otherwise ------
json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),  # past 2**53 too: an int a float field cannot hold exactly
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def _for_type(annotation: Any, depth: int, wrong: bool) -> st.SearchStrategy[Any]:
    """JSON for ``annotation`` (an openai answer type); with ``wrong``, now and then a value of
    another type."""
    import typing

    import pydantic

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _for_type(args[0], depth, wrong)
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        right = st.one_of(*(_for_type(a, depth, wrong) for a in args))
    elif origin is typing.Literal:
        right = st.sampled_from(args)
    elif origin is list:
        right = st.lists(_for_type(args[0], depth + 1, wrong), max_size=2) if depth < 4 else st.just([])
    elif origin is dict:
        right = st.dictionaries(st.text(max_size=4), _for_type(args[1], depth + 1, wrong), max_size=2)
    elif isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        right = _model_json(annotation, wrong, depth + 1) if depth < 4 else st.just({})
    elif annotation is type(None):
        right = st.none()
    elif annotation is bool:
        right = st.booleans()
    elif annotation is int:
        right = st.integers(-(2**70), 2**70)
    elif annotation is float:
        right = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**70), 2**70))
    elif annotation is str:
        right = st.text(max_size=6)
    else:  # object / Any
        right = json_value
    return st.one_of(right, right, right, right, json_scalar) if wrong else right


def _model_json(model: type, wrong: bool, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object for an openai model: its required fields, some of the others, sometimes extra
    keys; with ``wrong`` a required field may be missing too."""
    fields = model.model_fields  # pyright: ignore[reportAttributeAccessIssue]
    required = {n: _for_type(f.annotation, depth, wrong) for n, f in fields.items() if f.is_required()}
    optional = {n: _for_type(f.annotation, depth, wrong) for n, f in fields.items() if not f.is_required()}
    return st.builds(
        lambda given, more, extra, drop: {
            k: v
            for k, v in {**extra, **given, **more}.items()
            if not (drop and k == next(iter(required), None))
        },
        st.fixed_dictionaries(required),
        st.fixed_dictionaries({}, optional=optional),
        st.dictionaries(st.sampled_from(["token_ids", "weight_version", "x"]), json_value, max_size=2),
        st.booleans() if wrong else st.just(False),
    )


def _tree(value: Any) -> Any:
    """Everything that makes two parsed answers the same: types, set fields, values and extras."""
    import pydantic

    if isinstance(value, pydantic.BaseModel):
        return (
            type(value),
            sorted(value.model_fields_set),
            {k: _tree(v) for k, v in value.__dict__.items()},
            {k: _tree(v) for k, v in (value.model_extra or {}).items()},
        )
    if isinstance(value, list):
        return [_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: _tree(v) for k, v in value.items()}
    return (type(value), value)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    answer=st.one_of(
        _model_json(openai.types.chat.ChatCompletion, wrong=False),  # as a server would answer
        _model_json(openai.types.chat.ChatCompletion, wrong=True),  # wrong types, missing fields
        json_value,
    )
)
def test_a_parsed_answer_is_the_object_openais_construct_makes(answer):
    content = json.dumps(answer).encode()
    if type(answer) is not dict:  # not an object: openai's error, as before
        with pytest.raises(openai.APIResponseValidationError):
            fast_chat._parse(async_openai(AgentConfig(base_url=f"{ROOT}/v1", api_key="t")), 200, {}, content)
        return
    ours = fast_chat._parse(None, 200, {"x-request-id": "r"}, content)
    theirs = openai.types.chat.ChatCompletion.construct(**json.loads(content))
    theirs._request_id = "r"
    assert _tree(ours) == _tree(theirs)


def test_well_formed_answers_take_the_strict_validation():
    reply = asyncio.run(Recorder()(("POST"), "/v1/chat/completions", "", {}, b'{"model": "m"}'))
    assert reply is not None
    assert fast_chat._validated(reply[2]) is not None  # what a gateway answers: the fast way
    assert fast_chat._validated(reply[2].replace(b'"created": 1', b'"created": "1"')) is None


def test_a_copied_clients_remembered_target_is_the_one_worked_out_from_it():
    async def main():
        recorder = Recorder()
        stop = serve_in_process(ROOT, recorder)
        try:
            config = AgentConfig(base_url=f"{ROOT}/sessions/s1/v1", api_key="tok")
            client = async_openai(config)
            remembered = fast_chat._target(client)
            assert remembered[0] is recorder
            handler, path = fast_chat._route(client)
            assert remembered == (handler, path, fast_chat._headers(client))  # every header
            # A client whose base URL or key changed since it was made works them out again.
            moved = async_openai(config)
            moved.base_url = f"{ROOT}/sessions/s2/v1/"
            assert fast_chat._target(moved)[1] == "/sessions/s2/v1/chat/completions"
            rekeyed = async_openai(config)
            rekeyed.api_key = "other"
            assert fast_chat._target(rekeyed)[2]["authorization"] == "Bearer other"
            # ... and one whose other header inputs changed sends what openai would.
            for attribute, value, header in (
                ("organization", "org-1", "openai-organization"),
                ("project", "proj-1", "openai-project"),
            ):
                changed = async_openai(config)
                setattr(changed, attribute, value)
                assert fast_chat._target(changed)[2][header] == value
            custom = async_openai(config)
            custom._custom_headers["X-Extra"] = "1"
            assert fast_chat._target(custom)[2]["x-extra"] == "1"
            # A URL the copy does not take as plain (a query) is not remembered: openai's path.
            odd = async_openai(AgentConfig(base_url=f"{ROOT}/v1?x=1", api_key="tok"))
            assert "_rllm_route" not in odd.__dict__ and fast_chat._target(odd)[0] is None
        finally:
            stop()
        assert fast_chat._target(client)[0] is None  # no longer served: not remembered either

    asyncio.run(main())
