"""Training-health overhead: what the checks cost a step, and how many steps each injected failure
takes to be named (issue #50; the checks are rllm.engine.training.health).

(1) Per-step cost, on two configs, each a real `rllm train` run on the tiny model:

  main          the README main job (`rllm train say`: 32 tasks x 4, two turns, max_tokens 2),
                one flow worker (tests/health_failures.py's BASE without its short window)
  whole_system  benchmarks/whole_system.py's config (say-single, 4 tasks x 8, max_tokens 4,
                lr 1e-4, broadcast credit, one flow worker)

The run is unchanged; this process wraps the parts the checks add and times them: the step's
health figures (``step_health_metrics``), the probe set's scoring (``WeightProbe.start`` and
``measure``: one ``prompt_logprobs`` request each time it runs, the only model work: after each of
the first two updates, then every k-th, k set from its cost against the step's, see
``weight_probe.ProbeSchedule``) and the monitor over the row (``HealthMonitor.observe``).
Printed: their mean milliseconds a step (the probe's cost spread over its interval), the median
step (the time between consecutive metrics rows), the checks' share of a step (target <= 3%), and
the steps the probe ran at. The first step (start-up, the probe set fixed) is left out.

(2) Steps to detection: each failure of tests/health_failures.py injected into its tiny-model
run, ``health.stop_on`` naming its check; printed: the step it was named at, the bound the test
gives it, and the run's wall time (the test's cost in CI).

    uv run --no-sync python benchmarks/health_overhead.py                  # (1) and (2)
    uv run --no-sync python benchmarks/health_overhead.py --only main --steps 30
    uv run --no-sync python benchmarks/health_overhead.py --only detection --failure stale_sampler
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import health_failures as failures  # (the failures the e2e tests inject)

WHOLE_SYSTEM = [
    "tasks_per_step=4",
    "group_size=8",
    "backend.options.learning_rate=1e-4",
    "rollout.sampling.max_tokens=4",
    "val_every=0",
    "ckpt_every=0",
    "rollout.workers=1",
    "algorithm.step_credit=broadcast",
    "progress=false",
    "plot=false",
    "tensorboard=false",
]
MAIN = [o for o in failures.BASE if not o.startswith("health.")]
PARTS = ("health figures", "probe scoring", "monitor")


class Timers:
    """Wall seconds of each wrapped part, per step (closed at each metrics row)."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.ends: list[float] = []

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        original = getattr(owner, attr)
        if asyncio.iscoroutinefunction(original):

            @functools.wraps(original)
            async def awrapped(*a: Any, **k: Any) -> Any:
                start = time.perf_counter()
                try:
                    return await original(*a, **k)
                finally:
                    self.current[label] += time.perf_counter() - start

            setattr(owner, attr, awrapped)
        else:

            @functools.wraps(original)
            def wrapped(*a: Any, **k: Any) -> Any:
                start = time.perf_counter()
                try:
                    return original(*a, **k)
                finally:
                    self.current[label] += time.perf_counter() - start

            setattr(owner, attr, wrapped)

    def close_step(self) -> None:
        self.ends.append(time.perf_counter())
        self.steps.append(dict(self.current))
        self.current.clear()


def instrument(timers: Timers) -> Callable[[], None]:
    """Wrap the checks' parts and the metrics row (a step's end); returns the undo."""
    from rllm.engine.training import train_step
    from rllm.engine.training.health import HealthMonitor
    from rllm.engine.training.metrics_log import MetricsLogger
    from rllm.engine.training.weight_probe import WeightProbe

    saved = [
        (train_step, "step_health_metrics"),
        (WeightProbe, "start"),
        (WeightProbe, "measure"),
        (HealthMonitor, "observe"),
        (MetricsLogger, "log"),
    ]
    originals = [(owner, attr, getattr(owner, attr)) for owner, attr in saved]
    timers.wrap(train_step, "step_health_metrics", "health figures")
    timers.wrap(WeightProbe, "start", "probe scoring")
    timers.wrap(WeightProbe, "measure", "probe scoring")
    timers.wrap(HealthMonitor, "observe", "monitor")
    log = MetricsLogger.log

    def logged(self: Any, step: int, metrics: dict[str, Any]) -> None:
        log(self, step, metrics)
        if step > 0:  # the step-0 validation row is not a step
            timers.close_step()

    MetricsLogger.log = logged  # type: ignore[method-assign]

    def undo() -> None:
        for owner, attr, original in originals:
            setattr(owner, attr, original)

    return undo


def overhead(name: str, cookbook: str, overrides: list[str], steps: int) -> None:
    from rllm.engine.training.launch import build_trainer

    timers = Timers()
    undo = instrument(timers)
    try:
        out = Path(tempfile.mkdtemp(prefix="rllm-health-")) / "run"
        trainer = build_trainer(
            cookbook, overrides=[*overrides, f"total_steps={steps}"], out_dir=str(out), resume=False
        )
        start = time.perf_counter()
        asyncio.run(trainer.fit())
        timers.ends.insert(0, start)
    finally:
        undo()
    step_s = [b - a for a, b in zip(timers.ends, timers.ends[1:], strict=False)][1:]
    rows = timers.steps[1:]
    if not step_s:
        print(f"{name}: too few steps ({steps}) to time")
        return
    step_ms = statistics.median(step_s) * 1000
    print(f"\n{name} ({cookbook}, {len(step_s)} steps timed of {steps}): median step {step_ms:.0f} ms")
    # Means, not medians: the probe runs every k-th step (weight_probe.ProbeSchedule), so its
    # median over steps is 0 once k > 1; its cost a step is what it costs over the interval.
    total = 0.0
    for part in PARTS:
        ms = statistics.fmean(r.get(part, 0.0) for r in rows) * 1000
        total += ms
        print(f"  {part:<16} {ms:8.2f} ms/step  ({ms / step_ms:.2%} of a step)")
    print(f"  {'all checks':<16} {total:8.2f} ms/step  ({total / step_ms:.2%} of a step; target <= 3%)")
    probed = [i for i, r in enumerate(timers.steps, start=1) if r.get("probe scoring")]
    print(f"  probe set re-scored at steps {probed}")


def detection(names: list[str]) -> None:
    print("\nsteps to detection (tests/health_failures.py; health.stop_on names the check):")
    print(f"  {'failure':<18} {'check':<16} {'named at':>8} {'bound':>6} {'wall s':>7}")
    for name in names:
        failure = failures.FAILURES[name] if name != "healthy" else failures.HEALTHY
        out = Path(tempfile.mkdtemp(prefix="rllm-health-")) / "run"
        start = time.perf_counter()
        outcome = failures.run(failure, out)
        wall = time.perf_counter() - start
        if failure.check is None:
            named = "none" if not outcome.fired else ", ".join(outcome.fired)
        else:
            named = str(outcome.fired.get(failure.check, "MISSED"))
        print(f"  {name:<18} {failure.check or '-':<16} {named:>8} {failure.bound:>6} {wall:7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", action="append", choices=["main", "whole_system", "detection"])
    parser.add_argument("--steps", type=int, default=20, help="steps of each overhead run")
    parser.add_argument(
        "--failure", action="append", choices=[*failures.FAILURES, "healthy"], help="(2): these only"
    )
    args = parser.parse_args()
    only = set(args.only or ["main", "whole_system", "detection"])
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    if "main" in only:
        overhead("main", "say", MAIN, args.steps)
    if "whole_system" in only:
        overhead("whole_system", "say-single", WHOLE_SYSTEM, args.steps)
    if "detection" in only:
        detection(args.failure or [*failures.FAILURES, "healthy"])


if __name__ == "__main__":
    main()
