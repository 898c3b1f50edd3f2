"""The verifiers adapter against the real verifiers library: its single-turn, multi-turn and tool
environments run by rLLM's engine through a real gateway, a scripted loopback model (rllm.testing's
MockUpstream) answering; each environment's own rubric scores; failures and refusals by name."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rllm_adapter_verifiers import cookbook_for, environments

from rllm.cli.main import cli
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.testing import MockReply, MockUpstream
from rllm.types import Episode, SamplingParams, TerminationReason

EXAMPLES = "rllm_adapter_verifiers.examples"


def say_back(body: dict[str, Any]) -> str | MockReply:
    """Says the last word it was asked for; asked with tools, looks k1 up first, then says the result."""
    last = body["messages"][-1]
    if body.get("tools") and last["role"] == "user":
        return MockReply(tool_calls=[("lookup", json.dumps({"key": "k1"}))])
    return last["content"].split()[-1]


async def run(spec: str, n_tasks: int, responder=say_back, **mock: Any) -> list[Episode]:
    cookbook = cookbook_for(spec)
    config = RolloutConfig(
        n=1, concurrency=4, progress=False, max_retries=0, sampling=SamplingParams(max_tokens=200)
    )
    async with MockUpstream(responder=responder) as server:
        if mock:
            server.failure = mock["failure"]
        async with RolloutEngine(cookbook.flow, cookbook.evaluator, config, upstreams=[server.url]) as engine:
            return await engine.run(cookbook.load_tasks("train")[:n_tasks])


def signals(episode: Episode) -> dict[str, float]:
    return {k.removeprefix("signal/"): v for k, v in episode.metrics.items() if k.startswith("signal/")}


async def test_a_single_turn_environment_is_scored_by_its_rubric() -> None:
    episodes = await run(f"{EXAMPLES}.say", 3)
    assert [e.termination_reason for e in episodes] == [TerminationReason.DONE] * 3
    assert [e.metrics["reward"] for e in episodes] == [1.0, 1.0, 1.0] and all(e.is_correct for e in episodes)
    assert all(signals(e)["vf/said_the_word"] == 1.0 for e in episodes)
    # The environment's system prompt and question went through the gateway and were recorded.
    (step,) = episodes[0].trajectories[0].steps
    assert [m.role for m in step.input] == ["system", "user"] and step.completion_ids is not None


async def test_a_multi_turn_environment_runs_its_env_responses_through_the_session() -> None:
    (episode,) = await run(f"{EXAMPLES}.turns", 1)
    steps = episode.trajectories[0].steps
    assert len(steps) == 2 and steps[1].input[-1].text == "say: river"  # the environment's turn
    assert episode.metrics["reward"] == 1.0 and signals(episode)["vf/num_turns"] == 2.0


async def test_a_tool_environment_offers_its_tools_as_native_calls() -> None:
    episodes = await run(f"{EXAMPLES}.tools", 2)
    first = episodes[0].trajectories[0].steps
    assert first[0].output is not None and first[0].output.tool_calls
    assert first[0].output.tool_calls[0].function.name == "lookup"
    assert first[1].input[-1].role == "tool" and first[1].input[-1].text == "river"
    # k1 holds "river": right for task 1 (k1), wrong for task 0 (k0, "apple").
    assert [e.metrics["reward"] for e in episodes] == [0.0, 1.0]
    assert all(signals(e)["vf/lookup_calls"] == 1.0 for e in episodes)


async def test_a_model_endpoint_that_fails_is_an_infra_error_not_a_score() -> None:
    from rllm.testing.mock_upstream import MockFailure

    (episode,) = await run(f"{EXAMPLES}.say", 1, failure=MockFailure(mode="status", status=500))
    assert episode.termination_reason == TerminationReason.INFRA_ERROR
    assert episode.error is not None and "verifiers ModelError" in episode.error.message


def test_rllm_eval_runs_an_environment(tmp_path: Path) -> None:
    server = MockUpstream(responder=say_back).start_in_thread()
    try:
        args = ["eval", f"verifiers:{EXAMPLES}.say", "--base-url", server.url, "--out", str(tmp_path / "e")]
        result = CliRunner().invoke(cli, [*args, "--no-progress"])
    finally:
        server.stop_in_thread()
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert summary["num_tasks"] == 2 and summary["accuracy"] == 1.0  # the environment's eval set


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        (
            "verifiers:no_such_env",
            [],
            "no verifiers environment 'no_such_env': module 'no_such_env' is not installed",
        ),
        (f"verifiers:{EXAMPLES}.say", ["--option", "num_wordz=2"], "did not load: .*num_wordz"),
        (f"verifiers:{EXAMPLES}.turns", [], "has splits 'train', not 'test'"),
    ],
)
def test_bad_input_is_refused_in_one_line(
    spec: str, options: list[str], message: str, tmp_path: Path
) -> None:
    args = ["eval", spec, *options, "--base-url", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "e")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and re.search(message, result.output), result.output


def test_an_unsupported_verifiers_version_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environments, "version", lambda name: "0.4.0")
    with pytest.raises(environments.UnsupportedVersion, match=r"verifiers 0\.4\.0 is not supported .*<0\.4"):
        cookbook_for(f"{EXAMPLES}.say")
