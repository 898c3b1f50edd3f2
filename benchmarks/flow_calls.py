"""The flows' LLM calls alone: per-rollout CPU of the flow's openai client + gateway + engine.

Rounds of 32 one-turn `say` rollouts (the cookbook's own flow, `rllm.sdk.clients.async_openai`)
through a RolloutEngine with its embedded gateway, against the loopback MockUpstream (no model:
what is left is the path between the flow and the model). The three ways a flow's client can
reach the gateway run in alternating rounds in ONE process, so load moves them alike:

  per-rollout  a new httpx pool per rollout (a new TCP connection) and openai's platform lookup
               per client: rllm.sdk.clients before #35 round 5
  tcp          rllm.sdk.clients over TCP: a pool per rollout, the platform looked up once
  pooled       one keep-alive pool per event loop shared by every rollout (TCP): the design
               measured and not kept
  in-process   rllm.sdk.clients with the engine's gateway served in memory (rllm.gateway.inprocess)

Printed: median process CPU and wall per round, and per rollout, for each.

    uv run --no-sync python benchmarks/flow_calls.py --rounds 30
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any


def variants() -> dict[str, Any]:
    """Each variant: a function that sets rllm.sdk.clients (and the cookbook) up for it."""
    import rllm_cookbook_say
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    from rllm.sdk import clients

    product, serve = clients.async_openai, clients.serve_in_process

    def old(config: Any, role: str | None = None, **kwargs: Any) -> Any:
        http = DefaultAsyncHttpxClient(verify=clients._shared_ssl_context(), timeout=clients._TIMEOUT_S)
        return AsyncOpenAI(**clients._client_args(config, role, kwargs), http_client=http)

    def pooled(config: Any, role: str | None = None, **kwargs: Any) -> Any:
        http = clients._loop_pool(asyncio.get_running_loop())  # (no in-process origin: all TCP)
        client = AsyncOpenAI(**clients._client_args(config, role, kwargs), http_client=http)
        clients._skip_platform_lookup(client)
        return client

    def use(make: Any, in_process: bool) -> Any:
        def apply() -> None:
            clients.async_openai = make
            rllm_cookbook_say.async_openai = make  # type: ignore[attr-defined]  # (the flow looks it up there)
            clients.serve_in_process = serve if in_process else (lambda url, handler: lambda: None)

        return apply

    return {
        "per-rollout": use(old, False),
        "tcp": use(product, False),
        "pooled": use(pooled, False),
        "in-process": use(product, True),
    }


async def main(args: argparse.Namespace) -> None:
    from rllm_cookbook_say import load_tasks, say_flow

    from rllm.engine.rollout_config import RolloutConfig
    from rllm.engine.rollout_engine import RolloutEngine
    from rllm.gateway import GatewayConfig
    from rllm.testing import MockUpstream
    from rllm.testing.scripted import say_back

    upstream = await MockUpstream(responder=say_back()).start()
    tasks = load_tasks("train", turns=1)[: args.tasks]
    config = RolloutConfig(n=args.group, concurrency=args.tasks * args.group, progress=False)
    setups = variants()
    cpu: dict[str, list[float]] = {name: [] for name in setups}
    wall: dict[str, list[float]] = {name: [] for name in setups}
    for r in range(args.rounds + 1):
        for name, apply in setups.items():
            apply()  # before the engine starts: it registers the in-process path (or not) at start
            cfg = GatewayConfig(upstreams=[upstream.url], health_interval_s=0)
            async with RolloutEngine(say_flow, None, config, gateway_config=cfg) as engine:
                t, c = time.perf_counter(), time.process_time()
                episodes = await engine.run(tasks)
                c, t = time.process_time() - c, time.perf_counter() - t
            assert all(ep.error is None for ep in episodes), [ep.error for ep in episodes][:3]
            if r:  # round 0 warms every path up
                cpu[name].append(c)
                wall[name].append(t)
    await upstream.stop()
    n = args.tasks * args.group
    base = statistics.median(cpu["per-rollout"])
    print(f"{args.rounds} rounds of {n} one-turn rollouts, medians:")
    for name in setups:
        mc, mw = statistics.median(cpu[name]), statistics.median(wall[name])
        print(
            f"  {name:12s} CPU {mc * 1000:7.1f} ms/round ({mc * 1e6 / n:6.0f} us/rollout)"
            f"   wall {mw * 1000:7.1f} ms/round   CPU vs per-rollout {mc / base:.2f}x"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    asyncio.run(main(parser.parse_args()))
