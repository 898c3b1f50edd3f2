"""Episode assembly from traces: roles by name, order by seq, segments, flow return values."""

from __future__ import annotations

import pytest

from rllm.engine.rollout.episode_builder import build_episode, trajectories_from_traces
from rllm.sdk.errors import FlowReturnError
from rllm.types import Episode, Message, Step, TerminationReason, TraceRecord, Trajectory, Usage


def trace(
    seq: int, role: str = "default", segment: int = 0, status: str = "ok", text: str = "a"
) -> TraceRecord:
    ids = list(text.encode())
    return TraceRecord(
        session_id="s",
        role=role,
        seq=seq,
        messages=[Message(role="user", content=f"q{seq}")],
        response=Message(role="assistant", content=text) if status == "ok" else None,
        prompt_ids=[1, 2, seq],
        completion_ids=ids if status == "ok" else None,
        completion_logprobs=[-0.5] * len(ids) if status == "ok" else None,
        weight_version=3,
        segment=segment,
        status=status,
        usage=Usage(prompt_tokens=3, completion_tokens=len(ids)),
    )


def test_traces_group_by_role_and_order_by_seq_not_arrival():
    traces = [trace(2, "judge", text="j"), trace(1, text="second"), trace(0, text="first")]
    trajs = trajectories_from_traces(traces)
    assert list(trajs) == ["default", "judge"]  # order of each role's first call
    main = trajs["default"]
    assert [s.output.text for s in main.steps] == ["first", "second"]
    assert [list(s.prompt_ids) for s in main.steps] == [[1, 2, 0], [1, 2, 1]]
    assert list(main.steps[1].completion_ids) == list(b"second")
    assert main.steps[1].weight_version == 3 and main.steps[1].done and not main.steps[0].done


def test_segments_are_counted_and_kept_per_step():
    trajs = trajectories_from_traces([trace(0, segment=0), trace(1, segment=0), trace(2, segment=1)])
    main = trajs["default"]
    assert main.metadata["segments"] == 2
    assert [s.metadata["segment"] for s in main.steps] == [0, 0, 1]


def test_failed_and_aborted_calls_are_dropped_from_steps_but_counted():
    trajs = trajectories_from_traces([trace(0), trace(1, status="error"), trace(2, status="abort")])
    assert len(trajs["default"].steps) == 1
    assert trajs["default"].metadata["dropped_traces"] == 2


def test_flow_trajectory_is_matched_by_name_and_keeps_its_reward():
    returned = Episode(
        task_id="ignored",
        rollout_index=9,
        trajectories=[Trajectory(role="judge", reward=0.3, metadata={"k": 1}), Trajectory(role="offline")],
        artifacts={"answer": "x"},
        termination_reason=TerminationReason.MAX_TURNS,
    )
    ep = build_episode("t1", 2, returned, [trace(0, "solver"), trace(1, "judge", text="VERDICT")])
    assert (ep.task_id, ep.rollout_index) == ("t1", 2)
    assert [t.role for t in ep.trajectories] == ["judge", "offline", "solver"]
    judge = ep.trajectory("judge")
    assert judge.reward == 0.3 and judge.metadata["k"] == 1 and judge.steps[0].output.text == "VERDICT"
    assert ep.termination_reason == TerminationReason.MAX_TURNS and ep.artifacts == {"answer": "x"}
    assert ep.metrics["llm_calls"] == 2 and ep.metrics["completion_tokens"] == 1 + len("VERDICT")


def test_flow_built_steps_survive_only_where_no_traces_exist():
    own = Trajectory(role="default", steps=[Step(completion_ids=[5], completion_logprobs=[-1.0])])
    assert build_episode("t", 0, own, []).trajectories[0].steps[0].completion_ids.tolist() == [5]
    merged = build_episode("t", 0, own, [trace(0)]).trajectories[0]
    assert merged.steps[0].completion_ids.tolist() == list(b"a")
    assert merged.metadata["flow_steps_replaced"] == 1


@pytest.mark.parametrize(
    ("result", "artifacts"), [(None, {}), ({"a": 1}, {"a": 1}), ("42", {"answer": "42"})]
)
def test_simple_return_values_become_artifacts(result, artifacts):
    ep = build_episode("t", 0, result, [trace(0)])
    assert ep.artifacts == artifacts and len(ep.trajectories) == 1


def test_unsupported_return_value_is_a_clear_error():
    with pytest.raises(FlowReturnError, match="got int"):
        build_episode("t", 0, 7, [])


def test_steps_keep_their_traces_images_by_content_address():
    from rllm.types import from_msgpack, to_msgpack
    from rllm.types.images import intern_images, restore_images

    url = "data:image/png;base64,iVBORw0KGgo="  # interning needs decodable bytes, not a valid PNG
    from rllm.types import convert

    sent = convert(
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}], list[Message]
    )
    t = trace(0)
    t.messages, t.images = intern_images(sent)
    (traj,) = trajectories_from_traces([t]).values()
    step = traj.steps[0]
    assert step.images == t.images and len(step.images) == 1
    episode = from_msgpack(to_msgpack(Episode(task_id="x", trajectories=[traj])), Episode)
    kept = episode.trajectories[0].steps[0]
    assert restore_images(kept.input, kept.images) == sent


def test_an_image_decoded_from_several_traces_is_one_string_in_the_episode():
    """Traces arrive decoded one by one (each with its own copy of a resent image); the steps of
    the episode share one string per image, and storing the episode keeps it once."""
    from rllm.types import from_msgpack, to_msgpack
    from rllm.types.images import pack_episode_images

    url = "data:image/png;base64,iVBORw0KGgo="
    traces = []
    for seq, role in ((0, "solver"), (1, "solver"), (2, "judge")):
        t = trace(seq, role=role)
        t.images = {"ab" * 32: url}
        traces.append(from_msgpack(to_msgpack(t), TraceRecord))  # as the gateway client returns them
    episode = build_episode("t", 0, None, traces)
    values = [s.images["ab" * 32] for t in episode.trajectories for s in t.steps]
    assert len(values) == 3 and all(v is values[0] for v in values)
    assert to_msgpack(pack_episode_images(episode)).count(b"iVBORw0KGgo=") == 1
