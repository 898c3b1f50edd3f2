"""Native tool calls and per-step rewards against the real openenv-core (its ``create_app``
server on loopback, its session client), played by scripted loopback models (rllm.testing's
MockUpstream, a fake of the model only) through rLLM's engine and gateway: the action's schema
offered as the ``step`` tool, each call an action and its result the next observation; a
malformed call (not JSON, an unknown field, a wrong type, no call at all) is the model's mistake,
scored and recorded; each step's reward lands on its Step. And an installed environment package
(built and installed into a temporary target here, offline) found by openenv-core's discovery."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openenv_helpers import bisecting_tools, calling, run
from rllm_adapter_openenv import cookbook_for
from rllm_adapter_openenv.environments import EnvAddress, InvalidAction, action_tool, tool_action

from rllm.algos import AlgorithmConfig, compute_advantages, group_trajectories
from rllm.testing import MockReply
from rllm.types import TerminationReason


async def test_a_tool_calling_model_plays_through_the_action_tool_and_each_step_is_rewarded() -> None:
    bodies: list[dict[str, Any]] = []
    player = bisecting_tools()

    def responder(body: dict[str, Any]) -> MockReply | str:
        bodies.append(body)
        return player(body)

    tasks = cookbook_for("example", {"test_size": 2}).load_tasks("test")
    episodes = await run(tasks, responder)
    (tool,) = bodies[0]["tools"]
    assert tool["function"]["name"] == "step"
    parameters = tool["function"]["parameters"]
    assert set(parameters["properties"]) == {"guess"} and parameters["required"] == ["guess"]
    assert parameters["properties"]["guess"]["type"] == "integer"  # the action's own JSON schema
    for episode in episodes:
        assert episode.termination_reason == TerminationReason.DONE, episode.error
        assert episode.metrics["reward"] == 1.0 and episode.metrics["signal/openenv/invalid_actions"] == 0
        steps = episode.trajectories[0].steps
        assert all(s.output is not None and s.output.tool_calls for s in steps)  # native calls
        heard = [m for m in steps[-1].input if m.role == "tool"]
        assert heard and all(m.text in ("higher", "lower") for m in heard)  # results fed back
        # each step carries the environment's reward for the action it took
        assert [s.reward for s in steps] == [0.0] * (len(steps) - 1) + [1.0]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (calling('{"guess": 3'), "step's arguments are not JSON"),
        (calling({"guess": 3, "hint": "x"}), "invalid action: no field hint (the action's fields: guess)"),
        (calling({"guess": "three"}), "invalid action: guess: Input should be a valid integer"),
        (calling({"metadata": {}}), "invalid action: no field metadata"),
        (calling([3]), "step takes a JSON object of arguments, got an array"),
        (MockReply(tool_calls=[("act", "{}")]), "no tool named 'act'; the tools are step"),
        (MockReply(text="I guess 4"), "no action: call the tool step with the action as its arguments"),
    ],
)
async def test_a_malformed_tool_call_is_the_models_failure_scored_with_its_reason(
    bad: MockReply, reason: str
) -> None:
    (task,) = cookbook_for("example", {"test_size": 1}).load_tasks("test")
    (episode,) = await run([task], bisecting_tools(bad))
    assert episode.termination_reason == TerminationReason.DONE, episode.error  # never infra
    artifacts = episode.artifacts
    assert artifacts["invalid_actions"] == 1 and reason in artifacts["errors"][0], artifacts["errors"]
    steps = episode.trajectories[0].steps
    assert steps[0].reward == 0.0 and steps[-1].reward == 1.0  # the refused turn earns nothing
    said = steps[1].input[-1]  # what the model read after its malformed turn
    assert reason in said.text and said.role == ("user" if bad.text else "tool"), said


async def test_a_model_that_only_errs_is_scored_zero_at_the_turn_limit() -> None:
    (task,) = cookbook_for("example", {"test_size": 1, "max_turns": 3}).load_tasks("test")
    (episode,) = await run([task], lambda body: calling('{"guess":'))
    assert episode.termination_reason == TerminationReason.MAX_TURNS
    assert episode.metrics["reward"] == 0.0 and episode.artifacts["invalid_actions"] == 3
    assert [s.reward for s in episode.trajectories[0].steps] == [0.0, 0.0, 0.0]


async def test_calls_after_the_environment_ended_the_episode_are_refused() -> None:
    """Five wrong guesses in one reply: the fourth ends the game (lost), the fifth finds it over."""
    (task,) = cookbook_for("example", {"test_size": 1}).load_tasks("test")
    (episode,) = await run([task], lambda body: MockReply(tool_calls=[("step", '{"guess":9}')] * 5))
    assert episode.termination_reason == TerminationReason.DONE
    steps = episode.trajectories[0].steps
    assert len(steps) == 1 and steps[0].reward == episode.metrics["reward"] == 0.0
    assert episode.artifacts["errors"] == ["the episode is over: the environment ended it"]


async def test_turn_credit_reads_the_environments_step_rewards() -> None:
    """The environment's step rewards under ``step_credit=turn``: a won game's steps are credited
    with the win (its last step's own reward), each of a lost game's turns compared with the won
    game's turn of the same index."""
    (task,) = cookbook_for("example", {"test_size": 1}).load_tasks("test")
    (won,) = await run([task], bisecting_tools())
    (lost,) = await run([task], lambda body: calling({"guess": 9}))
    lost.rollout_index = 1
    assert lost.metrics["reward"] == 0.0 and len(lost.trajectories[0].steps) == 4
    compute_advantages(
        group_trajectories([won, lost]), AlgorithmConfig(estimator="drgrpo", step_credit="turn")
    )
    last = won.trajectories[0].steps[-1]
    assert last.reward == 1.0 and last.advantage is not None and last.advantage > 0
    shared = len(won.trajectories[0].steps)  # turns both played are compared; later ones stand alone
    advantages = [s.advantage for s in lost.trajectories[0].steps]
    assert all(a is not None and a < 0 for a in advantages[:shared]) and advantages[shared:] == [0.0] * (
        4 - shared
    )


def test_the_switch_between_tool_calls_and_text_is_checked() -> None:
    (text_task,) = cookbook_for("example", {"actions": "text", "test_size": 1}).load_tasks("test")
    assert text_task.metadata["openenv"]["actions"] == "text"
    (tool_task,) = cookbook_for("example", {"test_size": "1"}).load_tasks("test")  # as the CLI passes it
    assert tool_task.metadata["openenv"]["actions"] == "tools"
    with pytest.raises(Exception, match="option actions is one of tools, text, not 'json'"):
        cookbook_for("example", {"actions": "json"})
    with pytest.raises(Exception, match="option size is a whole number, not 'many'"):
        cookbook_for("example", {"size": "many"})


async def test_a_task_naming_no_action_mode_fails_loud_naming_it() -> None:
    (task,) = cookbook_for("example", {"test_size": 1}).load_tasks("test")
    task.metadata["openenv"]["actions"] = "json"  # a task file of one's own, written by hand
    (episode,) = await run([task], bisecting_tools())
    assert episode.termination_reason != TerminationReason.DONE and episode.error is not None
    assert "openenv actions is one of tools, text, not 'json'" in episode.error.message


FIELD = st.text(alphabet=st.characters(categories=("L",), max_codepoint=0x7F), min_size=1, max_size=6)


@given(
    fields=st.sets(FIELD, min_size=1, max_size=3), arguments=st.dictionaries(FIELD, st.integers(), max_size=4)
)
def test_tool_arguments_are_the_action_when_every_field_is_the_actions(
    fields: set[str], arguments: dict[str, int]
) -> None:
    address = EnvAddress(name="e", url="u", action_fields=tuple(sorted(fields)))
    unknown = sorted(set(arguments) - fields)
    if unknown:
        with pytest.raises(InvalidAction, match=f"no field {', '.join(unknown)} "):
            tool_action(arguments, address)
    else:
        assert tool_action(arguments, address) == arguments


def test_the_action_tool_is_an_openai_function_with_the_actions_schema() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
    tool = action_tool(EnvAddress(name="e", url="u", action_fields=("x",), action_schema=schema))
    assert tool["type"] == "function" and tool["function"]["name"] == "step"
    assert tool["function"]["parameters"] == schema and "environment e" in tool["function"]["description"]


TINY_ENV = {
    "pyproject.toml": """
        [project]
        name = "openenv-tinyword"
        version = "0.1.0"
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [tool.setuptools]
        packages = ["tinyword", "tinyword.server"]
        [tool.setuptools.package-data]
        tinyword = ["openenv.yaml"]
    """,
    "tinyword/__init__.py": "",
    "tinyword/openenv.yaml": """
        spec_version: 1
        name: tinyword
        description: say the word
    """,
    "tinyword/server/__init__.py": "",
    "tinyword/server/app.py": """
        from openenv.core.env_server.http_server import create_app
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import Action, Observation, State

        class WordAction(Action):
            word: str

        class WordObservation(Observation):
            prompt: str = ""

        class WordEnvironment(Environment):
            SUPPORTS_CONCURRENT_SESSIONS = True

            def __init__(self):
                super().__init__()
                self._state = State(episode_id="tiny", step_count=0)

            def reset(self, seed=None, episode_id=None, **kwargs):
                return WordObservation(prompt="say the word: please", done=False, reward=0.0)

            def step(self, action, timeout_s=None, **kwargs):
                right = action.word == "please"
                return WordObservation(prompt="thanks" if right else "no", done=True, reward=float(right))

            @property
            def state(self):
                return self._state

        app = create_app(WordEnvironment, WordAction, WordObservation, env_name="tinyword")
    """,
}


@pytest.fixture
def installed_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """openenv-tinyword built from source here and installed into a temporary target (uv pip,
    offline, setuptools from this environment), the target put on sys.path as a site dir is."""
    source, target = tmp_path / "src", tmp_path / "site"
    for name, text in TINY_ENV.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(textwrap.dedent(text).lstrip())
    uv = shutil.which("uv")
    assert uv is not None, "the installed-package test needs uv on PATH (CI runs under uv)"
    install = [uv, "pip", "install", "--offline", "--no-index", "--no-build-isolation", "--no-deps"]
    done = subprocess.run(
        [*install, "--python", sys.executable, "--target", str(target), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not (target / "tinyword").is_symlink() and (target / "tinyword" / "openenv.yaml").is_file()
    monkeypatch.syspath_prepend(str(target))
    return "tinyword"


async def test_an_installed_environment_package_is_found_and_served(installed_env: str) -> None:
    cookbook = cookbook_for(installed_env, {"test_size": 1})
    (task,) = cookbook.load_tasks("test")
    assert task.metadata["openenv"]["address"]["app"] == "tinyword.server.app:app"

    def responder(body: dict[str, Any]) -> MockReply:
        assert body["messages"][0]["content"] == "say the word: please"
        (tool,) = body["tools"]
        assert set(tool["function"]["parameters"]["properties"]) == {"word"}
        return calling({"word": "please"})

    (episode,) = await run([task], responder)
    assert episode.termination_reason == TerminationReason.DONE, episode.error
    assert episode.metrics["reward"] == 1.0 and episode.trajectories[0].steps[0].reward == 1.0
