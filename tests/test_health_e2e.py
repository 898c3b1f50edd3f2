"""The training-health checks on real tiny-model runs: each injected failure (tests/health_failures.py)
is named by its check within a bounded number of steps, and stops the run there when
``health.stop_on`` names it; a healthy run of the same shape fires nothing; `rllm train` exits 3
with the check's line; `rllm doctor run` over the stopped run's folder names it too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rllm.cli.main import main
from rllm.engine.training.health_checks import STALE_UPDATES

sys.path.insert(0, str(Path(__file__).parent))  # importlib mode: the helper beside this file
import health_failures as failures

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", list(failures.FAILURES))
def test_an_injected_failure_is_named_within_its_bound(name: str, tmp_path: Path) -> None:
    failure = failures.FAILURES[name]
    outcome = failures.run(failure, tmp_path / "run")
    assert outcome.stopped is not None, (
        f"{failure.check} did not fire in {failure.bound} steps: {outcome.fired}"
    )
    assert outcome.stopped.startswith(f"health: {failure.check} at step "), outcome.stopped
    assert "Likely cause:" in outcome.stopped and "health.stop_on" in outcome.stopped
    step = outcome.fired[failure.check]
    assert step == outcome.steps <= failure.bound  # the run stopped at the step that named it
    # The stopping row is written, flagged and warned; `rllm doctor run` finds the same.
    last = outcome.rows[-1]
    assert last[f"health/{failure.check}"] == 1.0 and f"warning/health/{failure.check}" in last
    if failure.check == "weights_stale":
        # What the double does: a version bump each step, no weights moved, none of it hidden.
        assert last["weight_version"] == step and last["probe/logprob_change"] == 0.0
        # The first updates are probed whatever the timings (weight_probe.ProbeSchedule): a run
        # whose weights never take effect is named at the second update.
        assert step == STALE_UPDATES


def test_the_healthy_run_fires_nothing(tmp_path: Path) -> None:
    outcome = failures.run(failures.HEALTHY, tmp_path / "run")
    assert outcome.steps == failures.HEALTHY.bound and outcome.stopped is None
    assert outcome.fired == {}, outcome.fired
    judged = {k.removeprefix("health/") for r in outcome.rows for k in r if k.startswith("health/")}
    assert {"weights_stale", "lr_zero", "zero_advantage", "grad_zero", "entropy_collapse"} <= judged
    assert all(r["probe/logprob_change"] > 1e-5 for r in outcome.rows if "probe/logprob_change" in r)


def test_rllm_train_exits_3_with_the_line_and_doctor_run_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Groups of 2 under a minimum of 3: every group is filtered out, nothing ever trains.
    out = tmp_path / "run"
    args = ["total_steps=8", "tasks_per_step=2", "group_size=2", "algorithm.min_group_size=3"]
    args += ["rollout.workers=1", "progress=false", "plot=false", "tensorboard=false", "val_every=0"]
    code = main(["train", "say-single", "--out", str(out), *args, "health.stop_on=[zero_advantage]"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "error: health: zero_advantage at step 3: no learning signal in 3 steps in a row" in err
    assert "rllm doctor run" in err  # the hint
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
    ]

    assert main(["doctor", "run", str(out), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["healthy"] is False and report["steps"] == 3
    assert [(f["check"], f["first_step"]) for f in report["fired"]] == [("zero_advantage", 3)]
    assert main(["doctor", "run", str(out)]) == 1
    table = capsys.readouterr().out
    assert "zero_advantage" in table and "group_size" in table
