"""CPU per call of three per-rollout pieces of `rllm train`'s path, each against its peer (the way
it was done before #35 round 6), in one run, alternating rounds:

  evaluator   a cheap sync evaluator (say's) through score_episode: the thread-pool hop per call
              (peer) vs rllm.engine.rollout.eval_dispatch (inline once proven cheap)
  encode      cumulative mode's prompt tokenization for a group of 8 identical prompts:
              tokenizer.encode each time (peer) vs TokenBridge.encode (a repeated text once)
  sample      one decode step's token draw for 32 unseeded rows: torch.multinomial (peer) vs the
              sampler's draw (rllm.backends.tinker.local.sampling.sample_next: Gumbel-max in
              #35 round 6, an inverse-CDF draw since #48 round 5)
  chat prompt the local sampler's chat render + tokenize per call, groups of 8 identical prompts:
              apply_chat_template + tokenizer each call (peer, before #35 round 7) vs
              CallReader.chat_prompt (local/calls.py, local/prompt_cache.py)
  hand-back   32 requests that end in one decode step handed from the engine's thread to the
              caller's event loop: a concurrent Future each, awaited through asyncio.wrap_future
              (peer, before #35 round 7) vs the sampler's Outbox (one wake-up per step)
  tensorboard one training step's 47 scalars (the whole-system run's metrics row) to TensorBoard:
              tensorboard.summary.Writer, add_scalar per key + flush (peer, before #35 round 8;
              its writer thread's work included) vs rllm.engine.training.tb_events (one Event per step)
  flow client a rollout's openai client for an in-process gateway: openai's AsyncOpenAI
              constructor (peer, before #35 round 8) vs rllm.sdk.clients.async_openai (a copy)
  idempotency openai's per-request key: uuid4 (peer) vs the flow client's counter
  render      cumulative mode's chat template render, groups of 8 identical chats: a render
              per call (peer, before #35 round 8) vs TokenBridge.render (kept by exact inputs)

Process CPU time per call (median over rounds), so a loaded machine moves both sides alike.

    uv run --no-sync python benchmarks/per_rollout_cpu.py --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

sys.path.insert(0, str(Path(__file__).parent))
import cpu_training as ct  # the toy task's words (its tiny model's vocabulary)


def cpu_per_call(fn: Callable[[], Any], calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - started) / calls


def evaluator_sides(calls: int) -> dict[str, Callable[[], float]]:
    from rllm_cookbook_say import say_evaluator

    from rllm.engine.rollout.eval_dispatch import EvalDispatch
    from rllm.engine.rollout.scoring import score_episode
    from rllm.types import Episode, Step, Task, Trajectory

    task = Task(id="apple", instruction="say: apple", metadata={"words": ["apple"]})

    def episode() -> Episode:
        ep = Episode(task_id="apple", trajectories=[Trajectory(role="default", steps=[Step()])])
        ep.artifacts = {"replies": ["apple"]}
        return ep

    async def run(dispatch: EvalDispatch | None) -> float:
        started = time.process_time()
        for _ in range(calls):
            await score_episode(task, episode(), say_evaluator, 300.0, dispatch)
        return (time.process_time() - started) / calls

    warm = EvalDispatch(say_evaluator)
    asyncio.run(run(warm))  # past its probation: inline from here on
    assert warm.inline, "the say evaluator should be running inline after its probation"
    return {"pool hop": lambda: asyncio.run(run(None)), "dispatch": lambda: asyncio.run(run(warm))}


def encode_sides(calls: int, tokenizer: Any) -> dict[str, Callable[[], float]]:
    from rllm.gateway.cumulative import TokenBridge

    words = ct.WORDS
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"say: {w}"}], add_generation_prompt=True, tokenize=False
        )
        for w in words
    ]
    group = [t for t in texts for _ in range(8)]  # each task's prompt, group_size times
    bridge = TokenBridge(tokenizer)

    def peer() -> float:
        return cpu_per_call(
            lambda: [tokenizer.encode(t, add_special_tokens=False) for t in group], calls
        ) / len(group)

    def ours() -> float:
        return cpu_per_call(lambda: [bridge.encode(t) for t in group], calls) / len(group)

    return {"tokenizer.encode": peer, "TokenBridge.encode": ours}


def sample_sides(calls: int, vocab: int) -> dict[str, Callable[[], float]]:
    from rllm.backends.tinker.local.sampling import (
        GREEDY_TEMPERATURE,
        RowSampling,
        sample_next,
        sampling_logprobs,
    )

    rows = [RowSampling(1.0, 1.0, None) for _ in range(32)]
    logits = torch.randn(32, vocab)

    def multinomial_step() -> None:  # sample_next as it was: multinomial over the unseeded rows
        temperatures = torch.tensor([r.temperature for r in rows])
        top_ps = torch.tensor([r.top_p for r in rows])
        logp = sampling_logprobs(logits, temperatures, top_ps)
        tokens = logp.argmax(dim=-1)
        unseeded = [
            i for i, r in enumerate(rows) if r.temperature >= GREEDY_TEMPERATURE and r.generator is None
        ]
        index = torch.tensor(unseeded)
        tokens[index] = torch.multinomial(logp[index].exp(), 1).squeeze(-1)
        logp.gather(-1, tokens[:, None]).squeeze(-1)

    return {
        "multinomial": lambda: cpu_per_call(multinomial_step, calls),
        "sample_next": lambda: cpu_per_call(lambda: sample_next(logits, rows), calls),
    }


def chat_prompt_sides(calls: int, model_dir: Path) -> dict[str, Callable[[], float]]:
    from rllm.backends.tinker.local.generation import SamplerEngine
    from rllm.backends.tinker.local.model import load_pretrained, load_tokenizer
    from rllm.backends.tinker.local.prompt_cache import PromptCache
    from rllm.backends.tinker.local.protocol import parse_messages
    from rllm.backends.tinker.local.server import SamplerServer

    model = load_pretrained(str(model_dir), torch.float32, torch.device("cpu"))
    server = SamplerServer(SamplerEngine(model, load_tokenizer(str(model_dir)), torch.device("cpu"), 64), "m")
    tokenizer = server.engine.tokenizer
    bodies = [{"messages": [{"role": "user", "content": f"say: {w}"}]} for w in ct.WORDS[:4]]
    group = [b for b in bodies for _ in range(8)]  # 4 tasks x 8 samples, as a step sends them

    def peer_call(body: dict[str, Any]) -> list[int]:  # the chat render before the cache
        text = cast(
            str,
            tokenizer.apply_chat_template(parse_messages(body), tokenize=False, add_generation_prompt=True),
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def peer() -> float:
        return cpu_per_call(lambda: [peer_call(b) for b in group], calls) / len(group)

    def ours_group() -> list[list[int]]:
        server.calls.prompts = PromptCache()  # a step's prompts are new: a cold cache for each group
        return [server.calls.chat_prompt(b, parse_messages(b)) for b in group]

    def ours() -> float:
        return cpu_per_call(ours_group, calls) / len(group)

    return {"render+tokenize": peer, "prompt cache": ours}


def hand_back_sides(calls: int) -> dict[str, Callable[[], float]]:
    import queue
    import threading
    from concurrent.futures import Future

    from rllm.backends.tinker.local.outbox import Outbox

    jobs: queue.Queue[Callable[[], None]] = queue.Queue()
    threading.Thread(target=lambda: [job() for job in iter(jobs.get, None)], daemon=True).start()

    async def peer_step() -> None:
        futures: list[Future[int]] = [Future() for _ in range(32)]
        waiters = [asyncio.wrap_future(f) for f in futures]

        def settle() -> None:  # as _deliver did, one by one
            for f in futures:
                f.set_result(1)

        jobs.put(settle)
        await asyncio.gather(*waiters)

    async def ours_step() -> None:
        loop = asyncio.get_running_loop()
        waiters = [loop.create_future() for _ in range(32)]
        outbox = Outbox()

        def settle() -> None:
            for w in waiters:
                outbox.put(loop, w, 1, None)
            outbox.flush()

        jobs.put(settle)
        await asyncio.gather(*waiters)

    def side(step: Callable[[], Any]) -> Callable[[], float]:
        async def run() -> float:
            started = time.process_time()
            for _ in range(calls):
                await step()
            return (time.process_time() - started) / calls

        return lambda: asyncio.run(run())

    return {"wrap_future each": side(peer_step), "outbox": side(ours_step)}


# The numeric keys of a `rllm train` metrics row on the whole-system config (benchmarks/whole_system.py).
STEP_KEYS = [
    "reward/mean",
    "reward/max",
    "reward/min",
    "reward/task_mean",
    "correct/fraction",
    "episodes",
    "termination/done",
    "tokens/response_mean",
    "time/loop_lag_max_s",
    "rollout/worker_lost",
    "filter/groups_in",
    "filter/trajectories_masked",
    "filter/groups_too_small",
    "filter/groups_kept",
    "filter/groups_zero_variance",
    "filter/frac_all_correct",
    "filter/frac_all_wrong",
    "filter/frac_effective",
    "filter/tasks_unrewarded",
    "advantage/default/mean",
    "advantage/default/std",
    "advantage/mean",
    "advantage/std",
    "advantage/min",
    "advantage/max",
    "train/policy_loss",
    "train/clip_frac",
    "train/approx_kl",
    "train/entropy",
    "train/loss",
    "train/sampler_logprob_abs_diff",
    "train/num_tokens",
    "train/num_sequences",
    "train/grad_norm",
    "train/grad_norm_max",
    "train/optimizer_steps",
    "train/lr",
    "train/train_step_s",
    "segments/new_per_episode",
    "mismatch/mean_abs",
    "mismatch/max_abs",
    "mismatch/frac_over_0.5",
    "mismatch/kl_k3",
    "mismatch/tokens",
    "train/sequences",
    "weight_version",
    "time/rollout_s",
    "time/train_s",
]


def tensorboard_sides(calls: int) -> dict[str, Callable[[], float]]:
    from tensorboard.summary import Writer

    from rllm.engine.training.tb_events import ScalarEventFile

    rows = [{key: step * 0.001 + i for i, key in enumerate(STEP_KEYS)} for step in range(calls)]

    def peer() -> float:  # what MetricsLogger._mirror did: a record per scalar, a flush per step
        started = time.process_time()
        writer = Writer(tempfile.mkdtemp(prefix="rllm-prc-tb-"))
        for step, row in enumerate(rows):
            for key, value in row.items():
                writer.add_scalar(key, value, step)
            writer.flush()
        writer.close()
        return (time.process_time() - started) / calls

    def ours() -> float:  # one Event per step, flushed on its timer and at close
        started = time.process_time()
        events = ScalarEventFile(Path(tempfile.mkdtemp(prefix="rllm-prc-tb-")))
        for step, row in enumerate(rows):
            events.add_scalars(step, row)
        events.close()
        return (time.process_time() - started) / calls

    return {"Writer per scalar": peer, "one Event a step": ours}


def client_sides(calls: int) -> dict[str, Callable[[], float]]:
    """A flow's client per rollout, on a loop whose gateway is served in process."""
    from openai import AsyncOpenAI

    from rllm.sdk import clients
    from rllm.types import AgentConfig

    configs = [
        AgentConfig(base_url=f"http://127.0.0.1:9/sessions/{i:016x}/v1", api_key=f"tok{i}") for i in range(64)
    ]

    def peer(config: AgentConfig) -> Any:  # async_openai before #35 round 8: openai's constructor
        args = clients._client_args(config, None, {})
        client = AsyncOpenAI(**args, http_client=clients._loop_pool(asyncio.get_running_loop()))
        clients._skip_platform_lookup(client)
        return client

    def side(make: Callable[[AgentConfig], Any]) -> Callable[[], float]:
        async def run() -> float:
            stop = clients.serve_in_process("http://127.0.0.1:9", _unused_handler)
            try:
                make(configs[0])  # this loop's shared pool (and the process's SSL context) first
                started = time.process_time()
                for i in range(calls):
                    make(configs[i % len(configs)])
                return (time.process_time() - started) / calls
            finally:
                stop()

        return lambda: asyncio.run(run())

    return {"AsyncOpenAI()": side(peer), "async_openai": side(clients.async_openai)}


