"""Token truth while training, end to end on CPU: the say job through the real gateway
(cumulative mode), rollout engine, local sampler server and trainer.

A healthy run trains on the tokens it sampled: trainer and sampler logprobs agree (mismatch ~0).
A corrupted sampler (a loopback proxy in front of the real one that returns token ids that do not
match its text) is caught: the mismatch rises and `algorithm.max_mismatch` stops the run naming
the step, the worst episode and its first drifting token, in the synchronous and the
asynchronous loop alike.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from rllm.cli.main import main
from rllm.engine.training import launch
from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_episode_sample, read_metrics, sample_path
from rllm.engine.training.mismatch import TokenMismatchError

sys.path.insert(0, str(Path(__file__).parent))  # importlib mode: the helper beside this file
from corrupting_proxy import CorruptedSamplerBackend

pytestmark = pytest.mark.slow

FAST = [
    "progress=false",
    "plot=false",
    "tensorboard=false",
    "val_every=0",
    "ckpt_every=0",
    "tasks_per_step=8",
    "rollout.workers=1",
    "sample_groups=8",
    # A random model rarely scores: keep every group so each step trains.
    "algorithm.filter_zero_variance=false",
]


def test_healthy_say_run_has_no_mismatch(tmp_path: Path) -> None:
    trainer = build_trainer("say", out_dir=str(tmp_path), overrides=[*FAST, "total_steps=2"])
    asyncio.run(trainer.fit())
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == 2
    for row in rows:
        assert row["mismatch/tokens"] > 0
        assert row["mismatch/mean_abs"] < 1e-3, row
        assert row["mismatch/frac_over_0.5"] == 0.0
        # Measured whether or not it is 0 (the tiny template's separator: docs/token-truth.md).
        assert "segments/new_per_episode" in row
    sample = read_episode_sample(sample_path(tmp_path, 2))
    steps = [s for e in sample.episodes for t in e.trajectories for s in t.steps]
    trained = [s for s in steps if "train_logprobs" in s.metadata]
    assert trained, "no step carries the trainer's logprobs (the viewer's mismatch colouring)"
    for step in trained:
        assert step.completion_logprobs is not None
        assert len(step.metadata["train_logprobs"]) == len(step.completion_logprobs)
        assert step.metadata["train_logprobs"] == pytest.approx(list(step.completion_logprobs), abs=1e-2)


@pytest.mark.parametrize("staleness", [0, 1], ids=["sync", "async"])
def test_corrupted_sampler_is_caught_and_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], staleness: int
) -> None:
    # Through `rllm train` itself, the local backend behind the corrupting proxy. The
    # asynchronous loop (rollout.max_staleness=1) trains through the same step as the
    # synchronous one (rllm.engine.training.train_step), so it stops the same way: same line, same exit.
    monkeypatch.setattr(launch, "backend_class", lambda name: CorruptedSamplerBackend)
    overrides = [*FAST, "total_steps=3", "algorithm.max_mismatch=0.05", f"rollout.max_staleness={staleness}"]
    code = main(["train", "say", "--out", str(tmp_path), *overrides])
    err = capsys.readouterr().err
    assert code == 1, err  # the work failed (not bad input): exit 1, no traceback
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    prefix = f"error: {TokenMismatchError.__name__}: "
    assert line.startswith(prefix + "step 1: train/sampler mismatch "), line
    message = line.removeprefix(prefix)
    assert "exceeds algorithm.max_mismatch=0.05; worst episode " in message
    assert "first drifting token: role " in message
    # The step's sample is written before the run stops: the viewer shows where it drifted.
    sample = read_episode_sample(sample_path(tmp_path, 1))
    worst = max(sample.episodes, key=lambda e: e.metrics.get("mismatch/mean_abs", 0.0))
    assert worst.id in message
    # A random tiny model's logprobs are close together, so wrong ids move them by tenths of a
    # nat (0.67 on one run), against ~1e-7 when the ids are true: the drift measured is above the
    # limit the run was given.
    assert worst.metrics["mismatch/mean_abs"] > 0.2
    assert worst.metrics["mismatch/frac_over_0.5"] > 0.0
    # Ids that do not decode to the text the history carries cannot extend it: new segments, each with its reason.
    steps = [s for e in sample.episodes for t in e.trajectories for s in t.steps]
    assert any("segment_reason" in s.metadata for s in steps)
    # Stopped before its metrics row and before its weights reached the sampler: no step counted.
    assert not (tmp_path / "metrics.jsonl").exists() or not read_metrics(tmp_path / "metrics.jsonl")
