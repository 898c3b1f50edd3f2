"""TrainSequences → DataProto against hand-computed rows (padding, masks, position ids)."""

from __future__ import annotations

import pytest

# Named on its own in the workspace env (no verl there), the file skips; nox -s verl runs it.
pytest.importorskip("verl")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl import DataProto
from verl_helpers import sequence

from rllm.backends.verl.convert import BatchConversionError, record_trainer_logprobs, to_data_proto
from rllm.engine.training.sequences import sequences_from_trajectory
from rllm.types import FloatArray, Step, TokenArray, Trajectory

pytestmark = pytest.mark.verl
PAD = 0


def test_single_turn_rows_are_left_padded_prompts_and_right_padded_responses() -> None:
    batch = [
        sequence([5, 6, 7, 8], [0, 0, 1, 1], 1.0, "t1/a", logprob=-0.5),
        sequence([9, 10, 11], [0, 1, 1], -2.0, "t1/a", logprob=-0.25),
        sequence([3, 4, 5, 6, 7, 8], [0, 0, 0, 1, 1, 1], 0.5, "t2/a"),
    ]
    data = to_data_proto(batch, pad_token_id=PAD)
    assert isinstance(data, DataProto) and len(data) == 3
    b = {key: value.tolist() for key, value in data.batch.items()}
    # prompt width 3 (third row), response width 3 (third row)
    assert b["prompts"] == [[0, 5, 6], [0, 0, 9], [3, 4, 5]]
    assert b["responses"] == [[7, 8, 0], [10, 11, 0], [6, 7, 8]]
    assert b["input_ids"] == [[0, 5, 6, 7, 8, 0], [0, 0, 9, 10, 11, 0], [3, 4, 5, 6, 7, 8]]
    assert b["attention_mask"] == [[0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert b["position_ids"] == [[0, 0, 1, 2, 3, 0], [0, 0, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]
    assert b["response_mask"] == [[1, 1, 0], [1, 1, 0], [1, 1, 1]]
    assert b["advantages"] == [[1.0, 1.0, 0.0], [-2.0, -2.0, 0.0], [0.5, 0.5, 0.5]]
    assert b["rollout_log_probs"] == [[-0.5, -0.5, 0.0], [-0.25, -0.25, 0.0], [-1.0, -1.0, -1.0]]
    assert data.non_tensor_batch["uid"].tolist() == ["t1/a", "t1/a", "t2/a"]


def _step(prompt: list[int], response: list[int], advantage: float) -> Step:
    return Step(
        prompt_ids=TokenArray(prompt),
        completion_ids=TokenArray(response),
        completion_logprobs=FloatArray([-0.1] * len(response)),
        advantage=advantage,
    )


def test_multi_turn_segments_mask_observations_inside_the_response() -> None:
    # turn 1: prompt [1 2], reply [3 4]; the tool output [5 6] comes back; turn 2 replies [7].
    # A third call whose prompt does not extend the history starts a new segment.
    trajectory = Trajectory(
        role="solver",
        steps=[_step([1, 2], [3, 4], 1.0), _step([1, 2, 3, 4, 5, 6], [7], 1.0), _step([8], [9], 1.0)],
    )
    segments = sequences_from_trajectory(trajectory, "task/solver")
    assert len(segments) == 2
    data = to_data_proto(segments, pad_token_id=PAD)
    b = {key: value.tolist() for key, value in data.batch.items()}
    assert b["prompts"] == [[1, 2], [0, 8]]
    assert b["responses"] == [[3, 4, 5, 6, 7], [9, 0, 0, 0, 0]]
    assert b["response_mask"] == [[1, 1, 0, 0, 1], [1, 0, 0, 0, 0]]
    assert b["attention_mask"] == [[1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0, 0]]
    assert b["position_ids"] == [[0, 1, 2, 3, 4, 5, 6], [0, 0, 1, 0, 0, 0, 0]]
    assert b["advantages"][0] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert data.non_tensor_batch["role"].tolist() == ["solver", "solver"]


def test_several_roles_of_one_episode_keep_their_group_and_role() -> None:
    batch = [
        sequence([1, 2, 3], [0, 1, 1], 1.0, "task/solver", role="solver", trajectory_id="s"),
        sequence([4, 5, 6, 7], [0, 0, 1, 1], -1.0, "task/judge", role="judge", trajectory_id="j"),
    ]
    data = to_data_proto(batch, pad_token_id=PAD)
    assert data.non_tensor_batch["uid"].tolist() == ["task/solver", "task/judge"]
    assert data.non_tensor_batch["role"].tolist() == ["solver", "judge"]
    assert data.non_tensor_batch["trajectory_id"].tolist() == ["s", "j"]


@pytest.mark.parametrize(
    ("seq", "message"),
    [
        (sequence([1], [0], 1.0), "at least 2 tokens"),
        (sequence([1, 2], [1, 1], 1.0), "first token is trained"),
    ],
)
def test_bad_sequences_are_refused_naming_the_sequence(seq, message: str) -> None:
    with pytest.raises(BatchConversionError, match=message):
        to_data_proto([sequence([1, 2], [0, 1], 1.0), seq], pad_token_id=PAD)


def test_a_sequence_without_sampled_tokens_still_forms_a_masked_row() -> None:
    data = to_data_proto([sequence([1, 2, 3], [0, 0, 0], 0.0)], pad_token_id=PAD)
    assert data.batch["prompts"].tolist() == [[1, 2]]
    assert data.batch["response_mask"].tolist() == [[0]]


@st.composite
def train_sequences(draw):
    """Sequences as the engine builds them: context, then sampled spans with observations between."""
    n = draw(st.integers(1, 6))
    out = []
    for index in range(n):
        prompt = draw(st.integers(1, 5))
        spans = draw(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3)), min_size=0, max_size=3))
        mask = [0] * prompt
        for sampled, observed in spans:
            mask += [1] * sampled + [0] * observed
        if len(mask) < 2:
            mask.append(0)
        tokens = draw(st.lists(st.integers(1, 999), min_size=len(mask), max_size=len(mask)))
        out.append(sequence(tokens, mask, draw(st.sampled_from([-1.0, 0.5, 2.0])), f"g{index % 2}"))
    return out


