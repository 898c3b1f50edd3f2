"""The training-health checks (rllm.engine.training.health) over metrics rows: each names its
failure at the step it is due, with the evidence, and stays quiet on rows that only look like it;
the monitor warns once per check, stops on ``health.stop_on``, and replays a run alike.

Rows are what ``metrics.jsonl`` holds; the tiny-model runs that produce them from real failures
are tests/test_health_e2e.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.engine.training.health import HEALTH_STOP_EXIT, HealthMonitor, HealthStop, replay
from rllm.engine.training.health_config import CHECKS, HealthSection
from rllm.engine.training.trainer_config import config_from_dict
from rllm.types import ConfigError

TRAINED = {"train/sequences": 64, "train/signal_sequences": 20, "train/lr": 5e-4, "train/grad_norm": 0.3}


def run(rows: Iterable[dict[str, Any]], **section: Any) -> tuple[HealthMonitor, list[dict[str, Any]]]:
    """A monitor over ``rows`` (steps 1, 2, ...), and the rows as it left them."""
    monitor = HealthMonitor(HealthSection(**section))
    seen = []
    for step, row in enumerate(rows, start=1):
        row = {"reward/mean": 0.3, **row}
        monitor.observe(step, row)
        seen.append(row)
    return monitor, seen


def fired_at(monitor: HealthMonitor) -> dict[str, int]:
    return {name: f.first_step for name, f in monitor.fired.items()}


# --- config -------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["stop_on", "off"])
def test_an_unknown_check_name_is_refused_listing_the_known_ones(key: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"cookbook": "say", "health": {key: ["weights_stale", "entropy_colapse"]}})
    message = str(err.value)
    assert f"health.{key}" in message and "'entropy_colapse'" in message
    assert all(name in message for name in CHECKS)


@pytest.mark.parametrize(
    ("health", "blamed"),
    [
        ({"stop_on": ["no_signal"], "off": ["no_signal"]}, "cannot stop the run"),
        ({"stop_on": ["weights_stale"], "probe_sequences": 0}, "probe_sequences is 0"),
        ({"window": 1}, "window must be >= 2"),
        ({"probe_max_interval": 0}, "probe_max_interval must be >= 1"),
        ({"reward_floor": 1.0, "reward_ceiling": 1.0}, "must be below reward_ceiling"),
        ({"no_signal_share": 0.0}, "no_signal_share must be in (0, 1]"),
    ],
)
def test_contradictory_health_settings_are_refused(health: dict[str, Any], blamed: str) -> None:
    with pytest.raises(ConfigError, match="health") as err:
        config_from_dict({"cookbook": "say", "health": health})
    assert blamed in str(err.value)


def test_checkpoint_retention_is_a_key_with_todays_default() -> None:
    assert config_from_dict({"cookbook": "say"}).keep_checkpoints == 2
    with pytest.raises(ConfigError, match="keep_checkpoints"):
        config_from_dict({"cookbook": "say", "keep_checkpoints": 0})


# --- each check ---------------------------------------------------------------------------------


def test_weights_stale_fires_on_the_second_update_that_leaves_the_probe_set_unchanged() -> None:
    rows = [{**TRAINED, "probe/logprob_change": change} for change in (0.2, 0.0, 0.0, 0.0)]
    monitor, seen = run(rows)
    assert fired_at(monitor) == {"weights_stale": 3}
    evidence = monitor.fired["weights_stale"].evidence
    assert (
        "moved at most 0.0e+00 nats over the 2 updates of steps 2-3" in evidence and "lr 0.0005" in evidence
    )
    assert [r["health/weights_stale"] for r in seen] == [0.0, 0.0, 1.0, 1.0]


def test_weights_stale_is_not_blamed_for_steps_that_should_not_move_the_weights() -> None:
    # lr 0 and no signal move nothing: the probe rightly stays put (lr_zero names the first).
    rows = [{**TRAINED, "train/lr": 0.0, "probe/logprob_change": 0.0}] * 3
    rows += [{**TRAINED, "train/signal_sequences": 0, "probe/logprob_change": 0.0}] * 2
    monitor, _ = run(rows)
    assert "weights_stale" not in monitor.fired
    assert fired_at(monitor)["lr_zero"] == 2
    # A healthy run: every update moves the probe set.
    monitor, _ = run([{**TRAINED, "probe/logprob_change": 0.05}] * 20)
    assert monitor.fired == {}


def test_lr_zero_allows_one_warmup_step_at_zero() -> None:
    monitor, _ = run([{**TRAINED, "train/lr": lr} for lr in (0.0, 1e-5, 2e-5, 0.0, 0.0)])
    assert fired_at(monitor) == {"lr_zero": 5}
    assert "train/lr was 0 at steps 4-5 while 64 sequences trained" in monitor.fired["lr_zero"].evidence


def test_zero_advantage_needs_three_steps_in_a_row() -> None:
    signals = (0, 0, 4, 0, 0, 0)
    monitor, _ = run([{**TRAINED, "train/signal_sequences": n} for n in signals])
    assert fired_at(monitor) == {"zero_advantage": 6}
    assert "no learning signal in 3 steps in a row" in monitor.fired["zero_advantage"].line
    assert "group_size" in monitor.fired["zero_advantage"].line


def test_grad_zero_only_counts_steps_with_nonzero_advantages() -> None:
    rows = [{**TRAINED, "train/grad_norm": 0.0, "train/signal_sequences": 0}] * 2  # zero_advantage's
    rows += [{**TRAINED, "train/grad_norm": 0.0}] * 2
    monitor, _ = run(rows)
    assert fired_at(monitor)["grad_zero"] == 4


def test_entropy_collapse_below_the_ceiling_but_not_once_solved() -> None:
    collapsed = [{**TRAINED, "tokens/entropy_proxy": 0.01, "reward/mean": 0.4}] * 6
    monitor, _ = run(collapsed, window=10)
    assert fired_at(monitor) == {"entropy_collapse": 5}
    assert "below its ceiling 1" in monitor.fired["entropy_collapse"].evidence
    solved = [{**TRAINED, "tokens/entropy_proxy": 0.01, "reward/mean": 0.97}] * 20
    assert run(solved)[0].fired == {}
    # train/entropy (a backend's own) stands in where the proxy is missing.
    monitor, _ = run([{**TRAINED, "train/entropy": 0.001}] * 6)
    assert "entropy_collapse" in monitor.fired


def test_length_blowup_is_a_rise_not_a_level() -> None:
    rising = [{"tokens/truncated_share": 0.1}] * 10 + [{"tokens/truncated_share": 0.95}] * 10
    monitor, _ = run(rising, window=5)
    step = fired_at(monitor)["length_blowup"]
    assert 12 <= step <= 14  # once the window's mean passes 0.5
    assert "up from 10%" in monitor.fired["length_blowup"].evidence
    # The main job cuts nearly every reply at max_tokens = 2 from step 1: a level, no blow-up.
    assert run([{"tokens/truncated_share": 0.99}] * 40, window=5)[0].fired == {}


def _validated(trains: list[float], vals: list[float], every: int = 2) -> list[dict[str, Any]]:
    rows = []
    for i, train in enumerate(trains, start=1):
        row: dict[str, Any] = {"reward/mean": train}
        if i % every == 0:
            row["val/reward/mean"] = vals[i // every - 1]
        rows.append(row)
    return rows


def test_reward_hacking_is_train_up_while_validation_falls() -> None:
    monitor, _ = run(_validated([0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], [0.8, 0.7, 0.5, 0.3]))
    assert fired_at(monitor) == {"reward_hacking": 6}
    assert (
        "validation reward fell 0.80 -> 0.70 -> 0.50 (steps 2, 4, 6)"
        in monitor.fired["reward_hacking"].evidence
    )
    # Validation wobbling at the top while train reward holds: nothing.
    flat = _validated([0.95] * 12, [1.0, 0.94, 0.94, 1.0, 0.88, 0.88])
    assert run(flat)[0].fired == {}


def test_no_signal_fires_over_a_window_of_middling_constant_groups() -> None:
    rows = [{"filter/no_signal_groups": 0.5, "filter/no_signal_reward": 0.5}] * 6
    monitor, _ = run(rows, window=5)
    assert fired_at(monitor) == {"no_signal": 5}
    assert "50% of the groups over steps 1-5" in monitor.fired["no_signal"].evidence
    assert run([{"filter/no_signal_groups": 0.3}] * 20, window=5)[0].fired == {}


def test_mismatch_creep_names_when_max_mismatch_would_trip() -> None:
    rows = [{"mismatch/mean_abs": 0.005 * step} for step in range(1, 12)]
    monitor = HealthMonitor(HealthSection(window=10), max_mismatch=0.2)
    for step, row in enumerate(rows, start=1):
        monitor.observe(step, row)
    assert fired_at(monitor) == {"mismatch_creep": 10}
    assert "passes algorithm.max_mismatch=0.2 in about 30 steps" in monitor.fired["mismatch_creep"].evidence
    # fp32 numerics on the tiny model: ~2e-7, however it wobbles.
    noise = [{"mismatch/mean_abs": 1e-7 * (1 + step % 3)} for step in range(30)]
    assert run(noise)[0].fired == {}


def test_format_drift_when_the_format_falls_and_the_reward_holds() -> None:
    rows = [{"signal/has_boxed": 0.9, "reward/mean": 0.5}] * 5 + [
        {"signal/has_boxed": 0.4, "reward/mean": 0.5}
    ] * 5
    monitor, _ = run(rows, window=3)
    assert fired_at(monitor) == {"format_drift": 7}
    assert "signal/has_boxed fell from 0.90" in monitor.fired["format_drift"].evidence
    # The reward falling with it is the run failing, not the format drifting behind its back.
    falling = [{"signal/has_boxed": 0.9, "reward/mean": 0.8}] * 5 + [
        {"signal/has_boxed": 0.4, "reward/mean": 0.3}
    ] * 5
    assert run(falling, window=3)[0].fired == {}
    # Another signal is watched only when named.
    other = [{"signal/valid": v["signal/has_boxed"], "reward/mean": 0.5} for v in rows]
    assert run(other, window=3)[0].fired == {}
    assert "format_drift" in run(other, window=3, format_signal="valid")[0].fired


# --- the monitor --------------------------------------------------------------------------------


def test_a_check_warns_once_and_the_summary_repeats_it() -> None:
    monitor = HealthMonitor()
    rows = [{**TRAINED, "train/signal_sequences": 0} for _ in range(6)]
    new = [monitor.observe(step, row) for step, row in enumerate(rows, start=1)]
    assert [len(n) for n in new] == [0, 0, 1, 0, 0, 0]
    assert [("warning/health/zero_advantage" in r) for r in rows] == [False, False, True, False, False, False]
    (line,) = monitor.summary()
    assert line.startswith("health: zero_advantage fired at step 3 (held at 4 steps, the last 6):")
    assert monitor.stop_for(new[2]) is None  # not in stop_on


def test_stop_on_turns_the_firing_into_the_runs_error() -> None:
    monitor = HealthMonitor(HealthSection(stop_on=["zero_advantage"]))
    firings = [monitor.observe(s, {**TRAINED, "train/signal_sequences": 0}) for s in (1, 2, 3)]
    stop = monitor.stop_for(firings[2])
    assert isinstance(stop, HealthStop) and stop.exit_code == HEALTH_STOP_EXIT == 3
    assert str(stop).startswith("health: zero_advantage at step 3:") and "health.stop_on" in str(stop)


def test_off_checks_are_not_run_and_a_check_turned_off_is_said() -> None:
    monitor = HealthMonitor(HealthSection(off=["zero_advantage"]))
    for step in (1, 2, 3, 4):
        row = {**TRAINED, "train/signal_sequences": 0}
        monitor.observe(step, row)
        assert "health/zero_advantage" not in row
    note = monitor.turn_off("weights_stale", "the sampler said no")
    assert monitor.take_notes() == [note] and monitor.take_notes() == []
    assert monitor.summary() == [note]


row_values = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5)
)
KEYS = [
    "reward/mean",
    "val/reward/mean",
    "train/lr",
    "train/grad_norm",
    "train/sequences",
    "train/signal_sequences",
    "tokens/entropy_proxy",
    "tokens/truncated_share",
    "filter/no_signal_groups",
    "probe/logprob_change",
    "mismatch/mean_abs",
    "signal/has_answer",
]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(KEYS), row_values), max_size=40), st.integers(2, 8))
def test_any_rows_are_judged_without_error_and_each_check_warns_at_most_once(
    rows: list[dict[str, Any]], window: int
) -> None:
    monitor = HealthMonitor(HealthSection(window=window))
    warnings: list[str] = []
    for step, row in enumerate(rows, start=1):
        for firing in monitor.observe(step, row):
            warnings.append(firing.name)
        assert all(row[k] in (0.0, 1.0) for k in row if k.startswith("health/"))
    assert sorted(warnings) == sorted(set(warnings)) == sorted(monitor.fired)
    for firing in monitor.fired.values():
        assert firing.first_step <= firing.last_step and firing.steps >= 1
    # `rllm doctor run` replays a run's rows: the same verdicts.
    assert {
        n: (f.first_step, f.evidence)
        for n, f in replay(
            [{"step": s, **r} for s, r in enumerate(rows, start=1)], HealthSection(window=window)
        ).fired.items()
    } == {n: (f.first_step, f.evidence) for n, f in monitor.fired.items()}
