"""The sandbox protocol's pure parts: specs, flow declarations, output truncation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllm.sdk import rollout
from rllm.sdk.sandbox import (
    TRUNCATION_MARKER,
    SandboxError,
    SandboxLimits,
    SandboxSpec,
    current_sandbox,
    declares_sandbox,
    needs_sandbox,
    sandbox_spec_for,
    truncate_output,
)
from rllm.types import InvariantError, Task


@given(st.binary(max_size=3000), st.integers(min_value=1, max_value=2000))
def test_truncation_keeps_a_prefix_and_says_how_much_was_dropped(data: bytes, limit: int) -> None:
    text, cut = truncate_output(data, limit)
    assert cut == (len(data) > limit)
    if cut:
        marker = TRUNCATION_MARKER.format(dropped=len(data) - limit)
        assert text.endswith(marker)
        assert data[:limit].decode("utf-8", "ignore") == text[: -len(marker)]
    else:
        assert text == data.decode("utf-8", "replace")


def test_spec_validation_names_the_field() -> None:
    with pytest.raises(InvariantError, match="memory_mb"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(InvariantError, match="workdir"):
        SandboxSpec(workdir="relative")
    with pytest.raises(InvariantError, match="files"):
        SandboxSpec(files={"../escape": "x"})
    assert SandboxSpec(env={"A": "1"}).key == SandboxSpec(env={"A": "1"}).key != SandboxSpec().key


def test_flows_declare_sandboxes_above_or_below_rollout() -> None:
    task = Task(id="t", instruction="x")

    @needs_sandbox(SandboxSpec(network=True))
    @rollout
    def above(task, config):
        return None

    @rollout
    @needs_sandbox(lambda t: SandboxSpec(setup=f"echo {t.id}"))
    def below(task, config):
        return None

    class Agent:
        @needs_sandbox()
        def run(self, task, config):
            return None

    from rllm.sdk import as_flow

    assert sandbox_spec_for(above, task) == SandboxSpec(network=True)
    assert sandbox_spec_for(below, task).setup == "echo t"
    assert declares_sandbox(as_flow(Agent())) and not declares_sandbox(rollout(lambda t, c: None))
    with pytest.raises(TypeError, match="SandboxSpec"):
        needs_sandbox("bwrap")
    with pytest.raises(SandboxError, match="needs_sandbox"):
        current_sandbox()
