"""A weight sync under long calls: drain (rollout.partial = false) vs abort-and-continue (true).

On the tiny model's local sampler behind a cumulative-mode gateway, ``--calls`` chat calls of
``--max-tokens`` tokens (EOS ignored, so every call is long) start together; once the sampler has
run ``--after`` forward passes of them, the gateway pauses, the backend syncs (a real weight copy into
the sampler; no optimizer step is needed for timing), and the gateway resumes. Printed per mode (median over ``--rounds``): the pause
time (what the trainer waits before it can sync), the whole round's wall time, and for the abort
mode the tokens sampled before the sync (version 0) and after it. Both modes run in one process,
rounds alternating; the ratio is drain / abort.

    uv run --no-sync python benchmarks/partial_sync.py --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import cpu_training as ct  # (the toy model's words)


class _Counter:
    """Sets ``reached`` at the sampler's ``at``-th forward pass after arming (no hold)."""

    def __init__(self) -> None:
        self.calls, self.at = 0, 1 << 60
        self.reached = threading.Event()

    def arm(self, after: int) -> None:
        self.calls, self.at = 0, after
        self.reached.clear()

    def __call__(self, module: Any, args: Any) -> None:
        self.calls += 1
        if self.calls >= self.at:
            self.reached.set()


async def one_round(
    backend: Any, counter: _Counter, args: argparse.Namespace, partial: bool
) -> dict[str, float]:
    import openai

    from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer

    cfg = GatewayConfig(
        upstreams=backend.inference_urls(),
        tokenizer_path=backend.tokenizer_path(),
        tokenizer_mode="cumulative",
        partial_rollouts=partial,
        health_interval_s=0,
    )
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as admin:

        async def call(i: int) -> None:
            async with openai.AsyncOpenAI(
                base_url=admin.session_url(f"s{i}"), api_key="x", max_retries=0
            ) as c:
                await c.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": f"say: {ct.WORDS[i % len(ct.WORDS)]}"}],
                    max_tokens=args.max_tokens,
                    temperature=1.0,
                    extra_body={"ignore_eos": True},
                )

        started = time.perf_counter()
        counter.arm(args.after)
        calls = [asyncio.create_task(call(i)) for i in range(args.calls)]
        assert await asyncio.to_thread(counter.reached.wait, 600)
        t = time.perf_counter()
        await gw.pause(600)
        paused_s = time.perf_counter() - t
        gw.set_weight_version(await backend.sync_weights())
        gw.resume()
        await asyncio.gather(*calls)
        wall_s = time.perf_counter() - started
        before = after = 0
        for i in range(args.calls):
            (trace,) = await admin.get_traces(f"s{i}")
            assert len(trace.completion_ids or ()) == args.max_tokens
            for version, n in trace.metadata.get("version_spans", [[trace.weight_version, args.max_tokens]]):
                if version == gw.weight_version:
                    after += n
                else:
                    before += n
    return {"pause_s": paused_s, "wall_s": wall_s, "tokens_before": before, "tokens_after": after}


async def run(args: argparse.Namespace) -> None:
    from rllm.backends.tinker import TinkerBackend
    from rllm.tiny import init_tiny_model

    model = init_tiny_model(Path(tempfile.mkdtemp(prefix="rllm-ps-")) / "model", vocab_words=ct.WORDS, seed=0)
    backend = TinkerBackend(
        {"model": str(model), "torch_threads": args.threads, "seed": 0, "dtype": "float32"}
    )
    await backend.start()
    service: Any = backend.service
    engine: Any = service.engine  # the local service's SamplerEngine
    counter = _Counter()
    engine.model.register_forward_pre_hook(counter)
    figures: dict[str, list[dict[str, float]]] = {"drain": [], "abort": []}
    try:
        for _ in range(args.rounds):
            for mode in ("drain", "abort"):
                figures[mode].append(await one_round(backend, counter, args, partial=mode == "abort"))
    finally:
        await backend.close()
    med = {m: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for m, rows in figures.items()}
    print(
        f"{args.calls} calls x {args.max_tokens} tokens, sync after {args.after} forward passes, {args.rounds} rounds"
    )
    for mode, m in med.items():
        print(
            f"{mode:6s} pause {m['pause_s'] * 1000:8.1f} ms  round {m['wall_s']:6.2f} s  "
            f"tokens before/after the sync {m['tokens_before']:.0f}/{m['tokens_after']:.0f}"
        )
    print(
        f"drain / abort: pause x{med['drain']['pause_s'] / med['abort']['pause_s']:.1f}, "
        f"round x{med['drain']['wall_s'] / med['abort']['wall_s']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description="A weight sync under long calls: drain vs abort-and-continue."
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--after", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
