"""OpenAI-style JSON errors: every failure the gateway reports has this shape and a fitting status."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

import msgspec

from rllm.runtime.http_messages import Request, Response, StreamResponse
from rllm.types import openai
from rllm.types.errors import RLLMError

log = logging.getLogger("rllm.gateway")
_encode = msgspec.json.Encoder().encode


class GatewayError(RLLMError):
    """Raised inside a handler; the error middleware turns it into an OpenAI-style response."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> bytes:
    return _encode(openai.error_body(status, message, param=param, code=code))


def error_response(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> Response:
    return Response(
        status=status,
        body=error_body(status, message, param=param, code=code),
        content_type="application/json",
    )


def gateway_error_response(exc: GatewayError) -> Response:
    """The OpenAI-style answer for a GatewayError."""
    return error_response(exc.status, exc.message, param=exc.param, code=exc.code)


async def answer_or_error(
    request: Request, answer: Awaitable[Response | StreamResponse]
) -> Response | StreamResponse:
    """``await answer``, with every failure mapped to an OpenAI-style error: the gateway answers,
    it never crashes (an unexpected exception is logged and answered 500)."""
    try:
        return await answer
    except GatewayError as exc:
        return gateway_error_response(exc)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        log.exception("internal error on %s", request.path)
        return internal_error_response(exc)


def internal_error_response(exc: BaseException) -> Response:
    """The 500 for a bug: the exception's type and message, nothing else."""
    return error_response(500, f"internal gateway error: {type(exc).__name__}: {exc}")
