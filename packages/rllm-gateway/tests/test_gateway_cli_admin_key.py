"""`rllm-gateway serve` without an admin key: one warning line on loopback (the admin routes
are open there), a one-line refusal (exit 2) on any other address unless --insecure-no-admin-key
says so. Real processes; each waits on the line the gateway prints once it listens."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllm.gateway.config import GatewayConfig, is_loopback
from rllm.types import InvariantError

WARNING = "rllm-gateway: warning: no admin key: the admin routes on"
BASE = ["serve", "--port", "0", "--health-interval-s", "0", "--upstream", "http://127.0.0.1:9/v1"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RLLM_GATEWAY_ADMIN_KEY"}
    return {**env, **extra}


def _refused(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rllm.gateway.command", *BASE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env or _env(),
        check=False,
    )


def _served(*args: str, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """The line saying where it listens, and stderr's lines, of a gateway stopped once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rllm.gateway.command", *BASE, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or _env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once it listens, after any warning
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert line.startswith("rllm-gateway listening on"), (line, err)
    return line, err.splitlines()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gateway.example"])
def test_a_non_loopback_host_without_a_key_is_refused_in_one_line(host: str) -> None:
    done = _refused("--host", host)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("rllm-gateway: ") and "not a loopback address" in line, line
    assert "--admin-key" in line and "--insecure-no-admin-key" in line
    assert done.stdout == ""  # it never listened


def test_loopback_without_a_key_warns_in_one_line_that_admin_routes_are_open() -> None:
    _, err = _served()
    warnings = [line for line in err if line.startswith(WARNING)]
    assert len(warnings) == 1, err
    assert "open" in warnings[0] and "--admin-key" in warnings[0]


def test_a_key_from_the_flag_or_the_environment_silences_the_warning() -> None:
    _, err = _served("--admin-key", "k")
    assert not [line for line in err if "admin" in line], err
    _, err = _served(env=_env(RLLM_GATEWAY_ADMIN_KEY="k"))
    assert not [line for line in err if "admin" in line], err


def test_a_non_loopback_host_is_served_with_a_key_or_the_explicit_opt_out() -> None:
    # Port 0 on every interface, for the instant it takes to print where it listens.
    line, err = _served("--host", "0.0.0.0", "--admin-key", "k")
    assert line.startswith("rllm-gateway listening on http://0.0.0.0:")
    assert not [x for x in err if "admin" in x], err
    _, err = _served("--host", "0.0.0.0", "--insecure-no-admin-key")
    assert len([x for x in err if x.startswith(WARNING)]) == 1, err


def test_the_rllm_cli_refuses_the_same_way() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rllm.cli.main", "gateway", *BASE, "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()][-1].startswith("rllm-gateway: ")


@given(st.ip_addresses())
def test_a_config_needs_a_key_exactly_off_loopback(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    host = str(ip)
    assert is_loopback(host) == ip.is_loopback
    if ip.is_loopback:
        assert GatewayConfig(host=host).admin_key is None
    else:
        with pytest.raises(InvariantError, match="not a loopback address"):
            GatewayConfig(host=host)
        assert GatewayConfig(host=host, admin_key="k").host == host
        assert GatewayConfig(host=host, insecure_no_admin_key=True).host == host


def test_repr_hides_the_secrets() -> None:
    text = repr(GatewayConfig(admin_key="s3cr3t-admin", hosted_api_key="s3cr3t-provider"))
    assert "s3cr3t" not in text and "admin_key=<hidden>" in text and "hosted_model=None" in text
    assert "admin_key=None" in repr(GatewayConfig())
