"""``chat.completions.create`` in one hop for flows' clients whose gateway answers in process.

A flow's call through openai's client costs ~1.2 ms of CPU before any model runs
(benchmarks/history/issue-35.md, "#35 round 10 — the flows'": the param transform, request options,
httpx's request and URL objects, the retry loop, the response wrapper): with 32 one-turn rollouts a
step that is ~40 ms, more than the model's sampling. For a client made by
:func:`rllm.sdk.clients.async_openai` whose base URL the engine's embedded gateway serves on the
running loop, :class:`FastAsyncCompletions` sends the same body (byte for byte what openai would
send) with openai's own default and auth headers straight to that gateway's in-process handler
(routes, session and token checks, traces: the same as any call) and builds the answer with openai's
own parsing (the same ``ChatCompletion``, the same status errors).

Everything else takes openai's path unchanged: a stream; ``extra_headers`` / ``extra_query`` /
``extra_body`` / ``timeout`` (this is how ``with_raw_response`` reaches it, too); a value that is
not plain JSON data (a pydantic model, a tuple or generator of messages, a file, a date), where
openai's transform could change it; an unknown or missing argument (openai raises its TypeError);
a client with retries, strict response validation, a token provider or no key; a call the
handler declines (a body over its limit); and every call when openai's chat parameters carry a
field alias or format (checked once per process: the transform is then not the identity).
``RLLM_FAST_CHAT=0`` sends every call openai's way.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import sys
from typing import Any
from urllib.parse import urlsplit

# openai's per-request option arguments: given, the call goes openai's way.
_REQUEST_OPTIONS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
_REQUIRED = ("messages", "model")


@functools.cache
def fast_chat_class() -> type:
    """openai's ``AsyncChat`` whose ``completions.create`` answers in process (the class, made once)."""
    from openai.resources.chat import AsyncChat
    from openai.resources.chat.completions import AsyncCompletions

    class FastAsyncCompletions(AsyncCompletions):
        async def create(self, **kwargs: Any) -> Any:  # type: ignore[override]
            answer = await create_in_process(self._client, kwargs)
            if answer is not None:
                return answer
            return await super().create(**kwargs)

    class FastAsyncChat(AsyncChat):
        @functools.cached_property
        def completions(self) -> Any:  # type: ignore[override]
            return FastAsyncCompletions(self._client)

    return FastAsyncChat


async def create_in_process(client: Any, kwargs: dict[str, Any]) -> Any | None:
    """The ``ChatCompletion`` for ``create(**kwargs)`` answered by the in-process gateway, or
    None when this call must take openai's path (nothing has been sent then)."""
    if os.environ.get("RLLM_FAST_CHAT") == "0":  # off: every call takes openai's path
        return None
    body = _plain_body(kwargs)
    if body is None or not _client_allows(client):
        return None
    handler, path, headers = _target(client)
    if handler is None or headers is None:
        return None
    content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    answer = await handler("POST", path, "", headers, content)
    if answer is None:  # declined before doing anything: openai's path
        return None
    return _parse(client, *answer)