async def _unused_handler(*args: Any) -> None:
    raise AssertionError("no call is made")


def idempotency_sides(calls: int) -> dict[str, Callable[[], float]]:
    from openai import AsyncOpenAI

    from rllm.sdk import clients

    plain = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")
    ours = clients._flow_client_class()(base_url="http://127.0.0.1:9/v1", api_key="k")
    return {
        "uuid4": lambda: cpu_per_call(plain._idempotency_key, calls),
        "counter": lambda: cpu_per_call(ours._idempotency_key, calls),
    }


def render_sides(calls: int, tokenizer: Any) -> dict[str, Callable[[], float]]:
    from rllm.gateway.cumulative import TokenBridge

    chats = [[{"role": "user", "content": f"say: {w}"}] for w in ct.WORDS[:4]]
    group = [c for c in chats for _ in range(8)]  # 4 tasks x 8 samples, as a step sends them

    def peer() -> float:
        bridge = TokenBridge(tokenizer)
        return cpu_per_call(lambda: [bridge._render(m, None) for m in group], calls) / len(group)

    def ours() -> float:
        def step() -> None:
            bridge = TokenBridge(tokenizer)  # a step's prompts are new: a cold cache for each step
            for m in group:
                bridge.render(m, None)

        return cpu_per_call(step, calls) / len(group)

    return {"render each": peer, "render cache": ours}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--only", action="append", default=None, help="parts whose name starts so")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    from transformers import AutoTokenizer

    from rllm.tiny import init_tiny_model

    model_dir = init_tiny_model(Path(tempfile.mkdtemp(prefix="rllm-prc-")) / "model", vocab_words=ct.WORDS)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = len(tokenizer)
    parts = {
        "evaluator (per rollout)": evaluator_sides(args.calls),
        "prompt encode (per call)": encode_sides(max(1, args.calls // 40), tokenizer),
        f"token draw (per decode step, 32 rows, vocab {vocab})": sample_sides(args.calls, vocab),
        "sampler chat prompt (per call)": chat_prompt_sides(max(1, args.calls // 40), model_dir),
        "answer hand-back (per decode step, 32 requests)": hand_back_sides(max(1, args.calls // 4)),
        f"tensorboard (per step, {len(STEP_KEYS)} scalars)": tensorboard_sides(max(1, args.calls // 4)),
        "flow client (per rollout)": client_sides(args.calls),
        "idempotency key (per call)": idempotency_sides(args.calls * 10),
        "gateway chat render (per call, cumulative mode)": render_sides(max(1, args.calls // 40), tokenizer),
    }
    if args.only:
        parts = {k: v for k, v in parts.items() if any(k.startswith(o) for o in args.only)}
    for part, sides in parts.items():
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, side in sides.items():  # alternating, so load drifts hit both sides
                times[name].append(side())
        (peer, peer_t), (ours, ours_t) = ((n, statistics.median(t)) for n, t in times.items())
        print(
            f"{part:52s} {peer} {peer_t * 1e6:8.1f} us   {ours} {ours_t * 1e6:8.1f} us   "
            f"ours/peer {ours_t / peer_t:.2f}x"
        )


if __name__ == "__main__":
    main()
