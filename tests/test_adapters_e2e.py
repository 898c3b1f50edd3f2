"""Each environment adapter's CI example: 2 training steps on the tiny model (the local tinker
backend, cumulative-mode gateway), the cookbook found from its `PREFIX:NAME` spec exactly as
`rllm train` finds it (rllm.cli.adapters)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rllm.cli.adapters import adapter_cookbook
from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_metrics

FAST = ["progress=false", "plot=false", "tensorboard=false", "val_every=0"]
SMALL = ["total_steps=2", "tasks_per_step=2", "group_size=2", "algorithm.filter_zero_variance=false"]


def train_two_steps(spec: str, out: Path, *overrides: str) -> list[dict]:
    cookbook = adapter_cookbook(spec)
    assert cookbook is not None
    trainer = build_trainer(spec, cookbook=cookbook, out_dir=str(out), overrides=[*FAST, *SMALL, *overrides])
    asyncio.run(trainer.fit())
    rows = read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["train/sequences"] >= row["episodes"] == 4 for row in rows), rows
    return rows


@pytest.mark.slow
def test_reasoning_gym_trains_two_steps(tmp_path: Path) -> None:
    rows = train_two_steps(
        "reasoning-gym:leg_counting",
        tmp_path / "run",
        "rollout.sampling.max_tokens=8",
        "cookbook_options.size=8",
        "cookbook_options.test_size=2",
        "cookbook_options.max_animals=3",
    )
    # The generator's own scorer ran on every episode (the tiny model never tags an answer).
    assert all(row["signal/answer_tagged"] == 0.0 for row in rows)


@pytest.mark.slow
@pytest.mark.parametrize("example", ["say", "turns"])
def test_a_verifiers_environment_trains_two_steps(example: str, tmp_path: Path) -> None:
    rows = train_two_steps(
        f"verifiers:rllm_adapter_verifiers.examples.{example}",
        tmp_path / "run",
        "rollout.sampling.max_tokens=3",
    )
    # The environment's rubric scored every episode (its metrics come back as signals).
    assert all("signal/vf/num_turns" in row for row in rows)


@pytest.mark.slow
def test_mcp_tools_train_two_steps(tmp_path: Path) -> None:
    """A tiny model whose chat template renders tools and parses hermes tool calls (as the
    finqa cookbook's test builds it); its words cover the notes server's tool schemas."""
    from rllm.engine.training.launch import task_vocabulary
    from rllm.tiny import init_tiny_model

    cookbook = adapter_cookbook("mcp:example")
    assert cookbook is not None
    schema_words = ["lookup", "crash", "key", "name", "arguments", "type", "object", "string", "properties"]
    words = [*task_vocabulary(cookbook), *schema_words]
    model = init_tiny_model(tmp_path / "tiny-tools", vocab_words=words, tool_calls=True, max_positions=4096)
    rows = train_two_steps(
        "mcp:example", tmp_path / "run", f"backend.options.model={model}", "rollout.sampling.max_tokens=8"
    )
    # A random model rarely writes a valid call: episodes end at the turn limit or on an answer,
    # each scored (its server started and stopped per rollout) and trained on.
    assert all(row.get("termination/agent_error", 0.0) == 0.0 for row in rows)
    assert all("signal/mcp/tool_calls" in row for row in rows)


@pytest.mark.slow
def test_an_openenv_environment_trains_two_steps_with_turn_credit(tmp_path: Path) -> None:
    """The example environment (guess the number) served by openenv-core's own server on loopback
    in each rollout process, its action offered as the native tool ``step`` to a tiny model whose
    chat template renders tools and parses hermes tool calls; each step's reward from the
    environment on its Step, trained with turn-level credit. A random model rarely writes a valid
    call: the environment's refusals and the reminders go back to it (scored, never infra), so
    episodes end at the turn limit or the game's."""
    from rllm.engine.training.launch import task_vocabulary
    from rllm.tiny import init_tiny_model

    cookbook = adapter_cookbook("openenv:example")
    assert cookbook is not None
    schema_words = ["step", "guess", "name", "arguments", "type", "object", "integer", "properties"]
    heard = ["guess", "the", "number", "from", "higher", "lower", "correct", "error", "call", "tool"]
    words = [*task_vocabulary(cookbook), *schema_words, *heard]
    model = init_tiny_model(tmp_path / "tiny-tools", vocab_words=words, tool_calls=True, max_positions=4096)
    rows = train_two_steps(
        "openenv:example",
        tmp_path / "run",
        f"backend.options.model={model}",
        "rollout.sampling.max_tokens=8",
        "cookbook_options.size=4",
        "cookbook_options.max_turns=3",
        "algorithm.step_credit=turn",
    )
    assert all(row.get("termination/agent_error", 0.0) == 0.0 for row in rows), rows
    assert all(row.get("termination/infra_error", 0.0) == 0.0 for row in rows), rows
    assert all("signal/openenv/turns" in row and "signal/openenv/invalid_actions" in row for row in rows)
