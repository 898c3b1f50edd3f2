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

With ``--upstream local`` the upstream is the real local sampler (the tiny model, in this process
as the embedded backend runs it) instead of the MockUpstream, and three designs alternate, the
flows reaching the gateway in process either way:

  sampler-http        the gateway POSTs each call to the sampler's HTTP server
  sampler-in-process  the gateway hands each whole call to the sampler directly
                      (rllm.runtime.inprocess_upstreams)
  in-process-before   the same, with the sampler taking each call as round 6 did: straight to
                      its queue (a batch starts with the first calls, later ones join it a
                      forward pass each) and answered through its own wrap_future

With ``--compare flow-path`` (#35 round 8; ``--upstream local``, best with ``--mode cumulative``
as `rllm train` runs its gateway) two designs alternate, flows and sampler in process either way:

  before (round 7)  openai's constructor per rollout (and its uuid4 idempotency key per call),
                    a chat template render per call
  client only       the flow's client as this round makes it, the render as before
  render only       the render as this round keeps it, the client as before
  this round        a copied client, a counter key, renders kept by exact inputs

With ``--compare call-path`` (#35 round 11; ``--upstream local --mode cumulative``):

  before (round 10)  each answer parsed by openai's ``construct``, each call's route (handler,
                     path, headers) worked out from the client, each copy's base URL parsed
  this round         a well-formed answer parsed by strict validation (the same object), the
                     route remembered since ``async_openai`` copied the client, the base URL
                     made from its origin's parse

The variants take turns going first, round by round. The load average is printed before and
after (the figures depend on it).

    uv run --no-sync python benchmarks/flow_calls.py --rounds 30
    uv run --no-sync python benchmarks/flow_calls.py --rounds 15 --upstream local
    uv run --no-sync python benchmarks/flow_calls.py --rounds 20 --upstream local --mode cumulative \
        --compare flow-path
    uv run --no-sync python benchmarks/flow_calls.py --rounds 60 --upstream local --mode cumulative \
        --compare call-path
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
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


SAMPLERS: list[Any] = []  # the local sampler's engine, for its forward passes per round
TOKENIZERS: list[str] = []  # the local sampler's tokenizer directory (cumulative mode)


def sampler_variants() -> dict[str, Any]:
    """The gateway -> local sampler hop over HTTP or in process (flows in process either way),
    with the sampler's adaptive arrival gap or a fixed one."""
    from rllm.runtime import inprocess_upstreams

    served = inprocess_upstreams._SERVED

    def use(in_process: bool, before: bool = False) -> Any:
        def apply() -> None:
            variants()["in-process"]()
            inprocess_upstreams._SERVED = served if in_process else {}
            engine = SAMPLERS[0]
            engine.__dict__.pop("submit_async", None)
            if before:
                engine.submit_async = lambda request: asyncio.wrap_future(engine.submit(request))

        return apply

    return {
        "sampler-http": use(False),
        "sampler-in-process": use(True),
        "in-process-before": use(True, before=True),
    }


def flow_path(before: bool, render_before: bool | None = None) -> None:
    """#35 round 8's changes to the flow's per-call path off (``before``: as in round 7) or on;
    ``render_before`` sets the gateway's render apart (default: as ``before``). Also used by
    whole_system.py --flow-path."""
    import rllm_cookbook_say
    from openai import AsyncOpenAI

    from rllm.gateway.cumulative import TokenBridge
    from rllm.sdk import clients

    product = PRODUCT.setdefault("flow-path", (clients.async_openai, TokenBridge.render))

    def old_client(config: Any, role: str | None = None, **kwargs: Any) -> Any:
        # round 7's async_openai: openai's constructor (and its uuid4 idempotency key) per rollout
        args = clients._client_args(config, role, kwargs)
        loop = clients._served_loop(args["base_url"])
        http = clients._loop_pool(loop) if loop is not None else clients._own_async_http()
        client = AsyncOpenAI(**args, http_client=http)
        clients._skip_platform_lookup(client)
        return client

    make = old_client if before else product[0]
    clients.async_openai = make
    rllm_cookbook_say.async_openai = make  # type: ignore[attr-defined]  # (the flow looks it up there)
    render_before = before if render_before is None else render_before
    TokenBridge.render = TokenBridge._render if render_before else product[1]  # type: ignore[method-assign]


PRODUCT: dict[str, Any] = {}  # the product's functions, kept before flow_path patches them


def flow_path_variants() -> dict[str, Any]:
    """#35 round 8: the flow's per-call path as it was, and as it is (flows and the sampler in
    process either way, the gateway in cumulative mode as `rllm train` runs it)."""

    def use(before: bool, render_before: bool) -> Any:
        def apply() -> None:
            sampler_variants()["sampler-in-process"]()
            flow_path(before, render_before)

        return apply

    return {
        "before (round 7)": use(True, True),
        "client only": use(False, True),
        "render only": use(True, False),
        "this round": use(False, False),
    }


def call_path_variants() -> dict[str, Any]:
    """#35 round 11: the flow's per-call path as round 10 left it, and as it is (flows and the
    sampler in process either way, the gateway as `rllm train` runs it: ``--mode cumulative``)."""
    from rllm.sdk import clients, fast_chat

    product = PRODUCT.setdefault(
        "call-path", (fast_chat._validated, clients.in_process_target, clients._plain_url)
    )

    def use(before: bool) -> Any:
        def apply() -> None:
            sampler_variants()["sampler-in-process"]()
            flow_path(before=False)
            # Round 10: openai's construct for every answer, the route and headers worked out
            # from the client (two URL parses, openai's header properties) on every call.
            fast_chat._validated = (lambda content: None) if before else product[0]  # type: ignore[assignment]
            clients.in_process_target = (lambda client: None) if before else product[1]  # type: ignore[assignment]
            # ... and each copied client's base URL parsed by httpx.
            clients._plain_url = (lambda url_class, url: None) if before else product[2]  # type: ignore[assignment]

        return apply

    return {"before (round 10)": use(True), "this round": use(False)}


async def start_upstream(args: argparse.Namespace) -> tuple[str, Any]:
    """The upstream's URL and the coroutine function that stops it."""
    if args.upstream == "mock":
        from rllm.testing import MockUpstream
        from rllm.testing.scripted import say_back

        upstream = await MockUpstream(responder=say_back()).start()
        return upstream.url, upstream.stop
    import tempfile
    from pathlib import Path

    from rllm_cookbook_say import WORDS

    from rllm.backends.tinker import TinkerBackend
    from rllm.tiny import init_tiny_model

    model = init_tiny_model(Path(tempfile.mkdtemp(prefix="rllm-fc-")) / "model", vocab_words=WORDS, seed=0)
    options = {"model": str(model), "torch_threads": 1, "seed": 0, "sampler_in_process": True}
    backend = TinkerBackend({**options, "sampler_batch_window_ms": args.window_ms})
    await backend.start()
    SAMPLERS.append(getattr(backend.service, "engine", None))  # the local service's SamplerEngine
    TOKENIZERS.append(str(model))
    return backend.inference_urls()[0], backend.close


async def main(args: argparse.Namespace) -> None:
    from rllm_cookbook_say import load_tasks, say_flow

    from rllm.engine.rollout.rollout_config import RolloutConfig
    from rllm.engine.rollout.rollout_engine import RolloutEngine
    from rllm.gateway import GatewayConfig

    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    url, stop = await start_upstream(args)
    tasks = load_tasks("train", turns=1)[: args.tasks]
    mode: dict[str, Any] = {}
    if args.mode == "cumulative":  # as `rllm train` runs its gateway: the sampler gets token ids
        if not SAMPLERS:
            raise SystemExit("--mode cumulative needs --upstream local (the tiny model's tokenizer)")
        mode = {"tokenizer_mode": "cumulative", "tokenizer_path": TOKENIZERS[0]}
    config = RolloutConfig(n=args.group, concurrency=args.tasks * args.group, progress=False)
    if args.compare == "flow-path":
        setups = flow_path_variants()
    elif args.compare == "call-path":
        setups = call_path_variants()
    else:
        setups = variants() if args.upstream == "mock" else sampler_variants()
    cpu: dict[str, list[float]] = {name: [] for name in setups}
    wall: dict[str, list[float]] = {name: [] for name in setups}
    passes: dict[str, list[int]] = {name: [] for name in setups}
    # The event loop's own thread: flows, their openai clients, the gateway and the engine (the
    # process figure adds the sampler's forward passes on its thread).
    loop_cpu: dict[str, list[float]] = {name: [] for name in setups}
    collections: dict[str, list[int]] = {name: [] for name in setups}  # the cyclic GC's runs
    for r in range(args.rounds + 1):
        order = list(setups.items())
        for name, apply in order[r % len(order) :] + order[: r % len(order)]:  # each goes first in turn
            apply()  # before the engine starts: it registers the in-process path (or not) at start
            cfg = GatewayConfig(upstreams=[url], health_interval_s=0, **mode)
            async with RolloutEngine(say_flow, None, config, gateway_config=cfg) as engine:
                f0 = SAMPLERS[0].forward_passes if SAMPLERS else 0
                g = sum(gen["collections"] for gen in gc.get_stats())
                t, c, lc = time.perf_counter(), time.process_time(), time.thread_time()
                episodes = await engine.run(tasks)
                c, t, lc = time.process_time() - c, time.perf_counter() - t, time.thread_time() - lc
                g = sum(gen["collections"] for gen in gc.get_stats()) - g
                f = (SAMPLERS[0].forward_passes if SAMPLERS else 0) - f0
            assert all(ep.error is None for ep in episodes), [ep.error for ep in episodes][:3]
            if r:  # round 0 warms every path up
                cpu[name].append(c)
                wall[name].append(t)
                loop_cpu[name].append(lc)
                collections[name].append(g)
                passes[name].append(f)
    await stop()
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    n = args.tasks * args.group
    first = next(iter(setups))
    base = statistics.median(cpu[first])
    loop_base = statistics.median(loop_cpu[first])
    print(f"{args.rounds} rounds of {n} one-turn rollouts, medians:")
    for name in setups:
        mc, mw = statistics.median(cpu[name]), statistics.median(wall[name])
        ml = statistics.median(loop_cpu[name])
        print(
            f"  {name:18s} CPU {mc * 1000:7.1f} ms/round ({mc * 1e6 / n:6.0f} us/rollout)"
            f"   wall {mw * 1000:7.1f} ms/round   CPU vs {first} {mc / base:.2f}x"
            f"   loop thread {ml * 1e6 / n:6.0f} us/rollout ({ml / loop_base:.2f}x)"
            f"   {statistics.median(collections[name]):.0f} GC runs/round"
            + (f"   {statistics.median(passes[name]):.0f} forward passes/round" if SAMPLERS else "")
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument(
        "--upstream",
        choices=["mock", "local"],
        default="mock",
        help="the loopback MockUpstream, or the local sampler with the tiny model",
    )
    parser.add_argument("--window-ms", type=float, default=1.0, help="local sampler's batch window")
    parser.add_argument(
        "--compare",
        choices=["hop", "flow-path", "call-path"],
        default="hop",
        help="hop: the designs above; flow-path (#35 round 8, with --upstream local): the flow's "
        "per-call path before that round (openai's constructor per rollout, uuid4 idempotency keys, "
        "a chat render per call) against its; call-path (#35 round 11, with --upstream local): "
        "the answer parsed by openai's construct and the route worked out per call, against now",
    )
    parser.add_argument(
        "--mode", choices=["plain", "cumulative"], default="plain", help="the gateway's tokenizer_mode"
    )
    asyncio.run(main(parser.parse_args()))
