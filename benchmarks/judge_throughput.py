"""Judge throughput and the adapters' rollout throughput against their libraries' own loops.

Part 1 — the group judge on a training run's groups. Each step's groups go through
``GroupGather(GroupJudge(JudgeEndpoint))`` exactly as the engine calls an evaluator (every
episode's ``evaluate`` at once; each group judged in one request once its last member is in).
Printed: judge requests per second (answered by the endpoint or the cache), endpoint calls per
second, and the cache hit rate; the peer is the same run with the cache off. The groups come from
a run folder's episode samples (``--run runs/NAME``: ``samples/step_*.msgpack``, grouped by task)
or, without one, from a synthetic run of the judge-say task (``--steps`` x ``--tasks-per-step``
groups of ``--group-size`` replies drawn from a small set, as a tiny model's are: groups recur).

Part 2 — rollouts per second, rLLM vs the library's own evaluation loop, on the same endpoint:

- verifiers (the adapter's ``say`` example): ``RolloutEngine`` with the adapter's flow and
  evaluator (its own gateway, token capture, scoring) vs ``Environment.evaluate`` (verifiers' own
  loop: generation and rubric scoring, ``max_concurrent`` rollouts at once);
- reasoning-gym (``leg_counting``): ``RolloutEngine`` with the adapter's cookbook vs the loop
  reasoning-gym's README describes (an ``AsyncOpenAI`` call per entry, ``extract_answer``,
  ``score_answer``), at the same concurrency (reasoning-gym ships no evaluation loop of its own).

The endpoint is rllm.testing's MockUpstream (a named fake: a vLLM look-alike on loopback) with
``--latency`` seconds per answer, in this process, so both sides pay the same.

    uv run --no-sync python benchmarks/judge_throughput.py [--run runs/say] [--rollouts 256]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import random
import re
import time
from pathlib import Path
from typing import Any

from rllm.testing import MockUpstream
from rllm.types import Episode, Task

WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "rocket")


# ----------------------------------------------------------------------------- part 1: the judge
def judge_reply(body: dict[str, Any]) -> str:
    """A group judge's answer: 10 for a reply starting with the task's word, else 2."""
    prompt = body["messages"][-1]["content"]
    word = re.search(r"say: (\w+)", prompt)
    blocks = re.findall(r"Reply (\d+):\n(.*?)\n", prompt)
    return "\n".join(
        f"SCORE {i}: {10 if word and text.startswith(word.group(1)) else 2}" for i, text in blocks
    )


def synthetic_groups(
    steps: int, tasks_per_step: int, group_size: int, seed: int = 0
) -> list[list[list[Episode]]]:
    """steps x groups x episodes of judge-say as a model learning it answers: the right word with
    a probability rising from 0.2 to 0.95 over the run, else one of two wrong ones."""
    rng = random.Random(seed)
    out = []
    for step_index in range(steps):
        right = 0.2 + 0.75 * step_index / max(1, steps - 1)
        step = []
        for word in rng.sample(WORDS, min(tasks_per_step, len(WORDS))):
            answers = [
                word if rng.random() < right else rng.choice(("say", "the")) for _ in range(group_size)
            ]
            step.append(
                [
                    Episode(task_id=word, rollout_index=i, artifacts={"answer": a})
                    for i, a in enumerate(answers)
                ]
            )
        out.append(step)
    return out


def run_groups(run: Path) -> list[list[list[Episode]]]:
    """A training run's sampled groups, step by step (its answers as the judge would read them)."""
    from rllm.engine.training.metrics_log import read_episode_sample

    steps = []
    for path in sorted(glob.glob(str(run / "samples" / "step_*.msgpack"))):
        by_task: dict[str, list[Episode]] = {}
        for episode in read_episode_sample(Path(path)).episodes:
            by_task.setdefault(episode.task_id, []).append(episode)
        steps.append([sorted(g, key=lambda e: e.rollout_index) for g in by_task.values() if len(g) > 1])
    if not steps:
        raise SystemExit(f"{run} has no samples/step_*.msgpack")
    return steps


async def judge_steps(
    url: str, steps: list[list[list[Episode]]], cache: bool, concurrency: int
) -> dict[str, float]:
    from rllm.sdk.rewards import GroupGather, GroupJudge, JudgeCache, JudgeEndpoint
    from rllm.sdk.rewards.judge_cache import CachedReply

    class NoCache(JudgeCache):
        def get(self, key: str) -> CachedReply | None:
            return None

        def put(self, key: str, value: CachedReply) -> None:
            return None

    endpoint = JudgeEndpoint(
        url, "mock-model", max_concurrency=concurrency, cache=None if cache else NoCache()
    )
    started = time.perf_counter()
    for step in steps:
        size = max(len(g) for g in step)
        gather = GroupGather(GroupJudge(endpoint, "Starts with the word."), size)
        await asyncio.gather(
            *(
                gather.evaluate(Task(id=g[0].task_id, instruction=f"say: {g[0].task_id}"), e)
                for g in step
                for e in g
            )
        )
    wall = time.perf_counter() - started
    usage = endpoint.usage
    await endpoint.aclose()
    return {
        "requests_per_s": usage.requests / wall,
        "calls_per_s": usage.calls / wall,
        "hit_rate": usage.cache_hit_rate,
        "requests": float(usage.requests),
        "refused": float(usage.refused),
    }


# ------------------------------------------------------------------------ part 2: the adapters
def say_back(body: dict[str, Any]) -> str:
    return body["messages"][-1]["content"].split()[-1]


def answer_tag(body: dict[str, Any]) -> str:
    return "Counting. <answer>42</answer>"


