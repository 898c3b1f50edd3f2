"""Schema-1 records (written before the one-vocabulary rename) still decode, into the new names.

The files under ``data/`` were written by rllm-types at commit 790e6a8 (schema 1): a step's
``response_ids`` / ``logprobs``, a trace's ``logprobs``, a trajectory's ``name``, and no
``schema_version`` field (it equalled its default and was omitted).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from rllm.types import (
    SCHEMA_VERSION,
    Episode,
    SchemaError,
    Step,
    TraceRecord,
    Trajectory,
    TrajectoryGroup,
    convert,
    from_json,
    from_msgpack,
    to_json,
    to_msgpack,
)

DATA = Path(__file__).parent / "data"
OLD_KEYS = {"response_ids", "logprobs", "name"}


def _check_episode(episode: Episode) -> None:
    solver, judge = episode.trajectories
    assert (solver.role, judge.role) == ("solver", "judge")
    assert episode.trajectory("judge") is judge
    first, second = solver.steps
    assert list(first.prompt_ids or ()) == [11, 12, 13]
    assert list(first.completion_ids or ()) == [21, 22]
    assert list(first.completion_logprobs or ()) == [-0.5, -0.25]
    assert first.advantage == 0.5 and first.weight_version == 3
    assert list(second.completion_ids or ()) == [23] and list(second.advantage or ()) == [0.75]
    assert list(judge.steps[0].completion_logprobs or ()) == pytest.approx([-0.1, -0.2])


@pytest.mark.parametrize(
    ("name", "decode"),
    [
        ("schema1_episode.msgpack", lambda b: from_msgpack(b, Episode)),
        ("schema1_episodes.jsonl", lambda b: from_json(b.splitlines()[0], Episode)),
    ],
)
def test_schema1_episode_files_decode_into_the_new_names(name, decode) -> None:
    episode = decode((DATA / name).read_bytes())
    _check_episode(episode)
    # Written again, the episode carries only the new names and says which schema it is.
    doc = msgspec.json.decode(to_json(episode))
    assert doc["schema_version"] == SCHEMA_VERSION == 2
    step = doc["trajectories"][0]["steps"][0]
    assert not OLD_KEYS & set(step) and not OLD_KEYS & set(doc["trajectories"][0])
    assert step["completion_ids"] == [21, 22] and doc["trajectories"][0]["role"] == "solver"
    _check_episode(from_msgpack(to_msgpack(episode), Episode))


def test_schema1_trace_decodes_into_the_new_names() -> None:
    trace = from_msgpack((DATA / "schema1_trace.msgpack").read_bytes(), TraceRecord)
    assert trace.role == "solver" and list(trace.completion_ids or ()) == [3, 4, 5]
    assert list(trace.completion_logprobs or ()) == pytest.approx([-0.1, -0.2, -0.3])
    assert "logprobs" not in msgspec.msgpack.decode(to_msgpack(trace))


def test_schema1_lengths_are_still_checked_under_the_new_name() -> None:
    with pytest.raises(SchemaError, match="completion_logprobs"):
        convert({"response_ids": [1, 2], "logprobs": [-0.1]}, Step)


def test_schema1_trajectory_group_name_is_its_role() -> None:
    group = convert({"task_id": "t", "name": "judge", "trajectories": [{"name": "judge"}]}, TrajectoryGroup)
    assert group.role == "judge" and group.trajectories[0].role == "judge"


def test_every_record_writes_its_schema_version() -> None:
    # A schema-1 reader refuses schema_version 2 instead of dropping fields it does not know.
    for record in (Episode(task_id="t"), TraceRecord(session_id="s"), TrajectoryGroup(task_id="t")):
        assert msgspec.json.decode(to_json(record))["schema_version"] == SCHEMA_VERSION
    assert "schema_version" not in msgspec.json.decode(to_json(Trajectory()))
