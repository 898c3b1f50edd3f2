"""Turn scored trajectories into TrainSequences: the token-level batch a backend trains on.

Token truth: sequences are built from the sampler's own token ids, never from text. Consecutive
steps of a trajectory are merged into one sequence when step k+1's prompt starts with exactly
step k's prompt + response tokens (the gateway's cumulative mode guarantees this for chat
histories that extend); the tokens in between (tool output, the next user turn) are context
with loss mask 0. When a prompt does not extend the running sequence, a new sequence starts.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

from rllm.types import FloatArray, ImageBlock, Step, TokenArray, TrainSequence, Trajectory, TrajectoryGroup
from rllm.types.errors import InputError, RLLMError
from rllm.types.images import IMAGE_REF_PREFIX


class MissingTokensError(RLLMError, ValueError):
    """A step has no token ids: training needs a sampler that returns them (not a hosted API)."""


def sequences_from_groups(groups: Iterable[TrajectoryGroup]) -> list[TrainSequence]:
    """All TrainSequences of all trajectories in ``groups``, in order."""
    out: list[TrainSequence] = []
    for group in groups:
        group_id = f"{group.task_id}/{group.role}"
        for index, trajectory in enumerate(group.trajectories):
            where = f"group {group_id}, trajectory {index} ({trajectory.id})"
            out.extend(sequences_from_trajectory(trajectory, group_id, where))
    return out


def signal_sequences(sequences: Sequence[TrainSequence]) -> int:
    """How many of ``sequences`` have a nonzero advantage at a trained token: the ones the
    update can learn from (a zero-variance group's rollouts under GRPO have none)."""
    return sum(
        any(m != 0 and a != 0 for m, a in zip(seq.loss_mask[1:], seq.advantages[1:], strict=True))
        for seq in sequences
    )


def sequences_from_trajectory(
    trajectory: Trajectory, group_id: str = "", where: str = ""
) -> list[TrainSequence]:
    """Merge the trajectory's steps into as few sequences as token-level prefixes allow."""
    sequences: list[TrainSequence] = []
    current: TrainSequence | None = None
    for number, step in enumerate(trajectory.steps):
        prompt, response = _token_ids(step, f"{where or trajectory.id}, step {number}")
        extends = (
            current is not None
            and len(prompt) >= len(current.input_ids)
            and prompt[: len(current.input_ids)] == current.input_ids
        )
        if not extends:
            current = TrainSequence(
                input_ids=TokenArray(),
                loss_mask=FloatArray(),
                advantages=FloatArray(),
                sampler_logprobs=FloatArray(),
                group_id=group_id,
                # step_spans: [step index, start, end) of each step's completion in input_ids,
                # so per-token results (trainer logprobs) map back onto the steps.
                metadata={"trajectory_id": trajectory.id, "role": trajectory.role, "step_spans": []},
            )
            sequences.append(current)
        assert current is not None
        _append_context(current, prompt[len(current.input_ids) :])
        start = len(current.input_ids)
        _append_response(current, step, response, f"{where or trajectory.id}, step {number}")
        current.metadata["step_spans"].append([number, start, len(current.input_ids)])
        # A step's input is the whole history, so its images are those of the sequence so far.
        current.images = step_images(step)
    return sequences


def step_images(step: Step) -> list[str]:
    """The data URIs of the images in ``step.input``, in order (references resolved through
    ``step.images``)."""
    out: list[str] = []
    for msg in step.input:
        if isinstance(msg.content, list):
            for block in msg.content:
                if isinstance(block, ImageBlock):
                    url = block.image_url.url
                    if url.startswith(IMAGE_REF_PREFIX):
                        url = step.images.get(url[len(IMAGE_REF_PREFIX) :], url)
                    out.append(url)
    return out


def _token_ids(step: Step, where: str) -> tuple[TokenArray, TokenArray]:
    if step.prompt_ids is None or step.completion_ids is None:
        raise MissingTokensError(
            f"{where}: step has no prompt/response token ids; training needs a sampler that returns "
            "token ids (vLLM, SGLang, the local tinker sampler), not a hosted API"
        )
    return step.prompt_ids, step.completion_ids


def _append_context(seq: TrainSequence, tokens: array[int]) -> None:
    n = len(tokens)
    seq.input_ids.extend(tokens)
    zeros = FloatArray(bytes(4 * n))  # float32 zero is all-zero bytes
    seq.loss_mask.extend(zeros)
    seq.advantages.extend(zeros)
    seq.sampler_logprobs.extend(zeros)


def _append_response(seq: TrainSequence, step: Step, response: TokenArray, where: str) -> None:
    n = len(response)
    seq.input_ids.extend(response)
    seq.loss_mask.extend(FloatArray([1.0]) * n)
    advantage = step.advantage
    if advantage is None:
        raise InputError(f"{where}: step has no advantage; compute advantages before building sequences")
    if isinstance(advantage, float | int):
        seq.advantages.extend(FloatArray([float(advantage)]) * n)
    else:
        seq.advantages.extend(advantage)
    if step.completion_logprobs is None:
        raise MissingTokensError(f"{where}: step has no sampler logprobs")
    seq.sampler_logprobs.extend(step.completion_logprobs)
