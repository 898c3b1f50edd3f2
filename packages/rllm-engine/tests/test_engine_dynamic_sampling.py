"""algorithm.dynamic_sampling (rllm.engine.training.dynamic_sampling): a step never holds fewer
groups with a learning signal than tasks_per_step unless it reached its cap, and then says so;
the synchronous loop rolls out only what it is short of.

The rollouts are scripted (each task's rewards fixed by its id), the sampler, the counting and
the synchronous Trainer's own step-rollouts code are the product's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.algos.config import AlgorithmConfig, DynamicSampling
from rllm.engine.training.checkpoint import TrainerState
from rllm.engine.training.dynamic_sampling import (
    CapWatch,
    SignalCount,
    first_round,
    has_signal,
    signal_rate,
)
from rllm.engine.training.launch import load_train_config
from rllm.engine.training.seeding import step_sampling
from rllm.engine.training.trainer import Trainer
from rllm.engine.training.trainer_config import config_from_dict
from rllm.sdk.cookbook import Cookbook
from rllm.types import ConfigError, Episode, SamplingParams, Step, Task, TerminationReason, Trajectory


def _group(
    rewards: list[float], task: str = "t", reasons: list[TerminationReason] | None = None
) -> list[Episode]:
    reasons = reasons or [TerminationReason.DONE] * len(rewards)
    return [
        Episode(task_id=task, rollout_index=i, trajectories=[Trajectory(reward=r)], termination_reason=why)
        for i, (r, why) in enumerate(zip(rewards, reasons, strict=True))
    ]


def _algo(**options: Any) -> AlgorithmConfig:
    return AlgorithmConfig(filter_zero_variance=True, **options)


def test_a_group_carries_a_signal_exactly_when_the_zero_variance_filter_would_keep_it() -> None:
    assert has_signal(_group([0.0, 1.0]), _algo())
    assert not has_signal(_group([1.0, 1.0]), _algo())
    assert not has_signal(_group([0.0, 0.0]), _algo())
    # A masked failure leaves the group, and with it the difference.
    masked = _group([0.0, 1.0], reasons=[TerminationReason.AGENT_ERROR, TerminationReason.DONE])
    assert not has_signal(masked, _algo(mask_terminations=["agent_error"]))
    assert not has_signal(_group([0.0, 1.0]), _algo(min_group_size=3))
    # Under turn credit equal outcomes with different earlier turns still teach.
    turns = [
        Episode(
            task_id="t",
            rollout_index=i,
            trajectories=[Trajectory(steps=[Step(reward=r), Step()], reward=1.0)],
        )
        for i, r in enumerate((0.0, 1.0))
    ]
    assert has_signal(turns, _algo(step_credit="turn", estimator="turn"))


@settings(max_examples=200, deadline=None)
@given(
    want=st.integers(1, 6),
    cap=st.integers(0, 8),
    signals=st.lists(st.booleans(), min_size=20, max_size=20),
    round_limit=st.integers(1, 5),
)
def test_a_step_holds_the_groups_it_asked_for_unless_it_reached_its_cap(
    want: int, cap: int, signals: list[bool], round_limit: int
) -> None:
    """Whatever the groups' outcomes and however the loop takes them (a round of up to
    ``missing()`` groups, fewer when fewer finish), the step ends with ``want`` signal groups, or
    with exactly ``cap`` extra groups and ``capped`` set."""
    count = SignalCount(
        AlgorithmConfig(dynamic_sampling=DynamicSampling(enabled=True, max_extra_groups=cap)), want
    )
    outcomes = iter(signals)
    while (missing := count.missing()) > 0:
        for _ in range(min(missing, round_limit)):
            count.add(_group([0.0, 1.0] if next(outcomes) else [1.0, 1.0]))
    taken = signals[: count.groups]
    assert count.signal == sum(taken)
    assert want <= count.groups <= want + cap
    assert count.signal == want or (count.capped and count.extra == cap)
    assert count.capped == (count.signal < want)
    # It stops as soon as it can: the last group taken completed the count or the cap.
    assert count.groups == want or taken[-1] or count.extra == cap
    metrics = count.metrics()
    assert metrics["dynamic_sampling/capped"] == float(count.capped)
    assert metrics["dynamic_sampling/extra_groups"] == count.groups - want


@settings(max_examples=300, deadline=None)
@given(
    want=st.integers(1, 64),
    cap=st.integers(0, 64),
    rates=st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
)
def test_the_first_round_is_the_shortfall_the_last_rate_predicts_within_the_cap(
    want: int, cap: int, rates: tuple[float, float]
) -> None:
    """``want`` plus the fewest extra groups that, at the last step's signal rate, are expected to
    hold ``want`` signal groups; never past the cap, never below ``want``, and a lower rate
    never asks for fewer."""
    algo = AlgorithmConfig(dynamic_sampling=DynamicSampling(enabled=True, max_extra_groups=cap))
    low, high = sorted(rates)
    first = first_round(algo, want, low)
    assert want <= first <= want + cap
    assert first >= first_round(algo, want, high)
    if first < want + cap:  # not capped: enough expected, and no group more than that
        assert first * low >= want - 1e-9
        assert first == want or (first - 1) * low < want
    assert first_round(algo, want, 0.0) == want + cap
    assert first_round(algo, want, None) == want  # the first step: nothing to go by
    assert first_round(AlgorithmConfig(), want, low) == want  # off: tasks_per_step


def test_off_a_step_takes_tasks_per_step_groups_and_reports_nothing() -> None:
    count = SignalCount(AlgorithmConfig(), 3)
    count.add_batch(_group([1.0] * 6), group_size=2)
    assert count.missing() == 0 and count.metrics() == {} and not count.capped


def test_the_cap_is_warned_about_once_and_counted_at_the_end() -> None:
    watch = CapWatch(AlgorithmConfig(dynamic_sampling=DynamicSampling(enabled=True, max_extra_groups=2)), 4)
    row = {"dynamic_sampling/capped": 1.0, "dynamic_sampling/signal_groups": 1.0}
    first = watch.observe(1, row)
    assert first is not None and "\n" not in first
    assert first.startswith(
        "algorithm.dynamic_sampling: step 1 reached max_extra_groups=2 with 1 of 4 groups"
    )
    assert watch.observe(2, {**row, "dynamic_sampling/capped": 0.0}) is None
    assert watch.observe(3, row) is None  # once is enough mid-run
    assert watch.observe(4, {"reward/mean": 0.5}) is None  # a step without dynamic sampling
    assert watch.summary() == (
        "algorithm.dynamic_sampling reached max_extra_groups=2 in 2 of 3 steps short of 4 groups "
        "with a learning signal (dynamic_sampling/capped in metrics.jsonl)."
    )
    assert CapWatch(AlgorithmConfig(), 4).summary() is None


class ScriptedEngine:
    """Each task's rollouts get fixed rewards: ``t0``..: id % 3 == 0 always fails, 1 always
    passes, 2 alternates (the only groups with a signal). Records each ``run``'s batch."""

    def __init__(self) -> None:
        self.runs: list[list[str]] = []
        self.config = SimpleNamespace(sampling=SamplingParams(seed=0))
        self.seeds: list[int | None] = []  # the seed each run was asked to sample with
        self.drawings: list[list[int]] = []  # each run's drawing numbers (None: its own count)

    async def run(
        self,
        tasks: list[Task],
        n: int,
        sampling: SamplingParams | None = None,
        drawings: list[int] | None = None,
    ) -> list[Episode]:
        self.runs.append([t.id for t in tasks])
        self.seeds.append(sampling.seed if sampling is not None else None)
        self.drawings.append(list(range(len(tasks))) if drawings is None else drawings)
        out = []
        for task in tasks:
            kind = int(task.id[1:]) % 3
            out += _group(
                [0.0 if kind == 0 else 1.0 if kind == 1 else float(i % 2) for i in range(n)], task.id
            )
        return out


