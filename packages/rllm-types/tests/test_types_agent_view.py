"""The agent's view of a task (``rllm.types.agent_view``): the one place deciding what an agent may
see. Never the ground truth, a task directory's tests / solution / sandbox spec, nor a metadata key
the dataset marks grader-only; everything else, unchanged."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllm.types import (
    GRADER_ONLY_KEY,
    GRADER_ONLY_METADATA,
    InvariantError,
    Task,
    agent_view,
    convert,
    from_json,
    grader_only_keys,
    to_json,
)


def test_the_view_drops_the_grader_parts_and_keeps_the_inputs() -> None:
    task = Task(
        id="t",
        instruction="walk to the goal",
        ground_truth="RIGHT RIGHT DOWN",
        metadata={
            "map": ["SFFF", "FHFH"],  # an input: the agent needs it
            "tests": {"test.sh": "exit 0"},
            "solution": "echo solved",
            "sandbox": {"setup": "echo the-answer > /root/x"},
            "reference": "print(42)",
            "grader_only": ["reference"],
        },
    )
    view = agent_view(task)
    assert view.id == "t" and view.instruction == "walk to the goal"
    assert view.ground_truth is None
    assert view.metadata == {"map": ["SFFF", "FHFH"]}
    # The full task is untouched (the evaluator gets it).
    assert task.ground_truth == "RIGHT RIGHT DOWN" and set(task.metadata) >= {"tests", "reference"}
    # On the wire (RLLM_TASK, the remote protocol) no trace of the grader's part either.
    wire = to_json(view)
    for secret in (
        b"RIGHT RIGHT DOWN",
        b"exit 0",
        b"echo solved",
        b"the-answer",
        b"print(42)",
        b"grader_only",
    ):
        assert secret not in wire


def test_a_task_that_hides_nothing_is_its_own_view() -> None:
    task = Task(id="t", instruction="hi", metadata={"words": ["a"]})
    assert agent_view(task) is task


@pytest.mark.parametrize("marked", ["reference", ["reference", 3], {"reference": True}])
def test_a_malformed_grader_only_list_is_refused_when_the_task_is_made(marked: object) -> None:
    with pytest.raises(InvariantError, match="grader_only"):
        Task(id="t", instruction="hi", metadata={GRADER_ONLY_KEY: marked})
    with pytest.raises(Exception, match="grader_only"):  # from a dataset row too (convert/decode)
        convert({"id": "t", "instruction": "hi", "metadata": {GRADER_ONLY_KEY: marked}}, Task)


_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_values = st.one_of(st.none(), st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=3))


@given(
    metadata=st.dictionaries(
        st.one_of(_keys, st.sampled_from(sorted(GRADER_ONLY_METADATA))), _values, max_size=8
    ),
    marked=st.lists(_keys, max_size=4),
    truth=_values,
)
def test_the_view_is_the_task_minus_exactly_the_grader_keys(
    metadata: dict[str, object], marked: list[str], truth: object
) -> None:
    metadata = {k: v for k, v in metadata.items() if k != GRADER_ONLY_KEY}
    task = Task(id="t", instruction="x", ground_truth=truth, metadata={**metadata, GRADER_ONLY_KEY: marked})
    hidden = GRADER_ONLY_METADATA | {GRADER_ONLY_KEY, *marked}
    view = agent_view(task)
    assert grader_only_keys(task) == hidden
    assert view.ground_truth is None
    assert view.metadata == {k: v for k, v in metadata.items() if k not in hidden}
    assert agent_view(view) == view  # idempotent: every boundary may take the view again
    assert from_json(to_json(view), Task) == view
    assert msgspec.structs.asdict(task)["metadata"][GRADER_ONLY_KEY] == marked  # the task is untouched