@settings(max_examples=80, deadline=None)
@given(train_sequences())
def test_rows_give_back_every_sequence_token_for_token(batch) -> None:
    data = to_data_proto(batch, pad_token_id=PAD)
    width = data.batch["prompts"].shape[1]
    for row, seq in enumerate(batch):
        attention = data.batch["attention_mask"][row].bool()
        assert data.batch["input_ids"][row][attention].tolist() == list(seq.input_ids)
        assert data.batch["position_ids"][row][attention].tolist() == list(range(len(seq.input_ids)))
        assert data.batch["position_ids"][row][~attention].eq(0).all()
        start = int((~attention[:width]).sum())  # left padding of the prompt
        split = width - start
        response = slice(0, len(seq.input_ids) - split)
        assert data.batch["response_mask"][row][response].tolist() == [int(m) for m in seq.loss_mask[split:]]
        assert data.batch["response_mask"][row][len(seq.input_ids) - split :].eq(0).all()
        assert data.batch["advantages"][row][response].tolist() == list(seq.advantages[split:])
        assert data.batch["rollout_log_probs"][row][response].tolist() == list(seq.sampler_logprobs[split:])
        # no sampled token is lost to the prompt side
        assert sum(seq.loss_mask[:split]) == 0


@settings(max_examples=80, deadline=None)
@given(train_sequences())
def test_trainer_logprobs_come_back_to_the_tokens_their_rows_came_from(batch) -> None:
    data = to_data_proto(batch, pad_token_id=PAD)
    width = data.batch["prompts"].shape[1]
    # Each response column holds -(1000 * row + the input position it stands for): a value that
    # lands on another token, row or a masked position is seen.
    splits = [
        width - int((~data.batch["attention_mask"][row][:width].bool()).sum()) for row in range(len(batch))
    ]
    columns = torch.arange(data.batch["responses"].shape[1], dtype=torch.float32)
    log_probs = torch.stack([-(1000.0 * row + split + columns) for row, split in enumerate(splits)])
    record_trainer_logprobs(batch, log_probs)
    for row, seq in enumerate(batch):
        expected = [-(1000.0 * row + i) if m else 0.0 for i, m in enumerate(seq.loss_mask)]
        assert seq.trainer_logprobs is not None and list(seq.trainer_logprobs) == expected


def test_trainer_logprobs_of_another_batch_are_refused() -> None:
    batch = [sequence([1, 2, 3], [0, 1, 1], 1.0), sequence([4, 5], [0, 1], 1.0)]
    with pytest.raises(BatchConversionError, match=r"shape \(1, 2\) do not match a batch of 2"):
        record_trainer_logprobs(batch, torch.zeros((1, 2)))
    with pytest.raises(
        BatchConversionError, match=r"sequence 0 .* 2 response tokens, but the log-probs have 1"
    ):
        record_trainer_logprobs(batch, torch.zeros((2, 1)))
