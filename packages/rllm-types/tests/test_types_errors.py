"""Bad input: every decode error names the exact path and what was expected."""

from __future__ import annotations

import pickle

import msgspec
import pytest

from rllm.types import (
    SCHEMA_VERSION,
    Episode,
    InvariantError,
    Message,
    RLLMError,
    SamplingParams,
    SchemaError,
    Step,
    TraceRecord,
    convert,
    from_json,
    from_msgpack,
)

ENCODERS = [(from_json, msgspec.json.encode), (from_msgpack, msgspec.msgpack.encode)]


def episode_doc() -> dict:
    steps = [{"completion_ids": [1, 2], "completion_logprobs": [-0.1, -0.2]} for _ in range(5)]
    return {"task_id": "t", "trajectories": [{"role": "solver", "steps": steps}]}


@pytest.mark.parametrize(("decode", "encode"), ENCODERS)
def test_logprob_length_mismatch_names_the_step(decode, encode) -> None:
    doc = episode_doc()
    doc["trajectories"][0]["steps"][3] = {"completion_ids": [1, 2, 3], "completion_logprobs": [-0.1]}
    with pytest.raises(SchemaError) as err:
        decode(encode(doc), Episode)
    assert err.value.path == "trajectories[0].steps[3].completion_logprobs"
    assert "expected 3 logprobs" in str(err.value)
    assert "trajectories[0].steps[3].completion_logprobs" in str(err.value)


@pytest.mark.parametrize(("decode", "encode"), ENCODERS)
def test_mistyped_field_names_path_and_expectation(decode, encode) -> None:
    doc = episode_doc()
    doc["trajectories"][0]["steps"][1]["reward"] = "high"
    with pytest.raises(SchemaError) as err:
        decode(encode(doc), Episode)
    assert err.value.path == "trajectories[0].steps[1].reward"
    assert "Expected `float | null`" in str(err.value)


@pytest.mark.parametrize(("decode", "encode"), ENCODERS)
def test_missing_required_field(decode, encode) -> None:
    with pytest.raises(SchemaError) as err:
        decode(encode({"trajectories": []}), Episode)
    assert err.value.path == "task_id"
    assert "missing required field" in str(err.value)


def test_bad_packed_bytes() -> None:
    doc = {"task_id": "t", "trajectories": [{"steps": [{"completion_ids": b"\x01\x02\x03"}]}]}
    with pytest.raises(SchemaError) as err:
        from_msgpack(msgspec.msgpack.encode(doc), Episode)
    assert err.value.path == "trajectories[0].steps[0].completion_ids"


def test_wrong_array_type() -> None:
    doc = {"task_id": "t", "trajectories": [{"steps": [{"completion_logprobs": "nope"}]}]}
    with pytest.raises(SchemaError) as err:
        from_json(msgspec.json.encode(doc), Episode)
    assert err.value.path == "trajectories[0].steps[0].completion_logprobs"


def test_bad_termination_reason() -> None:
    with pytest.raises(SchemaError) as err:
        from_json(b'{"task_id": "t", "termination_reason": "bored"}', Episode)
    assert err.value.path == "termination_reason"


def test_malformed_bytes() -> None:
    with pytest.raises(SchemaError, match="malformed"):
        from_json(b'{"task_id": ', Episode)
    with pytest.raises(SchemaError, match="malformed"):
        from_msgpack(b"\xc1", Episode)


def test_newer_schema_version_refused() -> None:
    doc = {"session_id": "s", "schema_version": SCHEMA_VERSION + 1}
    with pytest.raises(SchemaError) as err:
        from_json(msgspec.json.encode(doc), TraceRecord)
    assert err.value.path == "schema_version"


def test_per_token_advantage_length_checked() -> None:
    with pytest.raises(SchemaError) as err:
        convert({"completion_ids": [1, 2], "advantage": [1.0]}, Step)
    assert err.value.path == "advantage"


def test_construction_checks_invariants() -> None:
    with pytest.raises(SchemaError, match="logprobs"):
        Step(completion_ids=[1, 2], completion_logprobs=[0.0])
    with pytest.raises(SchemaError, match="top_p"):
        SamplingParams(top_p=1.5)
    with pytest.raises(SchemaError, match="tool_call_id"):
        convert({"role": "tool", "content": "x"}, Message)


@pytest.mark.parametrize("error", [SchemaError("bad", "a.b"), SchemaError("bad"), InvariantError("bad", "f")])
def test_schema_errors_pickle_with_their_path(error: SchemaError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.path, copy.reason) == (type(error), str(error), error.path, "bad")
    assert isinstance(copy, RLLMError) and isinstance(copy, ValueError)
