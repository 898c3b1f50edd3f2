"""Command harnesses inside the rollout's bubblewrap sandbox (``command_flow(..., sandbox=spec)``):
real engine, real gateway, real bwrap. The harness reaches its own session through the bridge
and nothing else (not another session, not the admin API, not the gateway's port), never sees
the session's token, and its process tree dies with its timeout."""

from __future__ import annotations

import pickle
import sys
import uuid
from pathlib import Path

import pytest
from sandbox_helpers import host_processes_with, needs_bwrap

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.sandbox import BubblewrapBackend, SandboxProvider
from rllm.gateway import GatewayClient
from rllm.sdk import Task, command_flow, evaluator, final_answer
from rllm.sdk.sandbox import SandboxLimits, SandboxSpec, declares_sandbox, sandbox_spec_for
from rllm.types import TerminationReason

pytestmark = [needs_bwrap, pytest.mark.timeout(120)]

CURL_HARNESS = r"""
set -eu
body=$(printf '{"model": "%s", "messages": [{"role": "user", "content": "%s"}]}' "$OPENAI_MODEL" "$1")
curl -sSf "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" \
  -H 'Content-Type: application/json' -d "$body" > reply.json
grep -o '"content": *"[^"]*"' reply.json | head -n 1 | sed 's/^"content": *"//; s/"$//' > answer.txt
"""

# Each probe prints "name=<HTTP status or curl's 000 when nothing answered>".
ESCAPES = r"""
set -u
body='{"model": "m", "messages": [{"role": "user", "content": "What is 2+2? #x"}]}'
bridge=http://127.0.0.1:47611
probe() { name=$1; shift; printf '%s=%s\n' "$name" "$(curl -s -o /dev/null -m 10 -w '%{http_code}' "$@")"; }
probe own "$OPENAI_BASE_URL/chat/completions" -H 'Content-Type: application/json' -d "$body"
probe admin "$bridge/admin/sessions"
probe admin_post "$bridge/admin/pause" -X POST -d '{}'
probe other_by_path "$bridge/sessions/$OTHER_ID/v1/chat/completions" \
  -H "Authorization: Bearer $OTHER_TOKEN" -H 'Content-Type: application/json' -d "$body"
probe dotdot --path-as-is "$bridge/v1/../../$OTHER_ID/v1/chat/completions" -d "$body"
probe escaped "$bridge/v1/%2e%2e/%2e%2e/$OTHER_ID/v1/chat/completions" -d "$body"
probe chunked "$bridge/v1/chat/completions" -H 'Transfer-Encoding: chunked' -d "$body"
probe gateway_direct "$OTHER_URL/chat/completions" -H "Authorization: Bearer $OTHER_TOKEN" -d "$body"
printf 'key=%s\n' "$OPENAI_API_KEY"
"""


@evaluator
def contains_four(task: Task, episode) -> bool:
    return "4" in final_answer(episode)


def tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", instruction=f"What is 2+2? #{i}", ground_truth="4") for i in range(n)]


async def test_curl_harness_in_a_sandbox_is_captured_token_true(gateway):
    flow = command_flow(
        ["bash", "-c", CURL_HARNESS, "harness", "{instruction}"],
        answer_from="file:answer.txt",
        timeout_s=60,
        sandbox=SandboxSpec(),
    )
    config = RolloutConfig(n=2, concurrency=4, progress=False)
    async with RolloutEngine(flow, contains_four, config, gateway_url=gateway.url) as engine:
        episodes = await engine.run(tasks(2))
    assert len(episodes) == 4
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, (ep.error, ep.metadata)
        assert ep.artifacts["answer"] == f"The answer is 4. [{ep.task_id[1:]}]"
        assert ep.is_correct
        assert ep.metadata["command"]["sandboxed"] is True
        [step] = ep.trajectories[0].steps
        # The mock sampler's token ids are the UTF-8 bytes of its text: these are the sampler's ids.
        assert bytes(list(step.completion_ids)).decode() == ep.artifacts["answer"]


async def test_the_sandboxed_harness_reaches_its_own_session_and_nothing_else(gateway):
    client = GatewayClient(gateway.url)
    other = await client.create_session(metadata={"victim": True})
    assert other.token  # the harness is even handed the other session's URL and token
    flow = command_flow(
        ["bash", "-c", ESCAPES],
        env={"OTHER_ID": other.session_id, "OTHER_TOKEN": other.token, "OTHER_URL": other.base_url},
        timeout_s=60,
        sandbox=SandboxSpec(),
    )
    config = RolloutConfig(n=1, progress=False)
    async with RolloutEngine(flow, None, config, gateway_url=gateway.url) as engine:
        [ep] = await engine.run(tasks(1))
    assert ep.termination_reason == TerminationReason.DONE, (ep.error, ep.metadata)
    seen = dict(line.split("=", 1) for line in ep.artifacts["answer"].splitlines())
    assert seen == {
        "own": "200",  # control: the bridge works
        "admin": "403",
        "admin_post": "403",
        "other_by_path": "403",
        "dotdot": "400",
        "escaped": "403",
        "chunked": "411",
        "gateway_direct": "000",  # the host's loopback does not exist in the sandbox
        "key": "rllm-sandboxed",  # the session's token never enters the sandbox
    }
    assert await client.get_traces(other.session_id) == []
    [trajectory] = ep.trajectories  # only the control call reached its session
    assert len(trajectory.steps) == 1


