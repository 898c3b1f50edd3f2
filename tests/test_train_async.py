"""Asynchronous training (rollout.max_staleness) end to end on CPU: the tiny model, the say
cookbook, the real gateway, sampler server and optimizer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from rllm.engine.plugins import load_cookbook
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.training.async_loop import AsyncStepper
from rllm.engine.training.checkpoint import TrainerState, latest_checkpoint, load_trainer_state
from rllm.engine.training.data_order import DataCursor, next_batch
from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_episode_sample, read_metrics, sample_path
from rllm.engine.training.trainer import Trainer
from rllm.engine.training.trainer_config import ConfigError

pytestmark = pytest.mark.slow

# One request per sampler forward and seeded sampling: two runs see the same tokens.
DETERMINISTIC = [
    "progress=false",
    "plot=false",
    "tensorboard=false",
    "seed=0",
    "tasks_per_step=4",
    "group_size=4",
    "val_every=0",
    "rollout.sampling.seed=7",
    "backend.options.sampler_max_batch=1",
    "algorithm.filter_zero_variance=false",
    "rollout.workers=1",
]


class AsyncAtZero(Trainer):
    """The asynchronous step at K = 0, which the Trainer itself never takes (it keeps its own)."""

    def _async_stepper(self, engine: RolloutEngine, state: TrainerState) -> AsyncStepper | None:
        return AsyncStepper(self, engine, state).start()


def _per_step(rows: list[dict[str, Any]], prefixes: tuple[str, ...]) -> list[dict[str, Any]]:
    # Everything but wall-clock timings (e.g. train/train_step_s) and the memory the process
    # happens to hold (train/memory_estimate_gb).
    return [
        {k: v for k, v in row.items() if k.startswith(prefixes) and not k.endswith(("_s", "_gb"))}
        for row in rows
    ]


def test_staleness_zero_async_step_reproduces_the_synchronous_loop(tmp_path: Path) -> None:
    runs = {}
    for name, cls in (("sync", Trainer), ("async0", AsyncAtZero)):
        built = build_trainer(
            "say-single",
            out_dir=str(tmp_path / name),
            overrides=[*DETERMINISTIC, "total_steps=3", "ckpt_every=3"],
        )
        trainer = cls(built.config, built.cookbook, built.backend)
        asyncio.run(trainer.fit())
        runs[name] = read_metrics(tmp_path / name / "metrics.jsonl")
    sync, async0 = runs["sync"], runs["async0"]
    assert len(sync) == len(async0) == 3
    keys = ("batch/", "advantage/", "train/", "reward/", "weight_version")
    assert _per_step(async0, keys) == _per_step(sync, keys)
    assert all(row["async/staleness_max"] == 0 for row in async0)
    weights = [
        load_file(
            str(next((tmp_path / name / "checkpoints").glob("step_*")) / "backend" / "model.safetensors")
        )
        for name in ("sync", "async0")
    ]
    assert weights[0].keys() == weights[1].keys()
    assert all(weights[0][k].equal(weights[1][k]) for k in weights[0])


# Metric keys a synchronous step logs and an asynchronous one does not, each with the reason.
# Every other key of a synchronous step is in the asynchronous step too: both train through one
# step (rllm.engine.training.train_step), and this set is the only place a difference may be declared.
SYNC_ONLY = {
    # rollout.prefetch overlaps the next step's rollouts with this step's training in the
    # synchronous loop (refused with K > 0); the asynchronous loop always overlaps them and says
    # how much in async/rollout_utilisation and time/trainer_wait_s instead.
    "rollout/prefetched",
}
# Keys named after a value the data carried (a termination reason, a new segment's reason): two
# runs may meet different values, so such keys are compared by their family.
PER_VALUE = ("termination/", "segments/reason/")
# What only the asynchronous loop measures: the staleness bound, its queue and its overlap.
ASYNC_ONLY = {
    "async/staleness_mean",
    "async/staleness_max",
    "async/versions_spanned_mean",
    "async/versions_spanned_max",
    "async/continued_calls",
    "async/dropped_groups",
    "async/requeued_groups",
    "async/rollout_utilisation",
    "async/trainer_utilisation",
    "time/trainer_wait_s",
    "time/rollout_wait_s",
    "time/sync_s",
}


def test_an_asynchronous_step_logs_every_metric_of_a_synchronous_one(tmp_path: Path) -> None:
    # say: multi-turn episodes through the cumulative gateway, so the token-truth metrics
    # (mismatch/*, segments/*) are there to be missed.
    rows = {}
    for name, k in (("sync", 0), ("async", 1)):
        overrides = [*DETERMINISTIC, f"rollout.max_staleness={k}", "total_steps=1", "ckpt_every=0"]
        trainer = build_trainer("say", out_dir=str(tmp_path / name), overrides=overrides)
        asyncio.run(trainer.fit())
        (rows[name],) = read_metrics(tmp_path / name / "metrics.jsonl")
    sync, asynchronous = rows["sync"], rows["async"]
    assert {"mismatch/mean_abs", "mismatch/tokens", "segments/new_per_episode"} <= set(sync)
    assert set(sync) >= SYNC_ONLY  # a stale entry would excuse nothing
    missing = sorted(
        key
        for key in set(sync) - SYNC_ONLY
        if key not in asynchronous
        and not any(key.startswith(p) and any(a.startswith(p) for a in asynchronous) for p in PER_VALUE)
    )
    assert missing == [], f"the asynchronous step does not log {missing}"
    assert set(asynchronous) >= ASYNC_ONLY, sorted(ASYNC_ONLY - set(asynchronous))
    assert not ASYNC_ONLY & set(sync)
    # Measured, not only named: the step compared trainer and sampler logprobs on its tokens.
    assert asynchronous["mismatch/tokens"] > 0
    assert asynchronous["async/staleness_max"] <= 1


def test_staleness_one_trains_within_its_bound_and_resumes_every_task_once(tmp_path: Path) -> None:
    overrides = [*DETERMINISTIC, "rollout.max_staleness=1", "ckpt_every=2"]
    trainer = build_trainer("say-single", out_dir=str(tmp_path), overrides=[*overrides, "total_steps=2"])
    assert trainer.config.algorithm.tis == "trust_region"  # correction is on by default when K > 0
    asyncio.run(trainer.fit())
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None
    pending = load_trainer_state(ckpt).unconsumed_task_ids
    assert len(pending) == 4  # K = 1: one step's worth of groups was running on at the checkpoint
    resumed = build_trainer("say-single", out_dir=str(tmp_path), overrides=[*overrides, "total_steps=4"])
    asyncio.run(resumed.fit(resume=True, allow_changes=["total_steps"]))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    for row in rows:
        assert row["async/staleness_max"] <= 1
        assert row["episodes"] == 16
    consumed = [task for row in rows for task in row["batch/task_ids"]]
    assert set(pending) <= set(consumed[8:])  # the checkpoint's in-flight tasks ran after resume
    # Handed out = trained on + still in flight at the end, exactly the seeded data order's
    # prefix (the 8-task split wraps into a second epoch): no task skipped, none trained twice.
    final = latest_checkpoint(tmp_path)
    assert final is not None and final.name == "step_000004"
    in_flight = load_trainer_state(final).unconsumed_task_ids
    order, cursor = [], DataCursor()
    tasks = resumed.train_tasks
    while len(order) < len(consumed) + len(in_flight):
        batch, cursor = next_batch(tasks, 1, 0, cursor)
        order.append(batch[0].id)
    assert Counter(consumed) + Counter(in_flight) == Counter(order)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.max_staleness=1", "algorithm.tis=none"], "uncorrected_staleness"),
        (["rollout.max_staleness=1", "backend.options.sampler_weights=shared"], "sampler_weights"),
        (["rollout.max_staleness=-1"], "max_staleness"),
        # Refused for K > 0 itself, before the correction K > 0 turned on (the remote service
        # refuses algorithm.tis): no remote service is contacted, so none is faked.
        (
            ["rollout.max_staleness=1", "backend.options.service=remote", "backend.options.lora.rank=8"],
            "remote Tinker service is not supported with max_staleness > 0",
        ),
        (["rollout.partial=true"], "with rollout.max_staleness=0 every rollout has finished"),
        (
            [
                "rollout.max_staleness=1",
                "rollout.partial=true",
                "backend.options.service=remote",
                "backend.options.lora.rank=8",
            ],
            "remote Tinker service cannot abort a call",
        ),
    ],
)
def test_async_configs_that_cannot_keep_the_bound_are_refused(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build_trainer("say-single", out_dir=str(tmp_path), overrides=overrides)


def test_partial_rollouts_train_on_the_local_backend_within_the_bound(tmp_path: Path) -> None:
    # say: multi-turn episodes through the cumulative gateway; one request per sampler forward,
    # so at each sync some calls are mid-decode (continued on the new weights) and others queued
    # (re-sent whole). Token truth of a continued call is checked in test_tinker_partial.py.
    overrides = [*DETERMINISTIC, "rollout.max_staleness=1", "rollout.partial=true", "total_steps=2"]
    trainer = build_trainer("say", out_dir=str(tmp_path), overrides=[*overrides, "ckpt_every=0"])
    asyncio.run(trainer.fit())
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["async/staleness_max"] <= 1 and row["episodes"] == 16 for row in rows)
    for step in (1, 2):
        sample = read_episode_sample(sample_path(tmp_path, step))
        # No call was lost or failed by an abort: every call of a sampled episode is a step.
        assert not any(t.metadata.get("dropped_traces") for e in sample.episodes for t in e.trajectories)
        for s in (s for e in sample.episodes for t in e.trajectories for s in t.steps):
            spans = s.metadata.get("version_spans")
            if spans:  # a continued call: its spans cover its tokens, oldest first
                assert sum(n for _, n in spans) == len(s.completion_ids or ())
                assert s.weight_version == spans[0][0] <= spans[-1][0]


def test_uncorrected_staleness_is_an_explicit_opt_out(tmp_path: Path) -> None:
    trainer = build_trainer(
        "say-single",
        out_dir=str(tmp_path),
        overrides=["rollout.max_staleness=2", "algorithm.tis=none", "rollout.uncorrected_staleness=true"],
    )
    assert trainer.config.algorithm.tis == "none"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rllm.cli.main", *args]


def test_kill_9_of_an_async_run_then_resume_trains_every_task_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["train", "say-single", "--out", str(out), *DETERMINISTIC, "rollout.max_staleness=1"]
    args += ["ckpt_every=2", "total_steps=4"]
    proc = subprocess.Popen(
        _cli(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 300
    # A checkpoint is complete once its trainer state is written (the last file of it).
    target = out / "checkpoints" / "step_000002" / "trainer_state.json"
    while not target.exists():
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, "no checkpoint at step 2 within 300 s"
        time.sleep(0.05)  # polling for the file: the run itself is not waited on by time
    os.killpg(proc.pid, signal.SIGKILL)  # kill -9 while the next groups are in flight
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    if proc.stderr is not None:
        proc.stderr.close()
    pending = load_trainer_state(target.parent).unconsumed_task_ids
    assert pending  # K = 1: groups were running on when the checkpoint was taken
    done = subprocess.run(_cli(*args, "--resume"), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    rows = [row for row in read_metrics(out / "metrics.jsonl") if "batch/task_ids" in row]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]  # one curve: nothing redone twice in it
    assert all(row["async/staleness_max"] <= 1 for row in rows)
    consumed = [task for row in rows for task in row["batch/task_ids"]]
    assert set(pending) <= set(consumed[8:])  # the killed run's in-flight tasks were re-run
    final = latest_checkpoint(out)
    assert final is not None and final.name == "step_000004"
    in_flight = load_trainer_state(final).unconsumed_task_ids
    # Trained on + in flight at the end = exactly a prefix of the seeded data order: the tasks
    # the killed run handed out after its checkpoint were handed out again, none twice.
    tasks, cursor, order = load_cookbook("say-single").load_tasks("train"), DataCursor(), []
    while len(order) < len(consumed) + len(in_flight):
        batch, cursor = next_batch(tasks, 1, 0, cursor)
        order.append(batch[0].id)
    assert Counter(consumed) + Counter(in_flight) == Counter(order)


@pytest.mark.parametrize("cookbook", ["say-duo", "say"])
def test_per_role_estimators_and_turn_credit_train_under_staleness(tmp_path: Path, cookbook: str) -> None:
    # say-duo: two roles with their own estimators (grpo / rloo); say: multi-turn episodes with
    # per-turn credit (step_credit="turn"), whose turns may be answered by different versions.
    overrides = [*DETERMINISTIC, "rollout.max_staleness=1", "total_steps=3", "ckpt_every=0"]
    trainer = build_trainer(cookbook, out_dir=str(tmp_path), overrides=overrides)
    asyncio.run(trainer.fit())
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(row["async/staleness_max"] <= 1 and row["episodes"] == 16 for row in rows)
    assert all("async/trainer_utilisation" in row for row in rows)  # the asynchronous step ran
    if cookbook == "say-duo":
        assert trainer.config.algorithm.estimator_by_role == {"speaker": "grpo", "repeater": "rloo"}
        assert all(row["train/sequences"] == 2 * row["episodes"] for row in rows)
        assert {"advantage/speaker/mean", "advantage/repeater/mean"} <= set(rows[-1])
    else:
        assert trainer.config.algorithm.step_credit == "turn"
        # Turn credit wrote an advantage onto every turn of every trained multi-turn trajectory.
        for step in range(1, 4):
            sample = read_episode_sample(sample_path(tmp_path, step))
            trained = set(sample.trained_trajectory_ids)
            turns = [s for e in sample.episodes for t in e.trajectories if t.id in trained for s in t.steps]
            assert trained and len(turns) > len(trained)
            assert all(s.advantage is not None for s in turns)
        assert all(row["async/versions_spanned_max"] >= 1 for row in rows)
