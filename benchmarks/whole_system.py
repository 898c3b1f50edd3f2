"""Whole-system benchmark: `rllm train` vs the backend driven directly vs TRL's GRPOTrainer.

Same toy config as benchmarks/cpu_training.py (say-single: "say: X" over 8 words, reward 1 when
the reply starts with X; 4 tasks x 8 samples per step, lr 1e-4, at most 4 tokens, temperature 1,
one flow worker, no validation or checkpoints, broadcast step credit), each side run until the
trailing 25-step mean reward reaches 0.9 (or --max-steps / --max-seconds):

  (1) trl     TRL's GRPOTrainer (subprocess, venv made by cpu_training.ensure_trl_env)
  (2) direct  the local backend driven directly (cpu_training.run_ours)
  (3) system  the Trainer as `rllm train` builds it (rllm.engine.training.launch.build_trainer): engine,
              embedded gateway sessions, sampler server, traces, episodes, evaluator, files

Printed: each side's per-step median and wall time to 0.9, its process CPU time per step and its
sampler's forward passes, batches and joined rows per step (on a shared machine CPU time is the
steadier figure: wall time there is mostly other people's load), the ratios the issue sets targets on
(system/direct per step <= 1.3x, system/TRL wall to 0.9 <= 1.0x), and for (3) a per-component
breakdown of a step: median milliseconds per step of each part, measured by wrapping the parts
in this process (the run itself is unchanged). Rollout-internal parts run concurrently for the
step's 32 rollouts: they are shown as the mean per rollout; trainer-side parts are sequential.

    uv run --no-sync python benchmarks/whole_system.py                    # all three sides
    uv run --no-sync python benchmarks/whole_system.py --only system --max-steps 60
    # (3) with rollout.prefetch off then on, flows in this process then in one flow process,
    # twice over, against (2):
    uv run --no-sync python benchmarks/whole_system.py --only direct --only system --no-breakdown \
        --prefetch off --prefetch on --executor local --executor processes --repeat 2 --max-steps 400
    # (3) with the flows' create in one hop (rllm.sdk.fast_chat) and through openai's own path:
    uv run --no-sync python benchmarks/whole_system.py --only direct --only system --no-breakdown \
        --flow-client one-hop --flow-client openai --repeat 2 --max-steps 300
    # steps to 0.9 per seed (deterministic for a seed, so any load will do), every side training
    # the model and words `rllm train say-single` uses, and (3) with a config override:
    nice -n 19 uv run --no-sync python benchmarks/whole_system.py --seeds 0 1 2 3 4 5 --same-task
    nice -n 19 uv run --no-sync python benchmarks/whole_system.py --seeds 0 1 2 --only system \
        --same-task --set algorithm.filter_zero_variance=false

Without --same-task, (1) and (2) train a tiny model built for cpu_training's word list and (3)
the one `rllm train` builds for the say cookbook (another vocabulary, so other initial weights,
and other words): their steps to 0.9 then compare two tasks, not two trainers.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import cpu_training as ct  # (the sibling benchmark: TRL and direct sides)

# (label, scope): "step" parts are sequential wall time of the trainer; "rollout" parts are per rollout.
STEP_PARTS = [
    ("data order (next_batch)", "step"),
    ("rollouts: engine.run (wall)", "step"),
    ("group + filter", "step"),
    ("advantages", "step"),
    ("sequences", "step"),
    ("train step (backend)", "step"),
    ("token-truth mismatch", "step"),
    ("sample file (episodes)", "step"),
    ("pause + sync + resume", "step"),
    ("  of which sync_weights", "step"),
    ("episode metrics", "step"),
    ("metrics file (metrics.jsonl)", "step"),
    ("progress display", "step"),
]
ROLLOUT_PARTS = [
    ("rollout attempt (whole)", "rollout"),
    ("session open", "rollout"),
    ("flow run (LLM call via gateway)", "rollout"),
    ("session close + trace fetch", "rollout"),
    ("episode build", "rollout"),
    ("evaluator (score)", "rollout"),
]


def cpu_with_children(children: bool = True) -> float:
    """This process's CPU seconds plus, with ``children``, its live child processes' (flow worker
    processes with ``rollout.executor=processes``; none on the other sides)."""
    import psutil

    total = time.process_time()
    if not children:
        return total
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # exited meanwhile
            continue
        total += times.user + times.system
    return total


class SamplerWatch:
    """Per-step CPU time (the process and its flow worker processes) and the local sampler's counters.

    ``children``: add child processes' CPU (flow worker processes). Only then: psutil finds them by
    reading every process's /proc stat file, ~3.6 ms a step on this shared machine (#35 round 11's
    profile), inside the step whose time is measured."""

    def __init__(self, children: bool = False) -> None:
        from rllm.backends.tinker.local.generation import SamplerEngine

        self.children = children
        self.engines: list[Any] = []
        self.marks: list[tuple[float, int, int, int, int]] = []
        inner = SamplerEngine.__init__
        engines = self.engines

        def init(engine: Any, *a: Any, **k: Any) -> None:
            inner(engine, *a, **k)
            engines.append(engine)

        SamplerEngine.__init__ = init  # type: ignore[method-assign]

    def mark(self) -> None:
        e = self.engines[-1]
        self.marks.append(
            (
                cpu_with_children(self.children),
                getattr(e, "forward_passes", 0),
                e.batches_run,
                getattr(e, "rows_joined", 0),
                getattr(e, "rows_shared", 0),  # rows whose prompt another row prefilled (round 8)
            )
        )

    def summary(self, side: str, skip: int = 3) -> str:
        marks = self.marks[skip:] if len(self.marks) > skip + 1 else self.marks
        d = [[b - a for a, b in zip(m0, m1, strict=True)] for m0, m1 in itertools.pairwise(marks)]
        if not d:
            return f"{side}: no steps"
        med = [statistics.median(x[i] for x in d) for i in range(5)]
        return (
            f"{side:7s} CPU {med[0] * 1000:6.1f} ms/step   sampler per step: {med[1]:.0f} forward passes,"
            f" {med[2]:.0f} batches, {med[3]:.0f} joined rows, {med[4]:.0f} rows sharing a prefill"
        )


class Timers:
    """Accumulates the seconds each wrapped part takes within the current step."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.steps: list[dict[str, float]] = []
        self.step_counts: list[dict[str, int]] = []

    def close_step(self) -> None:
        self.steps.append(dict(self.current))
        self.step_counts.append(dict(self.counts))
        self.current.clear()
        self.counts.clear()

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr)
        timers = self
        if asyncio.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awrapped(*a: Any, **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    return await fn(*a, **k)
                finally:
                    timers.current[label] += time.perf_counter() - t
                    timers.counts[label] += 1

            setattr(owner, attr, awrapped)
        else:

            @functools.wraps(fn)
            def wrapped(*a: Any, **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    timers.current[label] += time.perf_counter() - t
                    timers.counts[label] += 1

            setattr(owner, attr, wrapped)


def instrument(timers: Timers, on_step: Callable[[int, dict[str, Any]], None]) -> None:
    """Wrap the parts of a step where they are looked up (module globals / classes)."""
    from rllm.engine.rollout import rollout_engine as re_mod
    from rllm.engine.rollout.rollout_engine import RolloutEngine
    from rllm.engine.training import train_step as ts
    from rllm.engine.training.metrics_log import MetricsLogger
    from rllm.engine.training.task_sampler import TaskSampler
    from rllm.engine.training.train_progress import TrainProgress
    from rllm.gateway.local_client import LocalGatewayClient

    timers.wrap(TaskSampler, "next_batch", "data order (next_batch)")
    timers.wrap(RolloutEngine, "run", "rollouts: engine.run (wall)")
    timers.wrap(ts, "group_trajectories", "group + filter")
    timers.wrap(ts, "filter_groups", "group + filter")
    timers.wrap(ts, "compute_advantages", "advantages")
    timers.wrap(ts, "sequences_from_groups", "sequences")
    timers.wrap(ts, "measure_mismatch", "token-truth mismatch")
    timers.wrap(ts, "check_mismatch", "token-truth mismatch")
    timers.wrap(ts, "write_episode_sample", "sample file (episodes)")
    timers.wrap(ts, "episode_metrics", "episode metrics")
    timers.wrap(TrainProgress, "update", "progress display")
    timers.wrap(RolloutEngine, "_attempt", "rollout attempt (whole)")
    timers.wrap(LocalGatewayClient, "create_session", "session open")
    timers.wrap(re_mod, "call_with_deadline", "flow run (LLM call via gateway)")
    timers.wrap(LocalGatewayClient, "finish_session", "session close + trace fetch")
    timers.wrap(re_mod, "build_episode", "episode build")
    timers.wrap(RolloutEngine, "_score", "evaluator (score)")
    for name in ("pause", "resume", "set_weight_version"):
        timers.wrap(LocalGatewayClient, name, "pause + sync + resume")
    timers.wrap(MetricsLogger, "log", "metrics file (metrics.jsonl)")

    # Outermost on MetricsLogger.log: one row is one finished step (its time stamp and reward).
    inner_log = MetricsLogger.log

    def log(self: Any, step: int, metrics: dict[str, Any]) -> None:
        inner_log(self, step, metrics)
        on_step(step, metrics)

    MetricsLogger.log = log  # type: ignore[method-assign]


def wrap_backend(timers: Timers, backend: Any) -> None:
    timers.wrap(backend, "train_step", "train step (backend)")
    timers.wrap(backend, "sync_weights", "  of which sync_weights")
    # sync_weights runs between pause and resume: count it in that part as well.
    inner = backend.sync_weights

    async def sync() -> Any:
        t = time.perf_counter()
        try:
            return await inner()
        finally:
            timers.current["pause + sync + resume"] += time.perf_counter() - t

    backend.sync_weights = sync


def run_system(
    args: argparse.Namespace,
    breakdown: bool,
    watch: SamplerWatch | None = None,
    prefetch: str = "config",
    executor: str = "local",
    loop: str = "asyncio",
) -> tuple[ct.RunResult, Timers | None, list[float]]:
    """One `rllm train` run and its reward per step; ``prefetch`` (on/off/config) sets
    rollout.prefetch, ``executor`` rollout.executor (one flow worker either way), ``loop`` the
    trainer's event loop (asyncio's or uvloop). The patches it makes are undone after it."""
    from rllm.engine.training.metrics_log import MetricsLogger
    from rllm.engine.training.trainer import Trainer

    patched = (MetricsLogger.log, Trainer._train_one_step)
    try:
        return _run_system(args, breakdown, watch, prefetch, executor, loop)
    finally:
        MetricsLogger.log, Trainer._train_one_step = patched  # type: ignore[method-assign]


def _run_system(
    args: argparse.Namespace,
    breakdown: bool,
    watch: SamplerWatch | None,
    prefetch: str,
    executor: str,
    loop: str,
) -> tuple[ct.RunResult, Timers | None, list[float]]:
    import msgspec

    from rllm.engine.training.launch import build_trainer

    out = Path(tempfile.mkdtemp(prefix="rllm-ws-")) / "run"
    overrides = [
        f"tasks_per_step={args.prompts}",
        f"group_size={args.group}",
        f"backend.options.learning_rate={args.lr}",
        f"backend.options.torch_threads={args.threads}",
        "rollout.sampling.max_tokens=4",
        f"total_steps={args.max_steps}",
        "val_every=0",
        "ckpt_every=0",
        "rollout.workers=1",
        f"rollout.executor={executor}",
        "algorithm.step_credit=broadcast",
        f"seed={args.seed}",
        "progress=false",
        "plot=false",
    ]
    if prefetch != "config":
        overrides.append(f"rollout.prefetch={str(prefetch == 'on').lower()}")
    if args.model is not None:  # --same-task: the model every side trains, the one (3) would build
        overrides.append(f"backend.options.model={args.model}")
    overrides += args.system_set  # --set: config overrides of (3) (e.g. algorithm.epsilon=1e-4)
    if args.sampler_hop != "config":
        overrides.append(
            f"backend.options.sampler_in_process={str(args.sampler_hop == 'in-process').lower()}"
        )
    trainer = build_trainer("say-single", overrides=overrides, out_dir=str(out), resume=False)
    rewards: list[float] = []
    ends: list[float] = []
    # The trainer's own split of a step: rollouts (with prefetch: what was left of them when the
    # step began) and the rest (train, sync, files).
    parts: dict[str, list[float]] = {"time/rollout_s": [], "time/train_s": []}
    timers = Timers() if breakdown else None
    start = [0.0]

    def on_step(step: int, metrics: dict[str, Any]) -> None:
        if step == 0:
            return
        rewards.append(float(metrics["reward/mean"]))
        for key in ("time/rollout_s", "time/train_s"):
            parts[key].append(float(metrics[key]))
        ends.append(time.perf_counter())
        if timers is not None:
            timers.close_step()
        if ct._reached(rewards) or ends[-1] - start[0] > args.max_seconds:
            # End the loop after this step, as total_steps would (the final checkpoint follows).
            msgspec.structs.force_setattr(trainer.config, "total_steps", step)

    if watch is not None:
        inner_on_step = on_step

        def on_step(step: int, metrics: dict[str, Any]) -> None:
            watch.mark()
            inner_on_step(step, metrics)

    if timers is not None:
        instrument(timers, on_step)
        wrap_backend(timers, trainer.backend)
    else:
        from rllm.engine.training.metrics_log import MetricsLogger

        inner_log = MetricsLogger.log

        def log(self: Any, step: int, metrics: dict[str, Any]) -> None:
            inner_log(self, step, metrics)
            on_step(step, metrics)

        MetricsLogger.log = log  # type: ignore[method-assign]

    # The clock starts with the first step's rollouts (after backend + engine start-up), as
    # TRL's on_train_begin and the direct side's loop do.
    from rllm.engine.training.trainer import Trainer

    inner_step = Trainer._train_one_step

    async def first_step(self: Any, engine: Any, state: Any) -> Any:
        if not start[0]:
            start[0] = time.perf_counter()
        return await inner_step(self, engine, state)

    Trainer._train_one_step = first_step  # type: ignore[method-assign]
    if loop == "uvloop":
        import uvloop

        uvloop.run(trainer.fit(resume=False, overwrite=False))
    else:
        asyncio.run(trainer.fit(resume=False, overwrite=False))
    skip = min(3, len(rewards) - 1)
    print(
        "  median per step: rollout (left when the step began) "
        + " ms, rest of the step (train, sync, files) ".join(
            f"{statistics.median(v[skip:]) * 1000:.1f}" for v in parts.values()
        )
        + " ms",
        flush=True,
    )
    return ct.summarise("system", args.lr, rewards, ends, start[0]), timers, rewards


def no_in_process_path() -> None:
    """Flows' calls to the embedded gateway over loopback TCP, as before #35 round 5."""
    from rllm.sdk import clients

    clients.serve_in_process = lambda url, handler: lambda: None  # type: ignore[assignment]


def per_rollout_clients() -> None:
    """The flows' clients as before #35 round 5: a pool (new TCP connection) and openai's platform
    lookup per rollout, sharing only the SSL context. The peer that --clients per-rollout runs."""
    import rllm_cookbook_say
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    from rllm.sdk import clients

    def async_openai(config: Any, role: str | None = None, **kwargs: Any) -> Any:
        http = DefaultAsyncHttpxClient(verify=clients._shared_ssl_context(), timeout=clients._TIMEOUT_S)
        return AsyncOpenAI(**clients._client_args(config, role, kwargs), http_client=http)

    clients.async_openai = async_openai  # type: ignore[assignment]
    rllm_cookbook_say.async_openai = async_openai  # type: ignore[assignment]


def run_direct(model: Path, args: argparse.Namespace, watch: SamplerWatch) -> ct.RunResult:
    from rllm.backends.tinker import TinkerBackend

    inner_train = TinkerBackend.train_step

    async def train_step(backend: Any, *a: Any, **k: Any) -> Any:
        try:
            return await inner_train(backend, *a, **k)
        finally:
            watch.mark()  # the direct side trains every step

    TinkerBackend.train_step = train_step  # type: ignore[method-assign]
    try:
        r = asyncio.run(ct.run_ours(model, args.lr, args))
    finally:
        TinkerBackend.train_step = inner_train  # type: ignore[method-assign]
    r.side = "direct"
    return r


def median_step_ms(r: ct.RunResult, ends: list[float] | None = None) -> float:
    return r.seconds_per_step * 1000


def print_breakdown(timers: Timers, skip: int) -> None:
    steps = timers.steps[skip:] or timers.steps
    counts = timers.step_counts[skip:] or timers.step_counts
    print(f"\nper-component breakdown of one `rllm train` step (median over {len(steps)} steps):")
    for label, _ in STEP_PARTS:
        values = [s.get(label, 0.0) * 1000 for s in steps]
        print(f"  {label:34s} {statistics.median(values):8.2f} ms/step")
    step_total = statistics.median(
        sum(s.get(label, 0.0) for label, _ in STEP_PARTS if not label.startswith("  ")) * 1000 for s in steps
    )
    print(f"  {'sum of the parts above':34s} {step_total:8.2f} ms/step")
    print("  within the rollouts (mean per rollout; the step's rollouts run concurrently):")
    for label, _ in ROLLOUT_PARTS:
        per = [s.get(label, 0.0) * 1000 / max(c.get(label, 0), 1) for s, c in zip(steps, counts, strict=True)]
        print(f"    {label:32s} {statistics.median(per):8.2f} ms/rollout")


def build_model(args: argparse.Namespace) -> Path:
    """The tiny model (1) and (2) train for ``args.seed``. With ``--same-task``: the one `rllm train
    say-single` builds (the cookbook's vocabulary, the same seed), which (3) is then pointed at
    (``args.model``), and (1)/(2) draw the cookbook's words (``ct.WORDS`` is what both read)."""
    from rllm.tiny import init_tiny_model

    path = Path(tempfile.mkdtemp(prefix="rllm-ws-")) / "model"
    if not args.same_task:
        return init_tiny_model(path, vocab_words=ct.WORDS, seed=args.seed)
    import rllm_cookbook_say

    from rllm.engine.training.launch import load_cookbook, task_vocabulary

    ct.WORDS = list(rllm_cookbook_say.WORDS)
    args.model = init_tiny_model(
        path, vocab_words=task_vocabulary(load_cookbook("say-single")), seed=args.seed
    )
    return args.model


def run_seeds(args: argparse.Namespace) -> None:
    """Steps to a 25-step mean of 0.9 per side and seed; seeds run one after another, the sides
    of a seed in the order given. Steps are seeded, so the machine's load does not move them."""
    sides = args.only or ["trl", "direct", "system"]
    python = ct.ensure_trl_env(args.trl_venv) if "trl" in sides else None
    steps: dict[str, list[int | None]] = {side: [] for side in sides}
    print(f"--same-task: {args.same_task}; (3) overrides: {args.system_set or 'none'}", flush=True)
    for seed in args.seeds:
        args.seed = seed
        model = build_model(args)
        for side in sides:
            load = os.getloadavg()[0]
            if side == "trl":
                assert python is not None
                r = ct.run_trl(python, model, args.lr, args)
            elif side == "direct":
                r = run_direct(model, args, SamplerWatch())
            else:
                from rllm.runtime import use_uvloop

                loop = "uvloop" if use_uvloop() else "asyncio"
                r, _, _ = run_system(args, breakdown=False, loop=loop)
            steps[side].append(r.steps_to_target)
            print(f"seed {seed} {side:6s} (load {load:.1f}): {ct.fmt(r)}", flush=True)
    print("\nsteps to a 25-step mean reward of 0.9 (—: not reached within --max-steps/--max-seconds)")
    print("side    " + "".join(f"{'seed ' + str(s):>9s}" for s in args.seeds) + "   median     mean")
    for side, values in steps.items():
        reached = [v for v in values if v is not None]
        cells = "".join(f"{v if v is not None else '—':>9}" for v in values)
        summary = (
            f"{statistics.median(reached):8.1f} {statistics.mean(reached):8.1f}"
            if len(reached) == len(values)
            else f"  ({len(reached)}/{len(values)} reached)"
        )
        print(f"{side:7s} {cells}  {summary}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, every side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="per side")
    parser.add_argument("--only", choices=["trl", "direct", "system"], action="append", default=None)
    parser.add_argument("--no-breakdown", action="store_true", help="run (3) without the wrappers")
    parser.add_argument("--trl-venv", type=Path, default=Path("/tmp/trlenv"))
    parser.add_argument(
        "--prefetch",
        choices=["config", "on", "off"],
        action="append",
        default=None,
        help="rollout.prefetch of (3); repeat to run (3) once per value, in turn (default: config)",
    )
    parser.add_argument(
        "--executor",
        choices=["local", "processes"],
        action="append",
        default=None,
        help="rollout.executor of (3), one flow worker; repeat to run each (with every --prefetch)",
    )
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        action="append",
        default=None,
        help="the event loop (3) runs on (default: as `rllm train`, uvloop unless RLLM_UVLOOP=0); repeat to run each",
    )
    parser.add_argument(
        "--flow-client",
        choices=["one-hop", "openai"],
        action="append",
        default=None,
        help="the flows' chat.completions.create in (3): in one hop to the in-process gateway"
        " (rllm.sdk.fast_chat, the default) or openai's own path (RLLM_FAST_CHAT=0); repeat to run each",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="run the (3) variants this many times, alternating"
    )
    parser.add_argument(
        "--clients",
        choices=["in-process", "tcp", "per-rollout"],
        default="in-process",
        help="the flows' openai clients: rllm.sdk.clients' (in memory to the embedded gateway), the"
        " same over loopback TCP, or those from before #35 round 5 (TCP, a platform lookup each)",
    )
    parser.add_argument(
        "--sampler-hop",
        choices=["config", "http", "in-process"],
        default="config",
        help="the embedded gateway -> local sampler hop: as the backend's config says (default), over"
        " HTTP, or whole calls handed over directly (backend.options.sampler_in_process)",
    )
    parser.add_argument(
        "--sampler-in-process",
        action="store_const",
        dest="sampler_hop",
        const="in-process",
        help="= --sampler-hop in-process",
    )
    parser.add_argument(
        "--flow-path",
        choices=["this", "before"],
        default="this",
        help="the flow's per-call path as it is, or as before #35 round 8 (openai's constructor per"
        " rollout, uuid4 idempotency keys, cumulative mode's chat render per call)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="run the chosen sides once per seed (model, sampling and data order all seeded) and"
        " print each side's steps to 0.9 per seed with the median and mean; no breakdown",
    )
    parser.add_argument(
        "--same-task",
        action="store_true",
        help="every side trains the tiny model `rllm train say-single` builds (its vocabulary and"
        " seed) on the cookbook's eight words, instead of (1)/(2) on cpu_training's word list",
    )
    parser.add_argument(
        "--set",
        dest="system_set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for (3), as on `rllm train`'s command line; repeatable",
    )
    parser.add_argument(
        "--client-timeout",
        type=float,
        default=None,
        help="seconds (2)'s openai client waits for a call and (3)'s rollout.deadline_s (default: 600 s"
        " and the config's; with --seeds 3600 s for both, so a run starved at nice 19 on a busy"
        " machine is not cut short: a cut rollout would change what (3) learns)",
    )
    args = parser.parse_args()
    args.model = None
    if args.client_timeout is None:
        args.client_timeout = 3600.0 if args.seeds is not None else 600.0
    if args.seeds is not None or "--client-timeout" in sys.argv:
        args.system_set = [f"rollout.deadline_s={args.client_timeout:g}", *args.system_set]
    if args.flow_path == "before":
        import flow_calls

        flow_calls.flow_path(before=True)
    if args.clients != "in-process":
        no_in_process_path()
    if args.clients == "per-rollout":
        per_rollout_clients()
    from rllm.runtime import use_uvloop

    if args.seeds is not None:
        run_seeds(args)
        return
    sides = args.only or ["trl", "direct", "system"]
    variants = [
        (p, e, lp, fc)
        # Default: the loop `rllm train` itself runs on (rllm.runtime.use_uvloop: RLLM_UVLOOP, else uvloop).
        for lp in (args.loop or ["uvloop" if use_uvloop() else "asyncio"])
        for e in (args.executor or ["local"])
        for p in (args.prefetch or ["config"])
        for fc in (args.flow_client or ["one-hop"])
    ] * args.repeat
    if "system" in sides:  # (3) once per variant, in turn
        at = sides.index("system")
        sides = [*sides[:at], *[f"system:{i}" for i in range(len(variants))], *sides[at + 1 :]]

    model = build_model(args)
    print(
        f"{args.prompts} tasks x {args.group} samples per step, lr {args.lr:g}, {args.threads} torch thread(s)"
    )
    results: dict[str, ct.RunResult] = {}
    timers: Timers | None = None
    cpu_lines: list[str] = []
    system_rewards: dict[str, list[float]] = {}
    for side in sides:
        print(f"[{side}] load average before: {os.getloadavg()[0]:.1f}", flush=True)
        flow_processes = side.startswith("system") and variants[int(side.split(":")[1])][1] == "processes"
        watch = SamplerWatch(children=flow_processes)
        if side == "trl":
            r = ct.run_trl(ct.ensure_trl_env(args.trl_venv), model, args.lr, args)
        elif side == "direct":
            r = run_direct(model, args, watch)
        else:
            prefetch, executor, loop, flow_client = variants[int(side.split(":")[1])]
            side = f"system[{executor}, prefetch {prefetch}, {loop}, {flow_client}]"
            # Read per call (flow processes inherit it): "openai" sends every call openai's way.
            os.environ["RLLM_FAST_CHAT"] = "0" if flow_client == "openai" else "1"
            r, timers, rewards = run_system(
                args, not args.no_breakdown, watch, prefetch=prefetch, executor=executor, loop=loop
            )
            side += f"#{sum(name.startswith(side) for name in results) + 1}"  # the repeat
            system_rewards[side] = rewards
        if side != "trl":
            cpu_lines.append(watch.summary(side))
        results[side] = r
        print(f"[{side}] load average after: {os.getloadavg()[0]:.1f}", flush=True)
        line = ct.fmt(r).replace("rllm ", "direct") if side == "direct" else ct.fmt(r)
        print(f"{side}: {line}" if side.startswith("system") else line, flush=True)
    for line in cpu_lines:
        print(line)
    for name, system in results.items():
        if not name.startswith("system"):
            continue
        if "direct" in results:
            ratio = system.seconds_per_step / results["direct"].seconds_per_step
            print(f"{name}/direct per step: {ratio:.2f}x (target <= 1.3)")
        if "trl" in results:
            if system.seconds_to_target is None or results["trl"].seconds_to_target is None:
                print(f"{name}/TRL wall time to 0.9: n/a (a side did not reach 0.9; raise --max-steps)")
            else:
                ratio = ct.time_to_target(system) / ct.time_to_target(results["trl"])
                print(f"{name}/TRL wall time to 0.9: {ratio:.2f}x (target <= 1.0)")
    if len(system_rewards) > 1:  # same seed: the same learning, step for step?
        (first, base), *others = system_rewards.items()
        for name, seq in others:
            n = min(len(seq), len(base))
            diff = next((i for i in range(n) if seq[i] != base[i]), None)
            same = (
                f"identical over the {n} steps both ran" if diff is None else f"differ from step {diff + 1}"
            )
            print(f"reward per step, {name} vs {first}: {same}")
    if timers is not None and timers.steps:
        print_breakdown(timers, skip=min(3, len(timers.steps) - 1))


if __name__ == "__main__":
    main()
