"""CPU training benchmark: rLLM's local tinker backend vs TRL's GRPOTrainer, in one run.

Task (single-turn toy): prompts "say: X" over 8 words; reward 1 when the reply starts with X.
Both sides train the same tiny random Llama (rllm.backends.tinker.tiny) with GRPO: 8 completions
per prompt, 4 prompts per step, group-normalised advantages, PPO clip 0.2, token-mean loss,
no KL, constant learning rate, AdamW, grad clip 1.0, temperature 1, at most 4 new tokens.

Reported for each side: seconds per step, steps and wall time until the mean reward over a
25-step window reaches 0.9, and the final reward (mean of the last 25 steps).
  (a) identical config (same learning rate) -> target: ours <= 1.0x TRL's wall time
  (b) each side at its best learning rate from a small sweep -> target: ours <= 0.5x TRL's best

Our side drives the backend directly: the OpenAI-compatible sampler server over loopback HTTP
(the real `openai` client) + train_step + sync_weights, as the Trainer would. TRL runs as a
subprocess in a throwaway venv (default /tmp/trlenv; created on first use with `uv`).

    uv run --no-sync python benchmarks/cpu_training.py                 # (a) at lr 1e-4
    uv run --no-sync python benchmarks/cpu_training.py --sweep         # (a) and (b)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path

WORDS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "plum"]
WINDOW = 25
TARGET = 0.9


@dataclass
class RunResult:
    side: str
    lr: float
    steps: int  # steps run
    steps_to_target: int | None
    seconds_to_target: float | None
    seconds_per_step: float
    final_reward: float
    wall_s: float


def summarise(side: str, lr: float, rewards: list[float], step_ends: list[float], start: float) -> RunResult:
    """Find the first step whose trailing 25-step mean reaches the target."""
    hit = None
    for i in range(WINDOW - 1, len(rewards)):
        if sum(rewards[i - WINDOW + 1 : i + 1]) / WINDOW >= TARGET:
            hit = i
            break
    last = rewards[-WINDOW:] or [0.0]
    wall = (step_ends[-1] - start) if step_ends else 0.0
    return RunResult(
        side=side,
        lr=lr,
        steps=len(rewards),
        steps_to_target=None if hit is None else hit + 1,
        seconds_to_target=None if hit is None else step_ends[hit] - start,
        seconds_per_step=wall / max(len(rewards), 1),
        final_reward=sum(last) / len(last),
        wall_s=wall,
    )


def reward(word: str, text: str) -> float:
    parts = text.strip().split()
    return 1.0 if parts and parts[0] == word else 0.0


# --------------------------------------------------------------------------------------- ours
async def run_ours(model: Path, lr: float, args: argparse.Namespace) -> RunResult:
    import numpy as np
    import openai

    from rllm.algos.config import AlgorithmConfig
    from rllm.backends.tinker import TinkerBackend
    from rllm.types import FloatArray, TokenArray, TrainSequence

    backend = TinkerBackend(
        {
            "model": str(model),
            "learning_rate": lr,
            "torch_threads": args.threads,
            "seed": args.seed,
            "grad_clip": 1.0,
        }
    )
    algo = AlgorithmConfig(
        loss="ppo_clip", clip_low=0.2, clip_high=0.2, aggregation="token-mean", kl_coef=0.0
    )
    backend.validate(algo)
    await backend.start()
    client = openai.AsyncOpenAI(
        base_url=backend.inference_urls()[0],
        api_key="local",
        max_retries=0,
        timeout=getattr(args, "client_timeout", 600.0),
    )
    rng = np.random.default_rng(args.seed)
    rewards: list[float] = []
    ends: list[float] = []
    start = time.perf_counter()
    try:
        for _ in range(args.max_steps):
            words = [WORDS[i] for i in rng.integers(0, len(WORDS), args.prompts)]
            responses = await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model="tiny",
                        messages=[{"role": "user", "content": f"say: {w}"}],
                        n=args.group,
                        max_tokens=4,
                        temperature=1.0,
                        logprobs=True,
                        extra_body={"return_token_ids": True},
                    )
                    for w in words
                )
            )
            batch: list[TrainSequence] = []
            step_rewards: list[float] = []
            for word, response in zip(words, responses, strict=True):
                body = response.model_dump()
                prompt = body["prompt_token_ids"]
                scores = np.array([reward(word, c["message"]["content"] or "") for c in body["choices"]])
                step_rewards += scores.tolist()
                advantages = (scores - scores.mean()) / (scores.std() + 1e-4)  # like TRL: std + 1e-4
                for choice, advantage in zip(body["choices"], advantages, strict=True):
                    ids = choice["token_ids"]
                    batch.append(
                        TrainSequence(
                            input_ids=TokenArray(prompt + ids),
                            loss_mask=FloatArray([0.0] * len(prompt) + [1.0] * len(ids)),
                            advantages=FloatArray([float(advantage)] * (len(prompt) + len(ids))),
                            sampler_logprobs=FloatArray(
                                [0.0] * len(prompt) + [c["logprob"] for c in choice["logprobs"]["content"]]
                            ),
                        )
                    )
            await backend.train_step(batch, algo)
            await backend.sync_weights()
            rewards.append(float(np.mean(step_rewards)))
            ends.append(time.perf_counter())
            if _reached(rewards) or ends[-1] - start > args.max_seconds:
                break
    finally:
        await client.close()
        await backend.close()
    return summarise("rllm", lr, rewards, ends, start)


def _reached(rewards: list[float]) -> bool:
    return len(rewards) >= WINDOW and sum(rewards[-WINDOW:]) / WINDOW >= TARGET


# ---------------------------------------------------------------------------------------- TRL
TRL_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg = json.loads(sys.argv[1])
    torch.set_num_threads(cfg["threads"])
    words = cfg["words"]
    import random
    rng = random.Random(cfg["seed"])
    rows = [{"prompt": [{"role": "user", "content": "say: " + w}], "word": w} for w in (rng.choice(words) for _ in range(cfg["prompts"] * cfg["max_steps"]))]

    def reward(completions, word, **kwargs):
        out = []
        for completion, w in zip(completions, word):
            parts = completion[0]["content"].strip().split()
            out.append(1.0 if parts and parts[0] == w else 0.0)
        return out

    class Stop(TrainerCallback):
        def __init__(self):
            self.rewards, self.ends, self.start = [], [], None
        def on_train_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                self.rewards.append(float(logs["reward"]))
                self.ends.append(time.perf_counter())
                w = cfg["window"]
                if len(self.rewards) >= w and sum(self.rewards[-w:]) / w >= cfg["target"]:
                    control.should_training_stop = True
                if self.ends[-1] - self.start > cfg["max_seconds"]:
                    control.should_training_stop = True

    tokenizer = AutoTokenizer.from_pretrained(cfg["model"])
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    args = GRPOConfig(
        output_dir=cfg["out"], learning_rate=cfg["lr"], lr_scheduler_type="constant", warmup_steps=0,
        per_device_train_batch_size=cfg["prompts"] * cfg["group"], num_generations=cfg["group"],
        max_completion_length=4, temperature=1.0, beta=0.0, epsilon=0.2, loss_type="dapo",
        scale_rewards="group", max_grad_norm=1.0, weight_decay=0.0, max_steps=cfg["max_steps"],
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
        seed=cfg["seed"], dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
    )
    stop = Stop()
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward,
                          args=args, train_dataset=Dataset.from_list(rows), callbacks=[stop])
    trainer.train()
    print("RESULT " + json.dumps({"rewards": stop.rewards, "ends": [e - stop.start for e in stop.ends]}))
    """
)


