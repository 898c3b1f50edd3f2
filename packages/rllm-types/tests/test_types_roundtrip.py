"""Round trips of every rllm.types Struct through msgpack and JSON (property-based)."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.types import (
    AgentConfig,
    Episode,
    ErrorInfo,
    EvalOutput,
    FloatArray,
    FunctionCall,
    ImageBlock,
    ImageURL,
    Message,
    SamplingParams,
    Signal,
    Step,
    Task,
    TerminationReason,
    TextBlock,
    TokenArray,
    ToolCall,
    TraceRecord,
    Trajectory,
    TrajectoryGroup,
    Usage,
    from_json,
    from_msgpack,
    to_json,
    to_msgpack,
)

text = st.text(max_size=12)
f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
small_float = st.floats(-1e6, 1e6, allow_nan=False)
ids = st.lists(st.integers(0, 2**31 - 1), max_size=20)
meta = st.dictionaries(st.text(max_size=5), st.one_of(st.integers(-5, 5), text, st.booleans()), max_size=3)

tool_calls = st.builds(ToolCall, id=text, function=st.builds(FunctionCall, name=text, arguments=text))
blocks = st.lists(
    st.one_of(
        st.builds(TextBlock, text=text),
        st.builds(
            ImageBlock, image_url=st.builds(ImageURL, url=st.just("data:image/png;base64,iVBORw0KGgo="))
        ),
    ),
    max_size=3,
)
messages = st.one_of(
    st.builds(
        Message, role=st.sampled_from(["system", "user", "assistant"]), content=st.one_of(text, blocks)
    ),
    st.builds(
        Message, role=st.just("assistant"), content=st.none(), tool_calls=st.lists(tool_calls, max_size=2)
    ),
    st.builds(Message, role=st.just("tool"), content=text, tool_call_id=text),
)


@st.composite
def steps(draw: st.DrawFn) -> Step:
    response = draw(ids)
    n = len(response)
    advantage = draw(st.one_of(st.none(), small_float, st.lists(f32, min_size=n, max_size=n)))
    return Step(
        input=draw(st.lists(messages, max_size=3)),
        output=draw(st.one_of(st.none(), messages)),
        prompt_ids=draw(st.one_of(st.none(), ids)),
        completion_ids=response,
        completion_logprobs=draw(st.lists(f32, min_size=n, max_size=n)),
        reward=draw(st.one_of(st.none(), small_float)),
        done=draw(st.booleans()),
        advantage=advantage,
        weight_version=draw(st.one_of(st.none(), st.integers(0, 1000))),
        finish_reason=draw(st.sampled_from([None, "stop", "length", "tool_calls"])),
        metadata=draw(meta),
        timing={"latency_s": draw(small_float)},
    )


signals = st.builds(Signal, name=text, value=small_float)
trajectories = st.builds(
    Trajectory,
    role=text,
    steps=st.lists(steps(), max_size=3),
    reward=st.one_of(st.none(), small_float),
    signals=st.lists(signals, max_size=2),
)
episodes = st.builds(
    Episode,
    task_id=text,
    rollout_index=st.integers(0, 64),
    trajectories=st.lists(trajectories, max_size=3),
    is_correct=st.one_of(st.none(), st.booleans()),
    termination_reason=st.sampled_from(list(TerminationReason)),
    error=st.one_of(st.none(), st.builds(ErrorInfo, type=text, message=text, traceback=text)),
    metrics=st.dictionaries(text, small_float, max_size=3),
    metadata=meta,
)


@st.composite
def traces(draw: st.DrawFn) -> TraceRecord:
    completion = draw(ids)
    n = len(completion)
    return TraceRecord(
        session_id=draw(text),
        role=draw(text),
        seq=draw(st.integers(0, 100)),
        messages=draw(st.lists(messages, max_size=3)),
        response=draw(st.one_of(st.none(), messages)),
        prompt_ids=draw(ids),
        completion_ids=completion,
        completion_logprobs=draw(st.lists(f32, min_size=n, max_size=n)),
        weight_version=draw(st.one_of(st.none(), st.integers(0, 10))),
        status=draw(st.sampled_from(["ok", "abort", "error"])),
        usage=draw(st.builds(Usage, prompt_tokens=st.integers(0, 99), completion_tokens=st.integers(0, 99))),
        raw_request=draw(st.one_of(st.none(), meta)),
    )


STRATEGIES = {
    "Message": (messages, Message),
    "Step": (steps(), Step),
    "Trajectory": (trajectories, Trajectory),
    "Episode": (episodes, Episode),
    "TraceRecord": (traces(), TraceRecord),
    "TrajectoryGroup": (
        st.builds(TrajectoryGroup, task_id=text, role=text, trajectories=st.lists(trajectories, max_size=2)),
        TrajectoryGroup,
    ),
    "Task": (
        st.builds(
            Task,
            id=text,
            instruction=st.one_of(text, blocks),
            ground_truth=st.one_of(text, st.integers(-(2**63), 2**63 - 1)),
        ),
        Task,
    ),
    "AgentConfig": (
        st.builds(
            AgentConfig,
            base_url=text,
            sampling=st.builds(SamplingParams, temperature=st.floats(0, 2), max_tokens=st.integers(1, 99)),
        ),
        AgentConfig,
    ),
    "EvalOutput": (
        st.builds(
            EvalOutput,
            reward=small_float,
            is_correct=st.booleans(),
            signals=st.lists(signals, max_size=2),
            trajectory_rewards=st.one_of(st.none(), st.dictionaries(text, small_float, max_size=2)),
        ),
        EvalOutput,
    ),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_round_trip_msgpack_and_json(name: str) -> None:
    strategy, tp = STRATEGIES[name]

    @settings(max_examples=60, deadline=None)
    @given(strategy)
    def check(value: object) -> None:
        assert from_msgpack(to_msgpack(value), tp) == value
        assert from_json(to_json(value), tp) == value

    check()


def test_arrays_stay_packed_end_to_end() -> None:
    step = Step(
        prompt_ids=[1, 2],
        completion_ids=[3, 4, 5],
        completion_logprobs=[-0.5, -0.25, 0.0],
        advantage=[1.0, 2.0, 3.0],
    )
    back = from_msgpack(to_msgpack(step), Step)
    assert type(back.completion_ids) is TokenArray and back.completion_ids.itemsize == 4
    assert type(back.completion_logprobs) is FloatArray and back.completion_logprobs.itemsize == 4
    assert type(back.advantage) is FloatArray
    # msgpack carries the arrays as raw bytes, not as msgpack arrays of numbers.
    raw = msgspec.msgpack.decode(to_msgpack(step))
    assert isinstance(raw["completion_ids"], bytes) and len(raw["completion_ids"]) == 12


def test_zero_copy_views() -> None:
    np = pytest.importorskip("numpy")
    ids = TokenArray(range(10))
    view = np.frombuffer(ids, dtype=np.int32)
    ids[0] = 42
    assert view[0] == 42


def test_json_shows_plain_lists_for_people() -> None:
    step = Step(completion_ids=[7, 8], completion_logprobs=[-0.5, -1.0], advantage=0.5)
    doc = msgspec.json.decode(to_json(step))
    assert doc["completion_ids"] == [7, 8]
    assert doc["completion_logprobs"] == [-0.5, -1.0]
    assert doc["advantage"] == 0.5


def test_unknown_fields_are_tolerated() -> None:
    doc = {"task_id": "t", "from_the_future": {"x": 1}, "trajectories": [{"role": "a", "new": 1}]}
    episode = from_json(msgspec.json.encode(doc), Episode)
    assert episode.trajectories[0].role == "a"
    assert from_msgpack(msgspec.msgpack.encode(doc), Episode).task_id == "t"


def test_scalar_advantage_decodes_as_float() -> None:
    back = from_json(to_json(Step(advantage=2)), Step)
    assert isinstance(back.advantage, float) and math.isclose(back.advantage, 2.0)
