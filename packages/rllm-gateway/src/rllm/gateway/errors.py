"""OpenAI-style JSON errors: every failure the gateway reports has this shape and a fitting status."""

from __future__ import annotations

import msgspec

from rllm.runtime.http_messages import Response
from rllm.types.errors import RLLMError

_encode = msgspec.json.Encoder().encode

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


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
    err_type = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return _encode(
        {"error": {"message": message, "type": err_type, "param": param, "code": code or str(status)}}
    )


def error_response(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> Response:
    return Response(
        status=status,
        body=error_body(status, message, param=param, code=code),
        content_type="application/json",
    )
