"""The per-group baseline of the distillation advantage (rllm.engine.data.distill.group_baseline)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.engine.data.distill import distill_advantages
from rllm.types import FloatArray, TokenArray, TrainSequence

PROMPT = 3  # prompt tokens ahead of each completion (never trained)
logprob = st.floats(min_value=-12.0, max_value=0.0, allow_nan=False)


def sequence(group: str, student: list[float]) -> TrainSequence:
    n = PROMPT + len(student)
    return TrainSequence(
        input_ids=TokenArray(list(range(n))),
        loss_mask=FloatArray([0.0] * PROMPT + [1.0] * len(student)),
        advantages=FloatArray([0.25] * n),
        sampler_logprobs=FloatArray([0.0] * PROMPT + student),
        group_id=group,
    )


def teacher_row(values: list[float]) -> list[float]:
    return [0.0] * PROMPT + values


# Groups of 2-5 rollouts with one completion length per group (a single-turn task's rollouts).
groups = st.lists(
    st.integers(min_value=1, max_value=4).flatmap(
        lambda length: st.lists(
            st.tuples(
                st.lists(logprob, min_size=length, max_size=length),
                st.lists(logprob, min_size=length, max_size=length),
            ),
            min_size=2,
            max_size=5,
        )
    ),
    min_size=1,
    max_size=4,
)


def advantages(
    data: list[list[tuple[list[float], list[float]]]], offsets: list[float], **kw: object
) -> list[list[float]]:
    seqs = [sequence(f"g{g}", student) for g, rows in enumerate(data) for student, _ in rows]
    teachers = [
        teacher_row([t + offsets[g] for t in teacher]) for g, rows in enumerate(data) for _, teacher in rows
    ]
    distill_advantages(seqs, teachers, **kw)  # type: ignore[arg-type]
    return [[float(a) for a in s.advantages] for s in seqs]


@settings(max_examples=60, deadline=None)
@given(data=groups, offsets=st.lists(st.floats(min_value=-5.0, max_value=5.0), min_size=4, max_size=4))
def test_a_constant_offset_per_group_is_removed(data: list, offsets: list[float]) -> None:
    plain = advantages(data, [0.0] * 4, baseline=True)
    shifted = advantages(data, offsets, baseline=True)
    for a, b in zip(plain, shifted, strict=True):
        # advantages are stored as float32: equal to its rounding
        assert all(abs(x - y) < 1e-4 for x, y in zip(a, b, strict=True))
    # Without the baseline the offset reaches every trained token (so the property above is the
    # baseline's doing).
    raw, raw0 = advantages(data, offsets, baseline=False), advantages(data, [0.0] * 4, baseline=False)
    owners = [g for g, rows in enumerate(data) for _ in rows]
    for g, a, b in zip(owners, raw, raw0, strict=True):
        assert all(abs((x - y) - offsets[g]) < 1e-4 for x, y in zip(a[PROMPT:], b[PROMPT:], strict=True))


@settings(max_examples=60, deadline=None)
@given(data=groups)
def test_a_teacher_equal_to_the_student_still_gives_exactly_zero(data: list) -> None:
    seqs = [sequence(f"g{g}", student) for g, rows in enumerate(data) for student, _ in rows]
    teachers = [teacher_row(list(s.sampler_logprobs[PROMPT:])) for s in seqs]
    metrics = distill_advantages(seqs, teachers, baseline=True)
    assert all(float(a) == 0.0 for s in seqs for a in s.advantages)
    assert metrics["distill/reverse_kl"] == 0.0


def test_the_baseline_is_the_other_rollouts_mean_at_the_same_position() -> None:
    # One group of three rollouts of two tokens, and a lone rollout in a second group.
    seqs = [sequence("a", [-1.0, -1.0]), sequence("a", [-1.0, -1.0]), sequence("a", [-1.0, -1.0])]
    seqs.append(sequence("b", [-1.0]))
    raw = [[-3.0, 0.0], [0.0, 0.0], [3.0, 6.0], [-2.0]]  # teacher - student per trained token
    teachers = [teacher_row([r - 1.0 for r in row]) for row in raw]
    metrics = distill_advantages(seqs, teachers, reward_coef=2.0, baseline=True)
    trained = [[float(a) for a in s.advantages[PROMPT:]] for s in seqs]
    # position 0: -3 - (0 + 3)/2 = -4.5, 0 - 0 = 0, 3 - (-1.5) = 4.5; position 1: 0 - 3, 0 - 3, 6 - 0;
    # the task advantage (0.25) times 2 on top; the lone rollout keeps its raw value (no other).
    assert trained == [[-4.0, -2.5], [0.5, -2.5], [5.0, 6.5], [-1.5]]
    assert all(float(a) == 0.0 for s in seqs for a in s.advantages[:PROMPT])
    # The reverse KL is reported before the baseline: the mean of -(teacher - student).
    assert metrics["distill/reverse_kl"] == -sum(sum(r) for r in raw) / 7