async def test_a_sandboxed_harness_past_its_timeout_has_its_whole_tree_killed(gateway):
    marker = f"rllm-probe-{uuid.uuid4().hex}"
    script = f"(exec -a {marker} sleep 1000) & setsid bash -c 'exec -a {marker} sleep 1000' & exec -a {marker} sleep 1000"
    flow = command_flow(["bash", "-c", script], timeout_s=3, sandbox=SandboxSpec())
    config = RolloutConfig(n=1, progress=False)
    async with RolloutEngine(flow, None, config, gateway_url=gateway.url) as engine:
        [ep] = await engine.run(tasks(1))
    assert ep.termination_reason == TerminationReason.TIMEOUT
    assert ep.error is not None and "ran past its 3 s timeout" in ep.error.message
    assert ep.metadata["command"]["sandboxed"] is True
    assert host_processes_with(marker) == []


async def test_a_failing_sandboxed_harness_is_an_agent_error_with_its_stderr(gateway):
    flow = command_flow(["bash", "-c", "echo 'no model today' >&2; exit 3"], sandbox=SandboxSpec())
    config = RolloutConfig(n=1, progress=False)
    async with RolloutEngine(flow, None, config, gateway_url=gateway.url) as engine:
        [ep] = await engine.run(tasks(1))
    assert ep.termination_reason == TerminationReason.AGENT_ERROR
    assert ep.error is not None and "exited with status 3 in its sandbox: no model today" in ep.error.message
    assert ep.metrics["attempts"] == 1.0


PY_HARNESS = """
import os, sys
from openai import OpenAI

client = OpenAI(max_retries=0)  # OPENAI_BASE_URL / OPENAI_API_KEY: the bridge inside the sandbox
reply = client.chat.completions.create(
    model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": sys.argv[1]}]
)
print(reply.choices[0].message.content)
"""


@pytest.mark.slow  # imports the openai client (httpx, pydantic) inside each sandbox
@pytest.mark.timeout(600)
async def test_python_openai_harness_in_a_sandbox_talks_through_the_bridge(gateway):
    # The test's own Python (its venv and the interpreter it links to) bound in read-only, so the
    # sandboxed process has the openai client (httpx, keep-alive by default, through the bridge).
    binds = tuple(sorted({sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parents[1])}))
    # The sandbox runs as an unprivileged uid: it can use the bound Python only through folders
    # others may enter (a Python under a 0700 /root is refused, rightly, as SandboxUnavailable).
    closed = [str(d) for b in binds for d in (Path(b), *Path(b).parents) if not d.stat().st_mode & 0o001]
    if closed:
        pytest.skip(f"the test's Python is not reachable by a sandbox uid: {closed[0]} is not o+x")
    # (This checkout lives under /work, the default workdir, which would hide the venv's bind.)
    spec = SandboxSpec(
        files={"harness.py": PY_HARNESS}, workdir="/home/agent", limits=SandboxLimits(cpu_s=240)
    )
    flow = command_flow(
        [f"{sys.prefix}/bin/python", "harness.py", "{instruction}"], timeout_s=240, sandbox=spec
    )
    provider = SandboxProvider(BubblewrapBackend(ro_binds=binds))
    config = RolloutConfig(n=2, progress=False)
    async with RolloutEngine(
        flow, contains_four, config, gateway_url=gateway.url, sandboxes=provider
    ) as engine:
        episodes = await engine.run(tasks(1))
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, (ep.error, ep.metadata)
        assert ep.artifacts["answer"] == "The answer is 4. [0]"
        [step] = ep.trajectories[0].steps
        assert bytes(list(step.completion_ids)).decode() == ep.artifacts["answer"]


def test_a_sandboxed_command_flow_pickles_with_its_spec_and_declares_it():
    spec = SandboxSpec(workdir="/home/agent")
    again = pickle.loads(pickle.dumps(command_flow(["agent", "{instruction}"], sandbox=spec)))
    assert again.sandbox == spec and declares_sandbox(again)
    assert sandbox_spec_for(again, tasks(1)[0]) == spec
    assert not declares_sandbox(command_flow(["agent"]))
