"""A command's start-up: wall and CPU seconds from `rllm ...` to its first training step, against
the floor of the same run, a bare `python -c 'import torch, transformers'`, and the floor of a
process that builds a model (``floor+model``: the import of a transformers model class).

The commands are the ones `benchmarks/distill_vs_rl.py` (b) runs, on the tiny model and the CPU:
  train    `rllm train say-single` (the tiny model built on the spot, one flow process)
  sft      `rllm sft CHATS --model M` (the teacher-style SFT of (b), 32 chats)
  init     `rllm train say-single --init-from SFT_RUN` (RL from that SFT checkpoint)
  main     `rllm train say` with the README main job's own defaults (two flow processes,
           TensorBoard, a validation pass before step 1), for the user's first command.
With ``--compare`` each command also runs, alternating in the same repeat, with the start-up
fast paths turned off (``RLLM_NO_EARLY_WORKERS=1``: flow processes spawn after the model load;
``RLLM_AUTO_TOKENIZER=1``: tokenizers through ``AutoTokenizer``), and the ratio is printed.
Each command runs to the end of its first step (``total_steps=1``). Its start-up is the wall time
from the command's start to its first metrics row less that step's own time (``time/rollout_s`` +
``time/train_s``), as distill_vs_rl.py reports it; ``cpu_s`` is the CPU time of the command's
whole process tree (user + system, its flow workers included) to the end of the run. The floor's
figures are the same two. Bytecode: a user's install has it, so the variable that turns it off on
the shared dev machine is dropped for every process here (the first repeat writes what is missing).

    uv run --no-sync python benchmarks/cli_startup.py --repeats 3 [--compare]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "rocket"]
QUIET = ["progress=false", "plot=false", "tensorboard=false", "val_every=0", "rollout.workers=1"]
FLOOR = [sys.executable, "-c", "import torch, transformers"]
# What a process that builds a transformers model cannot skip: the model class pulls
# transformers.generation -> masking_utils -> torch._dynamo + inductor, sympy, accelerate.
MODEL_FLOOR = [sys.executable, "-c", "from transformers.models.llama.modeling_llama import LlamaForCausalLM"]
FAST_PATHS_OFF = {"RLLM_NO_EARLY_WORKERS": "1", "RLLM_AUTO_TOKENIZER": "1"}


def rllm(*args: str) -> list[str]:
    return [sys.executable, "-m", "rllm.cli.main", *args]


def first_step(run: Path) -> dict[str, Any] | None:
    """The run's first training-step row (a line still being written is skipped)."""
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "time/train_s" in row:
            return row
    return None


