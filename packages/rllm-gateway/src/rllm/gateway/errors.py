"""OpenAI-style JSON errors: every failure the gateway reports has this shape and a fitting status."""

from __future__ import annotations

import msgspec

from rllm.runtime.http_messages import Response
from rllm.types import openai
from rllm.types.errors import RLLMError

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
