"""OpenEnv environments served inside the rollout's real bubblewrap sandbox (option
``sandbox``): the example environment's openenv-core server started in the sandbox, reached by the
host over a unix socket in the folder bound for it (the sandbox has no network), played by a
scripted loopback model through rLLM's engine and gateway. Its code runs in the sandbox, not on
the host; a server that never comes up is infrastructure with its stderr tail."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import rllm_adapter_openenv
from openenv_helpers import bisecting_tools
from rllm_adapter_openenv import cookbook_for, openenv_reward, openenv_sandbox_flow

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.sandbox import BubblewrapBackend, SandboxProvider
from rllm.testing import MockUpstream
from rllm.types import Episode, SamplingParams, Task, TerminationReason
from rllm.types.errors import InputError

pytestmark = [
    pytest.mark.skipif(
        shutil.which("bwrap") is None or shutil.which("prlimit") is None,
        reason="bubblewrap (bwrap) and prlimit are not installed: apt-get install bubblewrap",
    ),
    pytest.mark.timeout(400),
]

# The test's Python (its venv, the interpreter it links to) and this checkout (the workspace's
# packages are installed editable from it), bound into the sandbox read-only.
CHECKOUT = Path(rllm_adapter_openenv.__file__).resolve().parents[4]
BINDS = tuple(
    sorted({sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parents[1]), str(CHECKOUT)})
)
# Not /work (the default workdir), under which this checkout may live; room for openenv-core's
# imports (gradio) in the sandbox's limits.
SPEC = {"workdir": "/home/agent", "limits": {"cpu_s": 240, "memory_mb": 4096}}


async def run(tasks: list[Task], responder) -> list[Episode]:
    closed = [str(d) for b in BINDS for d in (Path(b), *Path(b).parents) if not d.stat().st_mode & 0o001]
    if closed:
        pytest.skip(
            f"the test's Python or checkout is not reachable by a sandbox uid: {closed[0]} is not o+x"
        )
    config = RolloutConfig(
        n=1, concurrency=2, progress=False, max_retries=0, sampling=SamplingParams(max_tokens=512)
    )
    provider = SandboxProvider(BubblewrapBackend(ro_binds=BINDS))
    async with (
        MockUpstream(responder=responder) as upstream,
        RolloutEngine(
            openenv_sandbox_flow, openenv_reward, config, upstreams=[upstream.url], sandboxes=provider
        ) as engine,
    ):
        return await engine.run(tasks)


async def test_an_episode_is_played_against_the_environment_served_in_the_sandbox() -> None:
    book = cookbook_for("example", {"test_size": 1, "sandbox": SPEC})
    assert book.flow is openenv_sandbox_flow
    (episode,) = await run(book.load_tasks("test"), bisecting_tools())
    assert episode.termination_reason == TerminationReason.DONE, episode.error
    assert episode.metrics["reward"] == 1.0 and episode.artifacts["rewards"][-1] == 1.0
    steps = episode.trajectories[0].steps
    assert steps[0].input[-1].text.startswith("guess the number")  # the sandboxed server's reset
    tool = steps[0].output.tool_calls[0] if steps[0].output is not None else None
    assert tool is not None and tool.function.name == "step"  # its schema, asked in the sandbox


async def test_a_server_that_does_not_come_up_in_the_sandbox_is_infrastructure() -> None:
    (task,) = cookbook_for(
        "rllm_adapter_openenv.no_such_module:app", {"test_size": 1, "sandbox": SPEC}
    ).load_tasks("test")
    (episode,) = await run([task], bisecting_tools())
    assert episode.termination_reason == TerminationReason.INFRA_ERROR, episode.error
    message = episode.error.message if episode.error else ""
    assert "in the sandbox exited before it was ready" in message
    assert "rllm_adapter_openenv.no_such_module" in message  # its stderr tail


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("http://127.0.0.1:9", {"sandbox": True}, "cannot be moved there"),
        ("example", {"sandbox": "yes"}, "true, false or a sandbox spec"),
        ("example", {"sandbox": {"workdir": "rel"}}, "sandbox: .*workdir"),
    ],
)
def test_a_bad_sandbox_option_is_refused_before_anything_runs(
    name: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        cookbook_for(name, options)
