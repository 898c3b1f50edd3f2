"""What `--help` and the listing commands tell a new user: subcommands, every flag's meaning and
default, the default backend and what each needs, the model a cookbook trains."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

from click.testing import CliRunner

from rllm.cli.main import cli
from rllm.gateway.command import build_parser


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_gateway_help_lists_its_subcommand() -> None:
    code, out, _ = invoke("gateway", "--help")
    assert code == 0 and "Subcommands:" in out and "serve" in out


def test_every_gateway_serve_flag_has_help() -> None:
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    serve = subparsers.choices["serve"]
    undocumented = [a.option_strings[0] for a in serve._actions if a.option_strings and not a.help]
    assert undocumented == []
    text = serve.format_help()
    assert "(default: 127.0.0.1)" in text and "(default: memory)" in text


def test_a_gateway_without_upstream_warns_at_start() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rllm.gateway.command", "serve", "--port", "0", "--health-interval-s", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()  # printed once it listens, after the warning
        assert line.startswith("rllm-gateway listening on"), line
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert "warning: no --upstream and no --hosted-model" in err


def test_backends_shows_the_default_and_what_each_needs() -> None:
    code, out, _ = invoke("backends")
    lines = {line.split(":")[0]: line for line in out.splitlines()}
    assert code == 0 and lines["tinker (default)"].startswith("tinker (default): needs ")
    assert all(": needs " in line for line in lines.values())


def test_cookbook_info_shows_the_model() -> None:
    code, out, _ = invoke("cookbook", "info", "say")
    assert code == 0 and "model (rllm train): tiny" in out