def ensure_trl_env(venv: Path) -> Path:
    """A throwaway venv with TRL; torch/transformers come from this workspace's venv (a .pth
    file), so nothing large is downloaded and both sides run the same torch build."""
    python = venv / "bin" / "python"
    if (
        python.exists()
        and subprocess.run([python, "-c", "import trl, datasets"], capture_output=True).returncode == 0
    ):
        return python
    subprocess.run(["uv", "venv", "--clear", str(venv), "--python", "3.11", "-q"], check=True)
    site = venv / "lib" / "python3.11" / "site-packages"
    workspace_site = next(Path(p) for p in sys.path if p.endswith("site-packages") and ".venv" in p)
    (site / "zz_workspace.pth").write_text(str(workspace_site) + "\n")
    extra = [
        "trl",
        "datasets",
        "pyarrow",
        "dill",
        "multiprocess",
        "xxhash",
        "pandas",
        "python-dateutil",
        "pytz",
        "tzdata",
    ]
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    subprocess.run(["uv", "pip", "install", "-q", "--no-deps", *extra], check=True, env=env)
    return python


def run_trl(python: Path, model: Path, lr: float, args: argparse.Namespace) -> RunResult:
    with tempfile.TemporaryDirectory() as out:
        script = Path(out) / "trl_grpo.py"
        script.write_text(TRL_SCRIPT)
        cfg = {
            "model": str(model), "lr": lr, "threads": args.threads, "seed": args.seed, "words": WORDS,
            "prompts": args.prompts, "group": args.group, "max_steps": args.max_steps, "out": out,
            "window": WINDOW, "target": TARGET, "max_seconds": args.max_seconds,
        }  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
        done = subprocess.run([python, str(script), json.dumps(cfg)], capture_output=True, text=True, env=env)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"TRL run failed (rc={done.returncode}):\n{done.stderr[-3000:]}")
        data = json.loads(line.removeprefix("RESULT "))
    return summarise("trl", lr, data["rewards"], data["ends"], 0.0)