def _plain_body(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The request body openai would send for ``kwargs``, or None where only openai can tell."""
    names = _create_parameters()
    if names is None or any(k in _REQUEST_OPTIONS or k not in names for k in kwargs):
        return None
    from openai import NotGiven, Omit

    body = {k: v for k, v in kwargs.items() if not isinstance(v, NotGiven | Omit)}
    if body.get("stream") or any(k not in body for k in _REQUIRED):
        return None
    return body if all(_is_plain(v) for v in body.values()) else None


def _is_plain(value: Any) -> bool:
    """JSON data as json.loads makes it: what openai's transform leaves as it is."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return True
    if kind is list:
        return all(_is_plain(v) for v in value)
    if kind is dict:
        return all(type(k) is str and _is_plain(v) for k, v in value.items())
    return False


@functools.cache
def _create_parameters() -> frozenset[str] | None:
    """``create``'s keyword names, or None when a chat parameter has an alias or a format."""
    from openai.resources.chat.completions import AsyncCompletions
    from openai.types.chat import completion_create_params

    if _has_field_transform(completion_create_params.CompletionCreateParamsNonStreaming, set()):
        return None
    return frozenset(inspect.signature(AsyncCompletions.create).parameters) - {"self"}


def _has_field_transform(annotation: Any, seen: set[int]) -> bool:
    """Whether openai's transform would rename or reformat a field anywhere under ``annotation``."""
    import typing
    from typing import Annotated, get_args, get_origin

    from openai._utils._transform import PropertyInfo

    if id(annotation) in seen:
        return False
    seen.add(id(annotation))
    if get_origin(annotation) is Annotated:
        inner, *extras = get_args(annotation)
        if any(isinstance(e, PropertyInfo) and (e.alias or e.format) for e in extras):
            return True
        return _has_field_transform(inner, seen)
    # A TypedDict (typing's or typing_extensions'): a dict subclass carrying ``__total__``.
    if isinstance(annotation, type) and issubclass(annotation, dict) and hasattr(annotation, "__total__"):
        hints = typing.get_type_hints(annotation, include_extras=True)
        return any(_has_field_transform(h, seen) for h in hints.values())
    return any(_has_field_transform(a, seen) for a in get_args(annotation))


def _client_allows(client: Any) -> bool:
    # Retries and strict validation are openai's to run; a token provider or workload identity
    # computes its headers per request.
    return (
        client.max_retries == 0
        and not client._strict_response_validation
        and getattr(client, "_provider_runtime", None) is None
        and getattr(client, "workload_identity", None) is None
    )


def _target(client: Any) -> tuple[Any, str, dict[str, str] | None]:
    """The in-process handler for ``client``'s calls (or None), their path and headers: remembered
    since the client was copied (``rllm.sdk.clients.in_process_target``), else worked out now."""
    from rllm.sdk.clients import in_process_target

    known = in_process_target(client)
    if known is not None:
        handler, path, _ = known
        return handler, path, {**_copied_headers(), **_lower(client.auth_headers)}
    handler, path = _route(client)
    return (handler, path, _headers(client)) if handler is not None else (None, "", None)


@functools.cache
def _copied_headers() -> dict[str, str]:
    """``_headers`` of a client ``async_openai`` copies, less its key's: the same for every copy
    (a copy differs from its template in base URL and key alone). Read, never changed."""
    from rllm.sdk.clients import _template_client

    template = _template_client()
    headers = _headers(template) or {}
    for name in _lower(template.auth_headers):
        headers.pop(name, None)
    return headers


def _lower(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if isinstance(v, str)}


def _route(client: Any) -> tuple[Any, str]:
    """The in-process handler serving ``client``'s base URL on this loop (or None), and the path."""
    from rllm.sdk.clients import in_process_handler

    base = str(client.base_url)
    parts = urlsplit(base)
    if parts.query or parts.fragment or not parts.path.endswith("/"):
        return None, ""
    return in_process_handler(asyncio.get_running_loop(), base), parts.path + "chat/completions"


def _headers(client: Any) -> dict[str, str] | None:
    """openai's headers for this client, lower-cased (an omitted one left out), or None when it
    has no credentials (openai's path raises its own error then)."""
    auth = client.auth_headers
    if not auth:
        return None
    return _lower({**client.default_headers, **auth})


@functools.cache
def _http_library(client_class: type) -> Any:
    """The httpx library an http client class comes from: httpx, or httpx2 (openai 3)."""
    base = next(c for c in client_class.__mro__ if c.__module__.startswith("httpx"))
    return sys.modules[base.__module__.split(".")[0]]


def _parse(client: Any, status: int, headers: dict[str, str], content: bytes) -> Any:
    """openai's answer for an HTTP answer: its ``ChatCompletion``, or its status error."""
    from openai.types.chat import ChatCompletion

    parsed = _validated(content) if 200 <= status < 300 else None
    if parsed is None:
        data: Any = None
        if 200 <= status < 300:
            try:
                data = json.loads(content)
            except ValueError:
                data = None
        if type(data) is not dict:
            _raise_for(client, status, headers, content)
        # What openai's parsing does with a JSON object for a model (no strict validation: see
        # _client_allows): its own ``construct``, nested models and all.
        parsed = ChatCompletion.construct(**data)
    parsed._request_id = headers.get("x-request-id")
    return parsed


def _validated(content: bytes) -> Any | None:
    """The ``ChatCompletion`` openai's ``construct`` makes of ``content``, made by pydantic's strict
    validation, or None where the answer does not pass it (``construct`` then).

    openai's ``construct`` keeps every value of a well-formed answer as it is and validates its
    nested optional fields itself, so for an answer strict validation accepts the two give the same
    object (once the extra keys are taken out of the set fields where ``construct`` leaves them out:
    ``_as_constructed``), at a tenth of the CPU: ~10 against ~105 us a call
    (benchmarks/history/issue-35.md, "#35 round 11b"), 32 calls a step on the toy config.
    ``test_sdk_fast_chat`` holds generated answers to it. Strict: no coercion (a string for a
    number), where ``construct`` would keep the value as sent."""
    from openai.types.chat import ChatCompletion

    try:
        parsed = ChatCompletion.__pydantic_validator__.validate_json(content, strict=True)
    except ValueError:  # pydantic's ValidationError: malformed JSON, a missing field, a wrong type
        return None
    _as_constructed(parsed)
    return parsed


def _as_constructed(model: Any) -> None:
    """Take ``model``'s extra keys out of its set fields, as openai's ``construct`` does, here and
    in the models ``construct`` builds itself below it (those under a union it validates: their
    extras stay set)."""
    extra = model.__pydantic_extra__
    if extra:
        object.__setattr__(model, "__pydantic_fields_set__", model.__pydantic_fields_set__ - extra.keys())
    values = model.__dict__
    for name in _constructed_fields(type(model)):
        _as_constructed_within(values[name])


def _as_constructed_within(value: Any) -> None:
    if type(value) is list:
        for item in value:
            _as_constructed_within(item)
    elif type(value) is dict:
        for item in value.values():
            _as_constructed_within(item)
    elif value is not None and hasattr(value, "__pydantic_extra__"):
        _as_constructed(value)


@functools.cache
def _constructed_fields(model: type) -> tuple[str, ...]:
    """The fields of ``model`` in which openai's ``construct`` builds models by ``construct``."""
    return tuple(n for n, f in model.model_fields.items() if _constructs(f.annotation))  # pyright: ignore[reportAttributeAccessIssue]


def _constructs(annotation: Any) -> bool:
    """Whether openai's ``construct_type`` builds a model by ``construct`` somewhere in ``annotation``
    (a model, or a list or dict of them; a union it validates instead)."""
    import typing

    from openai import BaseModel  # (what openai's construct_type builds by construct)

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _constructs(args[0])
    if origin is list:
        return bool(args) and _constructs(args[0])
    if origin is dict:
        return len(args) > 1 and _constructs(args[1])
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _raise_for(client: Any, status: int, headers: dict[str, str], content: bytes) -> None:
    """openai's exception for an error status (or a success without a JSON object)."""
    from openai import APIResponseValidationError

    http = _http_library(type(client._client))
    request = http.Request("POST", str(client.base_url) + "chat/completions")
    response = http.Response(status, headers=headers, content=content, request=request)
    if not 200 <= status < 300:
        raise client._make_status_error_from_response(response)
    raise APIResponseValidationError(
        response=response, body=content, message="the answer is not a JSON object"
    )