async def rllm_rollouts(cookbook: Any, tasks: list[Task], n: int, url: str, concurrency: int) -> float:
    from rllm.engine.rollout.rollout_config import RolloutConfig
    from rllm.engine.rollout.rollout_engine import RolloutEngine
    from rllm.types import SamplingParams

    config = RolloutConfig(
        n=n, concurrency=concurrency, progress=False, max_retries=0, sampling=SamplingParams(max_tokens=32)
    )
    async with RolloutEngine(cookbook.flow, cookbook.evaluator, config, upstreams=[url]) as engine:
        started = time.perf_counter()
        episodes = await engine.run(tasks)
        wall = time.perf_counter() - started
    assert all(e.termination_reason == "done" for e in episodes), {e.termination_reason for e in episodes}
    return len(episodes) / wall


async def verifiers_own_loop(url: str, n: int, concurrency: int, examples: int) -> float:
    import verifiers as vf
    from openai import AsyncOpenAI
    from rllm_adapter_verifiers import environments

    env = environments.load("rllm_adapter_verifiers.examples.say", f'{{"num_words": {examples}}}')
    client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=url, api_key="EMPTY"))
    started = time.perf_counter()
    results = await env.evaluate(
        client,
        "mock-model",
        sampling_args={"max_tokens": 32},
        num_examples=-1,
        rollouts_per_example=n,
        max_concurrent=concurrency,
    )
    wall = time.perf_counter() - started
    return len(results["outputs"]) / wall


async def reasoning_gym_readme_loop(tasks: list[Task], n: int, url: str, concurrency: int) -> float:
    from openai import AsyncOpenAI
    from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer
    from rllm_adapter_reasoning_gym import generators

    client = AsyncOpenAI(base_url=url, api_key="EMPTY")
    slots = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> float:
        async with slots:
            reply = await client.chat.completions.create(
                model="mock-model",
                messages=[
                    {"role": "system", "content": SYSTEM_PROMPTS["default"]},
                    {"role": "user", "content": str(task.instruction)},
                ],
                max_tokens=32,
            )
        dataset, entry = generators.entry_of(task)
        return dataset.score_answer(
            answer=extract_answer(reply.choices[0].message.content or ""), entry=entry
        )

    started = time.perf_counter()
    scores = await asyncio.gather(*(one(t) for t in tasks for _ in range(n)))
    wall = time.perf_counter() - started
    await client.close()
    return len(scores) / wall


async def main(args: argparse.Namespace) -> None:
    steps = (
        run_groups(Path(args.run))
        if args.run
        else synthetic_groups(args.steps, args.tasks_per_step, args.group_size)
    )
    groups = sum(len(s) for s in steps)
    async with MockUpstream(responder=judge_reply, latency=args.latency) as judge:
        await judge_steps(judge.url, steps[:2], cache=False, concurrency=args.concurrency)  # warm-up
        uncached = await judge_steps(judge.url, steps, cache=False, concurrency=args.concurrency)
        cached = await judge_steps(judge.url, steps, cache=True, concurrency=args.concurrency)
    print(
        f"## group judge: {len(steps)} steps, {groups} groups, endpoint latency {args.latency * 1000:.0f} ms"
    )
    for name, r in (("cache on", cached), ("cache off (peer)", uncached)):
        print(
            f"{name:>17}: {r['requests_per_s']:8.1f} judge requests/s, {r['calls_per_s']:8.1f} endpoint calls/s, "
            f"hit rate {r['hit_rate']:.2f}, refused {r['refused']:.0f}"
        )
    print(f"requests/s ratio (cache on / off): {cached['requests_per_s'] / uncached['requests_per_s']:.2f}x")

    from rllm.cli.adapters import adapter_cookbook

    n = args.rollouts_per_task
    say = adapter_cookbook("verifiers:rllm_adapter_verifiers.examples.say")
    assert say is not None
    say = say.with_options({"num_words": len(WORDS)})
    legs = adapter_cookbook("reasoning-gym:leg_counting")
    assert legs is not None
    legs = legs.with_options({"size": args.rollouts // n})
    print(
        f"## rollouts/s on one endpoint (latency {args.latency * 1000:.0f} ms, concurrency {args.concurrency})"
    )
    async with MockUpstream(responder=say_back, latency=args.latency) as model:
        # The same rollouts on both sides: the environment's eval set, `per` rollouts of each.
        vf_tasks = say.load_tasks("test")
        per = max(1, args.rollouts // len(vf_tasks))
        for _ in range(2):  # the first round warms both up (imports, clients); the second is timed
            ours = await rllm_rollouts(say, vf_tasks, per, model.url, args.concurrency)
            theirs = await verifiers_own_loop(model.url, per, args.concurrency, len(WORDS))
    print(
        f"verifiers say:   rLLM {ours:7.1f}/s, verifiers' evaluate {theirs:7.1f}/s, ratio {ours / theirs:.2f}x"
    )
    async with MockUpstream(responder=answer_tag, latency=args.latency) as model:
        rg_tasks = legs.load_tasks("train")
        for _ in range(2):  # warm-up round, then the timed one
            ours = await rllm_rollouts(legs, rg_tasks, n, model.url, args.concurrency)
            theirs = await reasoning_gym_readme_loop(rg_tasks, n, model.url, args.concurrency)
    print(f"reasoning-gym:   rLLM {ours:7.1f}/s, README loop {theirs:7.1f}/s, ratio {ours / theirs:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default=None, help="a run folder whose samples give the groups")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--latency", type=float, default=0.02, help="the endpoint's seconds per answer")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rollouts", type=int, default=256, help="rollouts per contender (part 2)")
    parser.add_argument("--rollouts-per-task", type=int, default=4)
    asyncio.run(main(parser.parse_args()))
