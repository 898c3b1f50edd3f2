"""`seed` alone reproduces a run: two `rllm train say` runs with the same seed and config, on the
local backend with one flow worker, write the same metrics row for row (timings aside).

What `seed` seeds, and what stays nondeterministic with more workers, is
rllm.engine.training.seeding's docstring. Before it seeded sampling, the second step of two such
runs already parted (their sampler drew from one unseeded stream, in whatever order the batch's
requests reached it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from rllm.cli.main import main
from rllm.engine.training.metrics_log import read_metrics

pytestmark = pytest.mark.slow

RUN = [
    "seed=7",
    "total_steps=3",
    "tasks_per_step=32",
    "group_size=4",
    "rollout.workers=1",
    "val_every=2",
    "progress=false",
    "plot=false",
    "tensorboard=false",
]
# Computed from the sampler's logprobs, which the local sampler computes in whatever batch the
# step's requests arrived together: equal to the last few float digits (~1e-7 nats a token); the
# tokens they belong to, the rewards and every update are equal exactly.
SAMPLER_ROUNDING = ("mismatch/", "train/sampler_logprob_abs_diff", "tokens/entropy_proxy")


def timing(key: str) -> bool:
    """Wall-clock timings and the machine's memory (the trainer's estimate counts what the process
    holds): measurements of the machine, not of the run."""
    return key.startswith(("time/", "val/time/")) or key.endswith(("_s", "_gb"))


# The weight probe re-scores after the first two updates, then at an interval set from its cost
# against the step's (rllm.engine.training.weight_probe.ProbeSchedule): which later steps carry
# its figure is a timing; where both runs probed, the figure is equal.
PROBED = ("probe/", "health/weights_stale")


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in row.items()
        if not timing(k) and not k.startswith(SAMPLER_ROUNDING) and not k.startswith(PROBED)
    }


def test_the_same_seed_and_config_give_the_same_metrics(tmp_path: Path) -> None:
    runs = []
    for name in ("first", "second"):
        out = tmp_path / name
        assert main(["train", "say", "--out", str(out), *RUN]) == 0
        runs.append(read_metrics(out / "metrics.jsonl"))
    first, second = runs
    assert [r["step"] for r in first] == [0, 1, 2, 3]
    # Something was learned from (equal rows of a run that trained nothing would prove nothing).
    assert sum(r.get("train/signal_sequences", 0) for r in first) > 0
    assert any(r.get("reward/mean", 0) > 0 for r in first)
    for a, b in zip(first, second, strict=True):
        assert comparable(a) == comparable(b), a["step"]
        rounded = [k for k in a if k.startswith(SAMPLER_ROUNDING)]
        assert rounded == [k for k in b if k.startswith(SAMPLER_ROUNDING)]
        for key in rounded:
            assert math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-6), (a["step"], key)
        probed = [k for k in a if k.startswith(PROBED)]
        if a["step"] in (1, 2):  # always probed
            assert "probe/logprob_change" in probed, a["step"]
        assert all(a[k] == b[k] for k in probed if k in b), a["step"]
