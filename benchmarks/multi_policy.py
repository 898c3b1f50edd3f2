"""Per-step cost of two policies vs one on the same rollouts (local tinker service, tiny model);
the peer is one policy, measured in the same run, steps alternating. Target (#53): ≤ 1.3×.

One policy: train_step on the whole batch + sync_weights. Two policies: the batch's first half
trains the default adapter, the second half the judge's (train_policy_step each) + sync_weights
(every adapter). Steps alternate between the two backends; the median ratio is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.engine.training.policies import PolicySection
from rllm.tiny import init_tiny_model
from rllm.types import FloatArray, TokenArray, TrainSequence


def batch(n: int, length: int, vocab: int, seed: int) -> list[TrainSequence]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = length // 2
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        out.append(
            TrainSequence(
                input_ids=TokenArray(ids),
                loss_mask=FloatArray([0.0] * prompt + [1.0] * (length - prompt)),
                advantages=FloatArray([rng.choice([-1.0, 1.0])] * length),
                sampler_logprobs=FloatArray([0.0] * length),
            )
        )
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()
    algo = AlgorithmConfig(loss="ppo_clip")
    with tempfile.TemporaryDirectory() as tmp:
        model = init_tiny_model(Path(tmp) / "m", seed=0)
        options = {"model": str(model), "dtype": "float32", "torch_threads": 2, "lora": {"rank": args.rank}}
        one = TinkerBackend(options)
        two = TinkerBackend(options)
        two.use_policies({"judge": PolicySection()})
        await one.start()
        await two.start()
        vocab = 100
        ratios, t_one, t_two = [], [], []
        for step in range(args.steps + 1):
            seqs = batch(args.sequences, args.length, vocab, step)
            started = time.perf_counter()
            await one.train_step(seqs, algo)
            await one.sync_weights()
            a = time.perf_counter() - started
            seqs = batch(args.sequences, args.length, vocab, step)
            half = len(seqs) // 2
            started = time.perf_counter()
            await two.train_policy_step("default", seqs[:half], algo)
            await two.train_policy_step("judge", seqs[half:], algo)
            await two.sync_weights()
            b = time.perf_counter() - started
            if step:  # the first step plans memory and warms up
                t_one.append(a)
                t_two.append(b)
                ratios.append(b / a)
        await one.close()
        await two.close()
    print(f"one policy:   {statistics.median(t_one) * 1000:.1f} ms/step (median of {len(t_one)})")
    print(f"two policies: {statistics.median(t_two) * 1000:.1f} ms/step")
    print(f"ratio two/one: {statistics.median(ratios):.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    asyncio.run(main())