# --------------------------------------------------------------------------------------- main
def fmt(r: RunResult) -> str:
    hit = f"{r.steps_to_target} steps / {r.seconds_to_target:.1f} s" if r.steps_to_target else "not reached"
    return (
        f"{r.side:5s} lr={r.lr:<7g} {r.seconds_per_step * 1000:6.1f} ms/step  to 0.9: {hit:24s} "
        f"final reward {r.final_reward:.3f}  ({r.steps} steps, {r.wall_s:.1f} s)"
    )


def time_to_target(r: RunResult) -> float:
    return r.seconds_to_target if r.seconds_to_target is not None else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--lr", type=float, default=1e-4, help="learning rate of the identical-config run (a)"
    )
    parser.add_argument("--sweep", action="store_true", help="also run (b): a learning-rate sweep per side")
    parser.add_argument("--ours-lrs", type=float, nargs="+", default=[3e-4, 1e-3, 2e-3])
    parser.add_argument("--trl-lrs", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--max-seconds", type=float, default=240.0, help="per run")
    parser.add_argument("--only", choices=["rllm", "trl"], default=None, help="run one side only")
    parser.add_argument(
        "--client-timeout",
        type=float,
        default=600.0,
        help="seconds our side's openai client waits for a sampler call (raise it at nice 19 on a busy machine)",
    )
    parser.add_argument("--trl-venv", type=Path, default=Path("/tmp/trlenv"))
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    args = parser.parse_args()

    from rllm.tiny import init_tiny_model

    work = Path(tempfile.mkdtemp(prefix="rllm-bench-"))
    model = init_tiny_model(work / "model", vocab_words=WORDS, seed=args.seed)
    params = sum(
        v.numel()
        for v in __import__("safetensors.torch").torch.load_file(str(model / "model.safetensors")).values()
    )
    print(
        f"tiny model: {params:,} parameters; {args.prompts} prompts x {args.group} completions per step; {args.threads} torch thread(s)"
    )
    python = ensure_trl_env(args.trl_venv) if args.only != "rllm" else None

    results: list[RunResult] = []

    def run(side: str, lr: float) -> RunResult:
        r = asyncio.run(run_ours(model, lr, args)) if side == "rllm" else run_trl(python, model, lr, args)
        print(fmt(r), flush=True)
        results.append(r)
        return r

    sides = [args.only] if args.only else ["rllm", "trl"]
    print(f"(a) identical config, lr={args.lr:g}")
    same = {side: run(side, args.lr) for side in sides}
    if len(same) == 2:
        ratio = time_to_target(same["rllm"]) / time_to_target(same["trl"])
        print(f"(a) wall-time ratio ours/TRL to 0.9: {ratio:.2f}x (target <= 1.0); "
              f"s/step ratio {same['rllm'].seconds_per_step / same['trl'].seconds_per_step:.2f}x")  # fmt: skip
    if args.sweep:
        print("(b) learning-rate sweep")
        best = {}
        for side in sides:
            lrs = args.ours_lrs if side == "rllm" else args.trl_lrs
            runs = [same[side] if lr == args.lr else run(side, lr) for lr in lrs] + [same[side]]
            best[side] = min(runs, key=time_to_target)
            print(f"    best {side}: {fmt(best[side])}")
        if len(best) == 2:
            ratio = time_to_target(best["rllm"]) / time_to_target(best["trl"])
            print(f"(b) best-vs-best wall-time ratio ours/TRL: {ratio:.2f}x (target <= 0.5)")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
