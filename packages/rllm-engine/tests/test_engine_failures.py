"""Exception classification: real client exceptions from openai/httpx/aiohttp, by duck typing."""

from __future__ import annotations

import aiohttp
import httpx
import openai
import pytest

from rllm.engine.rollout.failures import classify_exception
from rllm.sdk import InfraError
from rllm.types import TerminationReason

REQUEST = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")


def status_error(status: int, message: str) -> openai.APIStatusError:
    response = httpx.Response(status, request=REQUEST, json={"error": {"message": message}})
    return openai.OpenAI(api_key="x", base_url="http://127.0.0.1:1/v1")._make_status_error_from_response(
        response
    )


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (openai.APIConnectionError(request=REQUEST), TerminationReason.INFRA_ERROR),
        (openai.APITimeoutError(request=REQUEST), TerminationReason.INFRA_ERROR),
        (status_error(502, "bad gateway"), TerminationReason.INFRA_ERROR),
        (status_error(429, "slow down"), TerminationReason.INFRA_ERROR),
        (
            status_error(400, "This model's maximum context length is 4096 tokens"),
            TerminationReason.CONTEXT_LIMIT,
        ),
        (status_error(400, "messages must be a list"), TerminationReason.AGENT_ERROR),
        (status_error(404, "unknown session"), TerminationReason.AGENT_ERROR),
        (httpx.ConnectError("refused"), TerminationReason.INFRA_ERROR),
        (aiohttp.ServerDisconnectedError(), TerminationReason.INFRA_ERROR),
        (ConnectionResetError(), TerminationReason.INFRA_ERROR),
        (InfraError("sandbox died"), TerminationReason.INFRA_ERROR),
        (ValueError("bad parse"), TerminationReason.AGENT_ERROR),
        (TimeoutError("flow's own timeout"), TerminationReason.AGENT_ERROR),
    ],
)
def test_classify_exception(exc, reason):
    assert classify_exception(exc) == reason


def test_wrapped_infra_errors_are_found_along_the_chain():
    try:
        try:
            raise httpx.ConnectError("refused")
        except httpx.ConnectError as inner:
            raise RuntimeError("tool call failed") from inner
    except RuntimeError as outer:
        assert classify_exception(outer) == TerminationReason.INFRA_ERROR
