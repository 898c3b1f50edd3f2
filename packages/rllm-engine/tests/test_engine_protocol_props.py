"""Property tests of the parsers of #34: the remote protocol's answer decoding (anything a
service sends is an Episode or a RemoteProtocolError, never another exception), the command
harness's placeholder filling (the task's text goes in literally, once), and the request's
agent config (any AgentConfig crosses the wire whole)."""

from __future__ import annotations

import json
import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllm.engine.rollout.agent_protocol import (
    WIRE_REQUIRED,
    RemoteConfig,
    RemoteProtocolError,
    RolloutRequest,
    decode_answer,
    decode_failure,
    encode_result,
    from_wire,
    to_wire,
)
from rllm.sdk.command import fill
from rllm.types import AgentConfig, Episode, SamplingParams, Task
from rllm.types.errors import SchemaError


def _json_like(floats: st.SearchStrategy[float]) -> st.SearchStrategy[object]:
    return st.recursive(
        st.none() | st.booleans() | st.integers() | floats | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
        max_leaves=20,
    )


# What a service may send (Python's json writes infinities too) and what JSON holds.
json_values = _json_like(st.floats(allow_nan=False))
finite_json_values = _json_like(st.floats(allow_nan=False, allow_infinity=False))
keys = st.sampled_from(
    [
        "answer",
        "artifacts",
        "metrics",
        "metadata",
        "task_id",
        "trajectories",
        "rollout_index",
        "schema_version",
        "images",
        "x",
    ]
)
answer_like = st.dictionaries(keys, json_values, max_size=4)


@given(st.binary(max_size=200))
def test_any_bytes_decode_to_an_episode_or_a_protocol_error(body: bytes) -> None:
    try:
        assert isinstance(decode_answer(body, "t"), Episode)
    except RemoteProtocolError:
        pass


@given(answer_like | json_values)
def test_any_json_decodes_to_an_episode_or_a_protocol_error(doc: object) -> None:
    try:
        episode = decode_answer(json.dumps(doc).encode(), "t")
    except RemoteProtocolError:
        return
    assert isinstance(episode, Episode)
    if isinstance(doc, dict) and isinstance(doc.get("answer"), str) and "task_id" not in doc:
        assert episode.artifacts["answer"] == doc["answer"]


@given(answer_like | json_values)
def test_any_422_body_decodes_or_is_a_protocol_error(doc: object) -> None:
    try:
        decode_failure(json.dumps(doc).encode())
    except RemoteProtocolError:
        pass


@given(
    st.one_of(
        st.none(), st.text(), st.dictionaries(st.text(max_size=8), st.text() | st.integers(), max_size=4)
    )
)
def test_what_a_flow_returns_survives_the_round_trip(result: object) -> None:
    episode = decode_answer(encode_result(result, "t"), "t")
    if isinstance(result, str):
        assert episode.artifacts == {"answer": result}
    elif isinstance(result, dict):
        assert episode.artifacts == result
    else:
        assert episode.artifacts == {}


@given(st.text(), st.text(), st.text())
def test_placeholders_insert_the_task_literally_once(template: str, instruction: str, task_id: str) -> None:
    values = {"instruction": instruction, "task_id": task_id, "workdir": "/w"}
    filled = fill(template + "{instruction}", values)
    # The instruction is appended as is, even when it holds placeholders itself.
    assert filled.endswith(instruction)
    assert fill(template.replace("{", "(").replace("}", ")"), values) == template.replace("{", "(").replace(
        "}", ")"
    )


agent_configs = st.builds(
    AgentConfig,
    base_url=st.text(max_size=30),
    model=st.text(max_size=12),
    session_id=st.text(max_size=12),
    api_key=st.text(max_size=12),
    sampling=st.builds(
        SamplingParams,
        temperature=st.none() | st.floats(0, 2),
        max_tokens=st.none() | st.integers(1, 4096),
        seed=st.none() | st.integers(0, 2**31 - 1),
    ),
    is_validation=st.booleans(),
    metadata=st.dictionaries(st.text(max_size=8), finite_json_values, max_size=3),
)


@given(agent_configs)
def test_an_agent_config_crosses_the_wire_whole(config: AgentConfig) -> None:
    """The request's ``config`` is AgentConfig's own fields (one declaration, no copy to keep in
    step): what the engine sends is what the service's flow is called with."""
    body = msgspec.json.encode(RolloutRequest(task=Task(id="t", instruction="i"), config=to_wire(config)))
    assert from_wire(msgspec.json.decode(body, type=RolloutRequest).config) == config


@given(st.sampled_from([math.inf, -math.inf, math.nan]), st.booleans())
def test_a_value_json_cannot_hold_is_refused_naming_its_key(value: float, nested: bool) -> None:
    """msgspec would send a non-finite float as ``null``: the agent would get a value it never had."""
    metadata = {"run": {"scores": [1.0, value]}} if nested else {"score": value}
    with pytest.raises(SchemaError) as caught:
        to_wire(AgentConfig(base_url="http://x/v1", metadata=metadata))
    assert caught.value.path == ("config.metadata.run.scores[1]" if nested else "config.metadata.score")


def test_the_wire_config_is_agent_config_with_the_engine_s_fields_required() -> None:
    assert set(RemoteConfig.__struct_fields__) == set(AgentConfig.__struct_fields__)
    for missing in WIRE_REQUIRED:
        doc = {"base_url": "http://g/v1", "api_key": "k", "model": "m"}
        del doc[missing]
        with pytest.raises(msgspec.ValidationError, match=f"missing required field `{missing}`"):
            msgspec.json.decode(json.dumps(doc), type=RemoteConfig)
