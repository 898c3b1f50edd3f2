"""Local sampler: a step's 32 samples as 32 concurrent n=1 requests vs 4 requests with n=8.

`rllm train` sends one n=1 request per rollout (each flow asks for its own sample), the backend
driven directly sends n=group per task. Both go to the same local sampler server over loopback
HTTP with the real openai client, on the whole-system benchmark's toy model and shape (prompts
"say: WORD", at most 4 tokens, temperature 1). Rounds of the two shapes alternate; printed: the
median wall and process CPU time per round of each, their ratio (n=1 / n=group), and the
sampler's forward passes, batches and joined rows per round.

    uv run --no-sync python benchmarks/sampler_batching.py --rounds 40
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import cpu_training as ct  # (the toy model's words)


async def one_round(client: Any, words: list[str], n: int) -> None:
    per_word = 32 // len(words)
    calls = [
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"say: {w}"}],
            n=n,
            max_tokens=4,
            temperature=1.0,
            logprobs=True,
            extra_body={"return_token_ids": True},
        )
        for w in words
        for _ in range(per_word // n)
    ]
    await asyncio.gather(*calls)


async def run(args: argparse.Namespace) -> None:
    import openai

    from rllm.backends.tinker import TinkerBackend
    from rllm.tiny import init_tiny_model

    model = init_tiny_model(Path(tempfile.mkdtemp(prefix="rllm-sb-")) / "model", vocab_words=ct.WORDS, seed=0)
    backend = TinkerBackend({"model": str(model), "torch_threads": args.threads, "seed": 0})
    await backend.start()
    service: Any = backend.service
    engine: Any = service.engine  # the local service's SamplerEngine
    client = openai.AsyncOpenAI(base_url=backend.inference_urls()[0], api_key="local", max_retries=0)
    words = list(ct.WORDS[:4])
    figures: dict[str, list[list[float]]] = {"n=1 x 32": [], "n=8 x 4": []}
    try:
        for r in range(args.rounds + 2):
            for label, n in (("n=1 x 32", 1), ("n=8 x 4", 8)):
                counters = [getattr(engine, k, 0) for k in ("forward_passes", "batches_run", "rows_joined")]
                wall, cpu = time.perf_counter(), time.process_time()
                await one_round(client, words, n)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                after = [getattr(engine, k, 0) for k in ("forward_passes", "batches_run", "rows_joined")]
                if r >= 2:  # warm-up rounds
                    figures[label].append([wall, cpu, *(b - a for a, b in zip(counters, after, strict=True))])
    finally:
        await client.close()
        await backend.close()
    med: dict[str, list[float]] = {
        label: [statistics.median(row[i] for row in rows) for i in range(5)]
        for label, rows in figures.items()
    }
    for label, m in med.items():
        print(
            f"{label:9s} wall {m[0] * 1000:6.1f} ms  CPU {m[1] * 1000:6.1f} ms per round;"
            f" sampler: {m[2]:.0f} forward passes, {m[3]:.0f} batches, {m[4]:.0f} joined rows"
        )
    one, group = med["n=1 x 32"], med["n=8 x 4"]
    print(f"n=1 / n=group: wall {one[0] / group[0]:.2f}x, CPU {one[1] / group[1]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
