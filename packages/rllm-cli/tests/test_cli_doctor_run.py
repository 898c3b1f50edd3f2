"""`rllm doctor run RUN_DIR`: the training-health checks over a run folder's metrics rows, as a
table or JSON; exit 0 when nothing fired, 1 when something did, 2 for a folder that is not a run
or a setting that is not a health threshold.

The folders are written here row by row (what `metrics.jsonl` and `samples/` hold); the same
command over a folder a real run stopped is in tests/test_health_e2e.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rllm.cli.main import main
from rllm.engine.training.metrics_log import write_episode_sample
from rllm.types import Episode, Step, Trajectory

TRAINED = {"train/sequences": 64, "train/signal_sequences": 20, "train/lr": 5e-4, "train/grad_norm": 0.3}


def write_run(run: Path, rows: list[dict[str, Any]], torn: str = "") -> Path:
    run.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": step, "reward/mean": 0.3, **row}) for step, row in enumerate(rows, start=1)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n" + torn)
    return run


def doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", "run", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_healthy_run_exits_0_and_says_what_was_judged(capsys, tmp_path):
    run = write_run(tmp_path / "run", [{**TRAINED, "probe/logprob_change": 0.05}] * 12)
    code, report = doctor(capsys, str(run))
    assert code == 0 and report["healthy"] is True and report["fired"] == [] and report["steps"] == 12
    assert report["judged"] == ["weights_stale", "lr_zero", "zero_advantage", "grad_zero"]
    assert main(["doctor", "run", str(run)]) == 0
    assert "healthy" in capsys.readouterr().out


def test_what_fired_is_named_with_its_step_evidence_and_cause(capsys, tmp_path):
    # lr at 0 from step 3 on, and a torn last line (a run still writing) left out.
    rows = [{**TRAINED, "train/lr": 5e-4 if step < 3 else 0.0} for step in range(1, 7)]
    run = write_run(tmp_path / "run", rows, torn='{"step": 7, "rew')
    code, report = doctor(capsys, str(run))
    assert code == 1 and report["healthy"] is False and report["steps"] == 6
    (fired,) = report["fired"]
    assert (fired["check"], fired["first_step"], fired["last_step"], fired["steps"]) == ("lr_zero", 4, 6, 3)
    assert fired["evidence"] == "train/lr was 0 at steps 3-4 while 64 sequences trained"
    assert "learning-rate schedule" in fired["likely_cause"]
    assert main(["doctor", "run", str(run)]) == 1
    table = capsys.readouterr().out
    assert "lr_zero" in table and "3 steps, last 6" in table


def test_thresholds_are_set_as_in_a_training_config(capsys, tmp_path):
    run = write_run(tmp_path / "run", [{"filter/no_signal_groups": 0.4}] * 6)
    assert doctor(capsys, str(run))[0] == 0  # under the default share, 0.5
    code, report = doctor(capsys, str(run), "health.no_signal_share=0.3", "health.window=3")
    assert code == 1 and [(f["check"], f["first_step"]) for f in report["fired"]] == [("no_signal", 3)]


def test_older_rows_get_entropy_from_the_steps_samples(capsys, tmp_path):
    # Rows without tokens/entropy_proxy: the sampled tokens' -logprob comes from samples/.
    run = write_run(tmp_path / "run", [{"reward/mean": 0.4}] * 6)
    for step in range(1, 7):
        episodes = [
            Episode(
                task_id="t",
                rollout_index=i,
                trajectories=[
                    Trajectory(
                        steps=[
                            Step(
                                prompt_ids=[1, 2],
                                completion_ids=[3, 4],
                                completion_logprobs=[-0.001, -0.001],
                                finish_reason="stop",
                            )
                        ],
                        reward=0.4,
                    )
                ],
            )
            for i in range(2)
        ]
        write_episode_sample(run, step, episodes, [], groups=1)
    code, report = doctor(capsys, str(run), "health.window=4")
    assert code == 1 and [f["check"] for f in report["fired"]] == ["entropy_collapse"]
    assert "token entropy 0.001 nats or less" in report["fired"][0]["evidence"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "holds no metrics.jsonl: not a training run folder"),
        (("total_steps=3",), "only health.KEY=VALUE settings apply here"),
        (("health.windw=3",), "health.windw"),
        (("health.window=1",), "window must be >= 2"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, args, said):
    run = tmp_path / "run"
    if args:
        write_run(run, [TRAINED])
    else:
        run.mkdir()
    assert main(["doctor", "run", str(run), *args]) == 2
    err = capsys.readouterr().err
    assert said in err, err
