"""Sequence packing on the local tinker trainer: trained tokens per second, packed vs one sequence a row.

An SFT-like batch: sequences whose lengths are spread like chat data (most short, a few long,
log-uniform between ``--min-len`` and ``--max-len``), every token after the first trained with the
``cross_entropy`` loss. Both sides run LocalTrainer.train_step (forward, backward, AdamW step) on
copies of the same random-init Llama built here (``rllm.tiny.init_tiny_model``, nothing
downloaded), alternating packed and unpacked steps so load on the machine hits both alike.
Unpacked: one sequence a row, padded to the longest (micro_batch_tokens cuts the batch);
packed: ``pack_tokens = --max-len`` rows under the same micro_batch_tokens.
Also checked: the first step's loss is the same on both sides.

    uv run --no-sync python benchmarks/packing.py                 # tiny model (2 layers, hidden 128)
    uv run --no-sync python benchmarks/packing.py --hidden 256 --layers 4
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.local.model import load_policy
from rllm.backends.tinker.local.trainer import LocalTrainer
from rllm.tiny import init_tiny_model
from rllm.types import FloatArray, TokenArray, TrainSequence


def make_batch(n: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[TrainSequence]:
    rng = random.Random(seed)
    batch = []
    for _ in range(n):
        length = int(math.exp(rng.uniform(math.log(min_len), math.log(max_len))))
        ids = [rng.randrange(vocab) for _ in range(length)]
        batch.append(
            TrainSequence(
                input_ids=TokenArray(ids),
                loss_mask=FloatArray([0.0] + [1.0] * (length - 1)),
                advantages=FloatArray([0.0] * length),
                sampler_logprobs=FloatArray([0.0] * length),
            )
        )
    return batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per side (after one warm-up)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = init_tiny_model(
        Path(tempfile.mkdtemp()) / "model",
        vocab_words=[f"w{i}" for i in range(200)],
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.hidden // 64,
        intermediate_size=2 * args.hidden,
        max_positions=max(1024, args.max_len),
    )
    device = torch.device("cpu")
    base = load_policy(TinkerBackendConfig(model=str(path), dtype="float32"), device, torch.float32)
    vocab = int(base.get_output_embeddings().weight.shape[0])  # pyright: ignore[reportOptionalMemberAccess]
    batch = make_batch(args.sequences, args.min_len, args.max_len, vocab, seed=0)
    tokens = sum(len(s.input_ids) for s in batch)
    padded = len(batch) * max(len(s.input_ids) for s in batch)
    algo = AlgorithmConfig(loss="cross_entropy", tis="none")
    sides = {
        "unpacked": {"micro_batch_tokens": args.micro_batch_tokens},
        "packed": {"micro_batch_tokens": args.micro_batch_tokens, "pack_tokens": args.max_len},
    }
    trainers = {
        name: LocalTrainer(
            copy.deepcopy(base), TinkerBackendConfig(model=str(path), learning_rate=1e-4, **opts), device, 0
        )
        for name, opts in sides.items()
    }
    first_loss = {
        name: trainer.train_step(copy.deepcopy(batch), algo)["loss"] for name, trainer in trainers.items()
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.steps):
        for name, trainer in trainers.items():
            t0 = time.perf_counter()
            trainer.train_step(copy.deepcopy(batch), algo)
            times[name].append(time.perf_counter() - t0)
    print(
        f"model: hidden {args.hidden}, {args.layers} layers; batch: {len(batch)} sequences, {tokens} tokens "
        f"(lengths {args.min_len}-{args.max_len} log-uniform; one-a-row padding would be {padded} tokens)"
    )
    rate = {}
    for name in sides:
        median = statistics.median(times[name])
        rate[name] = tokens / median
        print(
            f"{name:9s} median step {median:.3f} s  {rate[name]:,.0f} tokens/s  first loss {first_loss[name]:.6f}"
        )
    print(f"packed / unpacked tokens/s: {rate['packed'] / rate['unpacked']:.2f}x")
    print(f"first-step loss difference: {abs(first_loss['packed'] - first_loss['unpacked']):.2e}")


if __name__ == "__main__":
    main()
