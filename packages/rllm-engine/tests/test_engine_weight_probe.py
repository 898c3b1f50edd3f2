"""When the weight probe re-scores its probe set (rllm.engine.training.weight_probe.ProbeSchedule)
and what that leaves ``weights_stale`` able to promise: the interval rule, the first updates always
probed, and the detection bound ``s + 2k - 1`` for a weight sync that stops working at update ``s``
with the interval at ``k``. Timings are given as numbers: nothing here is timed.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.engine.training.health import HealthMonitor
from rllm.engine.training.health_checks import STALE_UPDATES
from rllm.engine.training.health_config import HealthSection
from rllm.engine.training.weight_probe import PROBE_BUDGET, ProbeSchedule, probe_interval

TRAINED = {"train/sequences": 64, "train/signal_sequences": 20, "train/lr": 5e-4, "train/grad_norm": 0.3}


@pytest.mark.parametrize(
    ("probe_s", "step_s", "interval"),
    [
        (0.020, 2.0, 1),  # 1% of a step: every update
        (0.040, 2.0, 1),  # exactly the budget
        (0.041, 2.0, 2),  # just over it
        (0.020, 0.176, 6),  # whole_system.py's config: 11% of a step -> every 6th update
        (0.035, 0.047, 8),  # 74% of a step: capped at the most allowed
        (0.0, 0.1, 1),
        (0.02, 0.0, 8),  # no step time measured as anything: as seldom as allowed
    ],
)
def test_the_interval_keeps_the_probe_within_its_budget_of_a_step(
    probe_s: float, step_s: float, interval: int
) -> None:
    assert probe_interval(probe_s, step_s, max_interval=8) == interval


@given(
    probe_s=st.floats(1e-4, 10.0),
    step_s=st.floats(1e-3, 100.0),
    max_interval=st.integers(1, 50),
)
def test_the_interval_is_the_least_within_budget_up_to_the_cap(
    probe_s: float, step_s: float, max_interval: int
) -> None:
    k = probe_interval(probe_s, step_s, max_interval)
    assert 1 <= k <= max_interval
    if k < max_interval:  # within budget, and one fewer would not be
        assert probe_s / (k * step_s) <= PROBE_BUDGET * (1 + 1e-9)
        assert k == 1 or probe_s / ((k - 1) * step_s) > PROBE_BUDGET * (1 - 1e-9)


def probed_updates(schedule: ProbeSchedule, updates: int) -> list[int]:
    return [u for u in range(1, updates + 1) if schedule.after_update()]


def test_the_first_updates_are_probed_whatever_the_timings_then_every_interval() -> None:
    schedule = ProbeSchedule(max_interval=8)
    for _ in range(4):  # a probe costing 10% of a step: every 5th update once warmed up
        schedule.step_took(0.2)
        schedule.probe_took(0.02)
    assert schedule.interval == 5
    assert probed_updates(schedule, 17) == [1, 2, 7, 12, 17]
    # Cheap again (the medians move): every update.
    for _ in range(8):
        schedule.probe_took(0.001)
    assert schedule.interval == 1 and probed_updates(schedule, 3) == [1, 2, 3]


def test_without_timings_every_update_is_probed() -> None:
    schedule = ProbeSchedule(max_interval=8)
    assert schedule.interval == 1 and probed_updates(schedule, 5) == [1, 2, 3, 4, 5]
    assert probed_updates(ProbeSchedule(max_interval=1), 1) == [1]


def simulate(updates: int, stops_at: int | None, interval: int, max_interval: int) -> dict[str, Any]:
    """A run whose every update moves the weights and whose weight sync stops loading them from
    update ``stops_at`` on; the probe set is re-scored as a ProbeSchedule whose timings give
    ``interval`` says. Returns the monitor's firings and the probed steps."""
    section = HealthSection(probe_max_interval=max_interval)
    schedule = ProbeSchedule(max_interval)
    # Step and probe times (numbers, not measured) that make the rule give ``interval``.
    schedule.step_took(1.0)
    schedule.probe_took(PROBE_BUDGET * interval)
    assert schedule.interval == interval
    monitor = HealthMonitor(section)
    served = scored = 0  # the weight version the sampler serves, and at the last scoring
    probed = []
    for step in range(1, updates + 1):
        if stops_at is None or step < stops_at:
            served = step
        row: dict[str, Any] = {"reward/mean": 0.3, **TRAINED}
        if schedule.after_update():
            row["probe/logprob_change"] = 0.0 if served == scored else 0.05
            scored = served
            probed.append(step)
        monitor.observe(step, row)
    return {"fired": {n: f.first_step for n, f in monitor.fired.items()}, "probed": probed}


@settings(max_examples=200, deadline=None)
@given(
    max_interval=st.integers(1, 12),
    interval_share=st.floats(0.0, 1.0),
    stops_at=st.integers(1, 40),
)
def test_a_sync_that_stops_working_is_named_within_2k_updates(
    max_interval: int, interval_share: float, stops_at: int
) -> None:
    interval = max(1, round(interval_share * max_interval))
    updates = stops_at + 2 * max_interval + 2
    outcome = simulate(updates, stops_at, interval, max_interval)
    fired = outcome["fired"].get("weights_stale")
    # Never before the first update that did not reach the sampler; by s + 2k - 1 at the latest
    # (and at step STALE_UPDATES when none ever did).
    assert fired is not None, outcome
    assert stops_at < fired <= stops_at + 2 * interval - 1, outcome
    if stops_at == 1:
        assert fired == STALE_UPDATES


@settings(max_examples=50, deadline=None)
@given(max_interval=st.integers(1, 12), interval_share=st.floats(0.0, 1.0))
def test_a_working_sync_is_never_blamed_however_seldom_it_is_probed(
    max_interval: int, interval_share: float
) -> None:
    interval = max(1, round(interval_share * max_interval))
    outcome = simulate(60, None, interval, max_interval)
    assert outcome["fired"] == {}
    # Probed after the first two updates, then every ``interval``.
    probed = outcome["probed"]
    assert probed[:STALE_UPDATES] == [1, 2] and all(
        b - a == interval for a, b in itertools.pairwise(probed[1:])
    )