def timed(cmd: list[str], cwd: Path, env: dict[str, str], run: Path | None) -> dict[str, float]:
    """Run ``cmd`` to its end; wall seconds to its first step's row (``run``) or to its end, and
    the CPU seconds of its process tree (children are reaped, so RUSAGE_CHILDREN holds them)."""
    if run is not None:
        shutil.rmtree(run, ignore_errors=True)
    before = os.times()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen: float | None = None
    row: dict[str, Any] | None = None
    while proc.poll() is None:
        if run is not None and seen is None and (row := first_step(run)) is not None:
            seen = time.perf_counter() - started
        time.sleep(0.05)  # a benchmark's poll of the run's metrics file, not a test's wait
    wall = time.perf_counter() - started
    after = os.times()
    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{out[-3000:]}")
    if run is not None and seen is None:  # the row landed between the last poll and the exit
        row, seen = first_step(run), wall
    step = sum(float(row.get(k, 0.0)) for k in ("time/rollout_s", "time/train_s")) if row else 0.0
    cpu = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    return {"startup_s": (seen if seen is not None else wall) - step, "first_step_s": step,
            "wall_s": wall, "cpu_s": cpu}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--commands", nargs="+", default=["train", "sft", "init", "main"])
    parser.add_argument("--workdir", default="/tmp/rllm-cli-startup")
    parser.add_argument("--compare", action="store_true", help="also run each with the fast paths off")
    opts = parser.parse_args()
    work = Path(opts.workdir)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RLLM_HOME": str(work / "home")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's install has bytecode (see the docstring)
    chats = work / "chats.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"say: {w}"}, {"role": "assistant", "content": w}]}
            for w in WORDS]  # fmt: skip
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
    model = work / "model"
    if not (model / "config.json").is_file():  # the fresh student every command starts from
        subprocess.run(rllm("model", "init-tiny", str(model), "--cookbook", "say"), env=env, check=True,
                       capture_output=True)  # fmt: skip
    sft_args = ["epochs=1", "total_steps=1", "batch_tokens=128", "progress=false"]
    commands: dict[str, tuple[list[str], Path | None]] = {
        "floor": (FLOOR, None),
        "floor+model": (MODEL_FLOOR, None),
        "train": (rllm("train", "say-single", "--out", "train", "--overwrite", f"backend.options.model={model}",
                       "total_steps=1", *QUIET), work / "train"),
        "sft": (rllm("sft", str(chats), "--model", str(model), "--out", "sft", *sft_args), work / "sft"),
        "init": (rllm("train", "say-single", "--out", "init", "--overwrite", "--init-from", "sft",
                      f"backend.options.model={model}", "total_steps=1", *QUIET), work / "init"),
        "main": (rllm("train", "say", "--out", "main", "--overwrite", "total_steps=1", "plot=false",
                      "progress=false"), work / "main"),
    }  # fmt: skip
    names = ["floor", "floor+model", *[c for c in opts.commands if not c.startswith("floor")]]
    if "init" in names and "sft" not in names:
        names.insert(names.index("init"), "sft")  # init starts from sft's checkpoint
    variants = {"": env, " (off)": {**env, **FAST_PATHS_OFF}} if opts.compare else {"": env}
    results: dict[str, list[dict[str, float]]] = {
        name + v: [] for name in names for v in variants if not name.startswith("floor") or not v
    }
    for repeat in range(opts.repeats + 1):  # repeat 0 writes the bytecode and is not counted
        for name in names:
            cmd, run = commands[name]
            # alternate which variant goes first, so neither always follows the other
            for variant in sorted(variants, reverse=bool(repeat % 2)):
                if name + variant not in results:  # the floors run once per repeat
                    continue
                load = os.getloadavg()[0]
                figures = {**timed(cmd, work, variants[variant], run), "load_1m": load}
                if repeat:
                    results[name + variant].append(figures)
                    print(json.dumps({"command": name + variant, "repeat": repeat, **figures}), flush=True)
    floor_wall = statistics.median(r["startup_s"] for r in results["floor"])
    floor_cpu = statistics.median(r["cpu_s"] for r in results["floor"])
    print(f"\nmedians of {opts.repeats} (load {min(r['load_1m'] for v in results.values() for r in v):.1f}"
          f"-{max(r['load_1m'] for v in results.values() for r in v):.1f})")  # fmt: skip
    print(f"{'command':14} {'start-up s':>10} {'x floor':>8} {'CPU s':>7} {'x floor':>8} {'1st step s':>10}")
    for name, runs in results.items():
        wall = statistics.median(r["startup_s"] for r in runs)
        cpu = statistics.median(r["cpu_s"] for r in runs)
        step = statistics.median(r["first_step_s"] for r in runs)
        print(
            f"{name:14} {wall:10.1f} {wall / floor_wall:8.2f} {cpu:7.1f} {cpu / floor_cpu:8.2f} {step:10.1f}"
        )
    if opts.compare:
        print("\nfast paths on / off (medians): start-up wall, CPU")
        for name in names:
            if name.startswith("floor"):
                continue
            on, off = results[name], results[name + " (off)"]
            ratio = {k: statistics.median(r[k] for r in on) / statistics.median(r[k] for r in off)
                     for k in ("startup_s", "cpu_s")}  # fmt: skip
            print(f"{name:8} {ratio['startup_s']:6.2f} {ratio['cpu_s']:6.2f}")


if __name__ == "__main__":
    main()
