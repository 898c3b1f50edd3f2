"""Session URL helpers: role routing and client kwargs."""

from __future__ import annotations

import pytest

from rllm.sdk import (
    AgentConfig,
    SamplingParams,
    client_kwargs,
    role_url,
    sampling_kwargs,
    session_id_from_url,
)


def test_role_url_inserts_the_role_before_v1():
    cfg = AgentConfig(base_url="http://127.0.0.1:8000/sessions/abc/v1", api_key="tok")
    assert role_url(cfg, "judge") == "http://127.0.0.1:8000/sessions/abc/roles/judge/v1"
    assert role_url(cfg.base_url + "/", "solver") == "http://127.0.0.1:8000/sessions/abc/roles/solver/v1"


def test_role_url_replaces_an_existing_role():
    url = "http://gw/prefix/sessions/abc/roles/solver/v1"
    assert role_url(url, "judge") == "http://gw/prefix/sessions/abc/roles/judge/v1"
    assert session_id_from_url(url) == "abc"


def test_role_url_leaves_non_gateway_urls_alone():
    assert role_url("https://api.openai.com/v1", "judge") == "https://api.openai.com/v1"
    assert session_id_from_url("https://api.openai.com/v1") is None


@pytest.mark.parametrize("role", ["", "has/slash", "x" * 65, "-leading", "sp ace"])
def test_role_url_rejects_bad_role_names(role):
    with pytest.raises(ValueError, match="invalid role name"):
        role_url("http://gw/sessions/a/v1", role)


def test_client_and_sampling_kwargs():
    cfg = AgentConfig(
        base_url="http://gw/sessions/a/v1",
        api_key="tok",
        sampling=SamplingParams(temperature=0.7, max_tokens=64),
    )
    assert client_kwargs(cfg) == {"base_url": "http://gw/sessions/a/v1", "api_key": "tok"}
    assert client_kwargs(cfg, "judge")["base_url"] == "http://gw/sessions/a/roles/judge/v1"
    assert sampling_kwargs(cfg) == {"temperature": 0.7, "max_tokens": 64}


def test_sdk_import_pulls_no_heavy_dependencies():
    import subprocess
    import sys

    code = (
        "import sys, rllm.sdk, rllm.sdk.rewards\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'litellm', 'aiohttp', 'openai', 'httpx', 'numpy', 'fastapi', 'uvicorn'))\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
