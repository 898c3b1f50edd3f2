"""The OpenEnv adapter against the real openenv-core: its own server (``create_app`` under
uvicorn on loopback, in this process or a subprocess) and its own session client, played by a
scripted loopback model (rllm.testing's MockUpstream) through rLLM's engine and gateway, in text
mode (``actions=text``; native tool calls: test_openenv_tools.py). The rewards are the
environment's; a reply the environment refuses goes back to the model; a server that is down or
dies mid-rollout is an infra error with the reason; bad names and versions are refused in one
line."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from openenv_helpers import bisecting, bisecting_tools, run
from rllm_adapter_openenv import EXAMPLE_APP, cookbook_for, environments
from rllm_adapter_openenv.environments import (
    EnvAddress,
    InvalidAction,
    UnsupportedVersion,
    check_manifest,
    check_version,
    to_action,
)

from rllm.cli.main import cli
from rllm.sdk import InfraError
from rllm.testing import MockUpstream
from rllm.types import Task, TerminationReason
from rllm.types.errors import MissingExtraError


@pytest.fixture
def served() -> Iterator[tuple[subprocess.Popen, str]]:
    """The example environment served by openenv-core's server in a process of its own."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rllm_adapter_openenv.serving", EXAMPLE_APP], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once it listens
        assert line.startswith("ready "), line
        yield proc, line.split()[1]
    finally:
        proc.kill()
        proc.wait(timeout=60)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


TEXT = {"actions": "text"}


async def test_an_episode_is_played_over_the_environments_session_and_scored_by_its_rewards() -> None:
    tasks = cookbook_for("example", {"test_size": 3, **TEXT}).load_tasks("test")
    episodes = await run(tasks, bisecting())
    for episode in episodes:
        assert episode.termination_reason == TerminationReason.DONE, episode.error
        assert episode.metrics["reward"] == 1.0 and episode.artifacts["rewards"][-1] == 1.0
        steps = episode.trajectories[0].steps
        assert len(steps) == episode.artifacts["turns"] == episode.metrics["signal/openenv/turns"]
        assert steps[0].input[-1].text.startswith("guess the number")  # the reset's observation
        heard = [s.input[-1].text for s in steps[1:]]
        assert all(text in ("higher", "lower") for text in heard)  # each step's observation


async def test_a_lost_game_is_the_environments_zero_and_a_refused_reply_goes_back_to_the_model() -> None:
    (task,) = cookbook_for("example", {"test_size": 1, **TEXT}).load_tasks("test")
    (lost,) = await run([task], lambda body: "9")  # never right: four guesses, then done with 0
    assert lost.termination_reason == TerminationReason.DONE
    assert lost.artifacts["rewards"] == [0.0] * 4 and lost.metrics["reward"] == 0.0

    (episode,) = await run([task], bisecting(first="seven"))
    assert episode.metrics["reward"] == 1.0 and episode.metrics["signal/openenv/invalid_actions"] == 1.0
    refusal = episode.trajectories[0].steps[1].input[-1].text
    assert refusal.startswith("error: invalid action: guess:") and "integer" in refusal
    assert episode.artifacts["errors"][0].startswith("invalid action: guess:")  # the reason, recorded
    assert episode.trajectories[0].steps[0].reward == 0.0 and episode.trajectories[0].steps[-1].reward == 1.0


async def test_a_running_server_by_url(served: tuple[subprocess.Popen, str]) -> None:
    _, url = served
    tasks = cookbook_for(url, {"size": 2, **TEXT}).load_tasks("train")
    episodes = await run(tasks, bisecting())
    assert [e.metrics["reward"] for e in episodes] == [1.0, 1.0]


async def test_a_server_that_dies_mid_rollout_is_an_infra_error_with_the_reason(
    served: tuple[subprocess.Popen, str],
) -> None:
    proc, url = served
    (task,) = cookbook_for(url, {"size": 1, **TEXT}).load_tasks("train")

    def responder(body: dict[str, Any]) -> str:
        if len(body["messages"]) == 3:  # the second reply: the server goes before it is played
            proc.kill()
            proc.wait(timeout=60)
        return "1"

    (episode,) = await run([task], responder)
    assert episode.termination_reason == TerminationReason.INFRA_ERROR
    message = episode.error.message if episode.error else ""
    assert f"OpenEnv server {url} failed during step" in message, message


