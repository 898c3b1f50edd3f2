"""An evaluation whose rollouts fail for infrastructure reasons says why, fails, and retries them.

Real loopback servers: a port that refuses connections stands for a dead endpoint, the mock
model server for a live one, and LiteLLM without a key for a hosted model with no credentials.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from rllm.cli.eval_cmd import root_cause
from rllm.cli.main import cli
from rllm.testing import MockUpstream

BYTES = ["--max-tokens", "16"]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def dead_url() -> Iterator[str]:
    # Bound but never listening: every connection is refused, and no other test can take the port.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    sock.close()


def _eval(out: Path, *flags: str) -> tuple[int, str, str]:
    return invoke(
        "eval", "say-single", "--out", str(out), "--max-examples", "2", "--no-progress", *BYTES, *flags
    )


def test_a_dead_endpoint_fails_with_its_root_cause(dead_url: str, tmp_path: Path) -> None:
    code, _, err = _eval(tmp_path / "eval", "--base-url", dead_url)
    assert code == 1
    assert "2 of 2 rollouts failed for infrastructure reasons" in err
    assert f"cannot connect to 127.0.0.1:{dead_url.split(':')[2].split('/')[0]}" in err
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["infra_errors"] == 2 and summary["errors"]


def test_the_threshold_is_the_users(dead_url: str, tmp_path: Path) -> None:
    code, _, err = _eval(tmp_path / "eval", "--base-url", dead_url, "--max-infra-errors", "1")
    assert code == 0
    assert "failed attempt (infra_error)" in err and "cannot connect" in err


def test_a_resumed_eval_retries_the_infra_failures(
    dead_url: str, model_server: MockUpstream, tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    assert _eval(out, "--base-url", dead_url)[0] == 1
    # The endpoint came back elsewhere: --resume takes another address only when asked.
    code, _, err = _eval(out, "--base-url", model_server.url, "--resume")
    assert code == 2 and "base_url" in err and "--allow-changes base_url" in err
    code, stdout, err = _eval(out, "--base-url", model_server.url, "--resume", "--allow-changes", "base_url")
    assert code == 0, err
    assert " resumed)" not in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["termination"] == {"done": 2} and summary["infra_errors"] == 0
    # Then they are results: a third run has nothing left to do.
    code, stdout, _ = _eval(out, "--base-url", model_server.url, "--resume")
    assert code == 0 and "2 resumed" in stdout


def test_a_hosted_model_without_credentials_names_the_missing_key(
    model_server: MockUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("RLLM_GATEWAY_HOSTED_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = _eval(tmp_path / "eval", "--model", "openai/mock", "--api-base", model_server.url)
    assert code == 1
    assert "Give Feedback" not in out + err  # LiteLLM's banner, once per failed call
    assert "OPENAI_API_KEY" in err and "Missing credentials" in err
    assert "hosted provider failed" not in err  # the wrapper is cut away, the cause stays


def test_root_cause_unwraps_client_and_gateway_messages() -> None:
    wrapped = (
        "InternalServerError: Error code: 500 - hosted provider failed: InternalServerError: "
        "litellm.InternalServerError: OpenAIException - Missing credentials. Set OPENAI_API_KEY."
    )
    assert root_cause(wrapped) == "Missing credentials. Set OPENAI_API_KEY."
    assert root_cause("ValueError: bad answer") == "bad answer"
    assert root_cause("plain text") == "plain text"


async def test_the_hosted_model_gateway_opens_its_admin_routes_only_to_the_engine() -> None:
    """`rllm eval --model provider/name` starts a gateway for LiteLLM and attaches the engine to
    it: with a fresh admin key that only the engine gets, never open admin routes."""
    from rllm.cli.eval_cmd import _endpoint
    from rllm.gateway import GatewayAPIError, GatewayClient

    async with _endpoint(None, "openai/gpt-4o-mini", None) as (endpoint, url, key):
        assert endpoint is None and url is not None and key is not None and len(key) >= 32
        async with GatewayClient(url) as anyone:
            with pytest.raises(GatewayAPIError) as refused:
                await anyone.list_sessions()
            assert refused.value.status == 401
        async with GatewayClient(url, admin_key=key) as engine:
            assert await engine.list_sessions() == []
    async with _endpoint("http://127.0.0.1:9/v1", "m", None) as (endpoint, url, key):
        assert (endpoint, url, key) == ("http://127.0.0.1:9/v1", None, None)  # the engine's own