class NoBackend:
    name = "none"

    def validate(self, algo: AlgorithmConfig) -> None:
        pass


def _trainer(*overrides: str, ids: range | list[int] = range(9)) -> Trainer:
    cookbook = Cookbook(
        name="scripted",
        flow=None,
        evaluator=None,
        load_tasks=lambda split: [Task(id=f"t{i}", instruction="x") for i in ids],
    )
    config = config_from_dict(
        {"cookbook": "scripted", "tasks_per_step": 4, "group_size": 2, "seed": 5, **_nested(overrides)}
    )
    trainer = Trainer(config, cookbook, NoBackend())  # type: ignore[arg-type]
    trainer._prefetch = None  # as fit() sets it: nothing prefetched
    return trainer


def _nested(overrides: tuple[str, ...]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for item in overrides:
        key, value = item.split("=")
        *parents, leaf = key.split(".")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
    return doc


@pytest.mark.parametrize("curriculum", [False, True])
async def test_the_synchronous_step_rolls_out_only_what_it_is_short_of(curriculum: bool) -> None:
    trainer = _trainer(
        "algorithm.dynamic_sampling.enabled=true",
        "algorithm.dynamic_sampling.max_extra_groups=12",
        f"rollout.curriculum.enabled={str(curriculum).lower()}",
    )
    engine, state = ScriptedEngine(), TrainerState()
    tasks, cursor, episodes, prefetched, metrics = await trainer._step_rollouts(engine, state)  # type: ignore[arg-type]
    signal = [int(t[1:]) % 3 == 2 for run in engine.runs for t in run]
    assert not prefetched and [t.id for t in tasks] == [t for run in engine.runs for t in run]
    assert len(engine.runs[0]) == 4  # tasks_per_step first
    for i, run in enumerate(engine.runs[1:], start=1):  # then exactly what the count lacked
        before = signal[: sum(len(r) for r in engine.runs[:i])]
        assert len(run) == min(4 - sum(before), 12 - (len(before) - 4))
    assert metrics["dynamic_sampling/signal_groups"] == sum(signal)
    assert sum(signal) == 4 or (metrics["dynamic_sampling/capped"] == 1.0 and len(signal) == 16)
    # The extra groups are step 1's too: they sample with step 1's seed, as its first batch does.
    assert set(engine.seeds) == {step_sampling(engine.config.sampling, 1).seed}
    # ... but a task drawn again in a later round is its next drawing (its own samples, not a
    # copy of the first round's): each (task, drawing) once, numbered from 0 within the step.
    if len(engine.runs) > 1:
        drawn = [
            (t, d)
            for run, ds in zip(engine.runs[1:], engine.drawings[1:], strict=True)
            for t, d in zip(run, ds, strict=True)
        ]
        firsts = [(t, sum(u == t for u in engine.runs[0][:i])) for i, t in enumerate(engine.runs[0])]
        pairs = firsts + drawn
        assert len(set(pairs)) == len(pairs)
        assert all(d == sum(u == t for u, _ in pairs[:i]) for i, (t, d) in enumerate(pairs))
    assert len(episodes) == 2 * len(tasks)
    # The cursor moved past every draw, and the sampler recorded every group.
    assert cursor.draws == (len(tasks) if curriculum else 0)
    assert all(trainer.sampler.outcomes.recent(t.id) for t in tasks)


async def test_the_synchronous_step_oversamples_its_first_round_by_the_last_signal_rate() -> None:
    """A third of the scripted tasks carry a signal: after a step at that rate the next one
    rolls out the groups it needs in one round (12 for 4 at 1/3), not 4 and then top-ups, and
    the rate a checkpoint keeps for it is the step's own."""
    trainer = _trainer(
        "algorithm.dynamic_sampling.enabled=true", "algorithm.dynamic_sampling.max_extra_groups=12"
    )
    engine = ScriptedEngine()
    state = msgspec.json.decode(msgspec.json.encode(TrainerState(signal_rate=1 / 3)), type=TrainerState)
    tasks, _, _, _, metrics = await trainer._step_rollouts(engine, state)  # type: ignore[arg-type]
    assert len(engine.runs[0]) == 12
    signal = sum(int(t[1:]) % 3 == 2 for run in engine.runs for t in run)
    assert metrics["dynamic_sampling/signal_groups"] == signal
    assert signal >= 4 or metrics["dynamic_sampling/capped"] == 1.0  # short: topped up as before
    assert signal_rate(metrics) == signal / len(tasks)
    assert signal_rate({}) is None  # off: no rate, the next step takes tasks_per_step


async def test_the_cap_stops_a_step_that_finds_no_signal() -> None:
    # Only tasks that always fail or always pass: no group ever carries a signal.
    trainer = _trainer(
        "algorithm.dynamic_sampling.enabled=true",
        "algorithm.dynamic_sampling.max_extra_groups=3",
        ids=[i for i in range(9) if i % 3 != 2],
    )
    engine = ScriptedEngine()
    tasks, _, _, _, metrics = await trainer._step_rollouts(engine, TrainerState())  # type: ignore[arg-type]
    assert len(tasks) == 7 and metrics["dynamic_sampling/capped"] == 1.0
    assert metrics["dynamic_sampling/signal_groups"] == 0.0


def test_dynamic_sampling_is_refused_where_no_group_can_carry_a_signal() -> None:
    with pytest.raises(ConfigError) as caught:
        load_train_config(
            "say-single",
            overrides=[
                "algorithm.dynamic_sampling.enabled=true",
                "group_size=1",
                "algorithm.estimator=reinforce",
            ],
        )
    assert caught.value.key == "algorithm.dynamic_sampling.enabled" and "group_size=1" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_train_config(
            "say-single",
            overrides=["algorithm.dynamic_sampling.enabled=true", "distill.teacher=http://127.0.0.1:9/v1"],
        )
    assert caught.value.key == "algorithm.dynamic_sampling.enabled" and "distillation" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_train_config("say-single", overrides=["algorithm.dynamic_sampling.max_extra_groups=-1"])
    assert caught.value.key == "algorithm.dynamic_sampling.max_extra_groups"