async def test_a_server_that_is_down_is_an_infra_error_before_and_during_a_run() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(InfraError, match=f"the OpenEnv server at {re.escape(url)} is down: URLError"):
        cookbook_for(url)
    address = environments.msgspec.to_builtins(EnvAddress(name=url, url=url, action_field="guess"))
    task = Task(id="t", instruction="x", metadata={"openenv": {"address": address, "seed": 0}})
    (episode,) = await run([task], bisecting())
    assert episode.termination_reason == TerminationReason.INFRA_ERROR
    message = episode.error.message if episode.error else ""
    assert f"OpenEnv server {url} failed during connect" in message and "Connect call failed" in message, (
        message
    )


def test_rllm_eval_runs_an_openenv_environment_unchanged(tmp_path: Path) -> None:
    """`rllm eval openenv:example` as a user types it, against a loopback model that bisects by
    native tool calls (the default)."""
    model = MockUpstream(responder=bisecting_tools()).start_in_thread()
    try:
        out = tmp_path / "eval"
        args = ["eval", "openenv:example", "--base-url", model.url, "--out", str(out), "--no-progress"]
        result = CliRunner().invoke(
            cli, [*args, "--max-tokens", "64", "--option", "test_size=2"], catch_exceptions=False
        )
    finally:
        model.stop_in_thread()
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_tasks"] == 2 and summary["accuracy"] == 1.0, summary


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nosuch", "no OpenEnv environment 'nosuch' (installed OpenEnv environments:"),
        ("nosuch_pkg.app:app", "module 'nosuch_pkg' is not installed"),
        ("rllm_adapter_openenv.examples.guess:nothing", "has no OpenEnv app 'nothing'"),
    ],
)
def test_a_name_that_is_no_environment_is_refused_naming_it(name: str, message: str) -> None:
    result = CliRunner().invoke(cli, ["eval", f"openenv:{name}", "--base-url", "http://127.0.0.1:9/v1"])
    assert result.exit_code != 0 and message in " ".join(result.output.split()), result.output


def test_an_unsupported_version_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnsupportedVersion, match=r"openenv-core 0\.2\.1 is not supported .*>=0\.3,<0\.4"):
        check_version("0.2.1")
    with pytest.raises(UnsupportedVersion, match=r"openenv-core 0\.4\.0 is not supported"):
        check_version("0.4.0")
    check_version("0.3.0")
    with pytest.raises(UnsupportedVersion, match=r"'echo' declares spec_version 2; .* supports 1"):
        check_manifest("echo", {"spec_version": 2})
    check_manifest("echo", {"spec_version": 1})

    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(environments, "version", missing)  # the installed-package lookup, not openenv
    with pytest.raises(MissingExtraError, match="openenv-core is not installed: pip install openenv-core"):
        cookbook_for("example")


def test_unknown_options_are_refused() -> None:
    with pytest.raises(
        Exception, match="has options size, test_size, max_turns, actions, sandbox, not turns"
    ):
        cookbook_for("example", {"turns": 3})


FIELD = st.text(alphabet=st.characters(categories=("L", "N"), max_codepoint=0x7F), min_size=1, max_size=8)


@given(field=FIELD, reply=st.text(max_size=40))
def test_a_one_field_action_takes_the_reply_itself(field: str, reply: str) -> None:
    address = EnvAddress(name="e", url="u", action_field=field, action_fields=(field,))
    assert to_action(reply, address) == {field: reply.strip()}


@given(
    value=st.dictionaries(FIELD, st.integers() | st.text(max_size=8), max_size=4), noise=st.text(max_size=4)
)
def test_a_many_field_action_is_the_replys_json_object_and_nothing_else(value: dict, noise: str) -> None:
    address = EnvAddress(name="e", url="u", action_fields=("a", "b"))
    assert to_action(f" {json.dumps(value)}\n", address) == value
    for reply in (json.dumps([value]), json.dumps(len(value)), f"{json.dumps(value)} x{noise}"):
        with pytest.raises(InvalidAction, match=r"a JSON object of the action's fields \(a, b\)"):
            to_action(reply, address)
