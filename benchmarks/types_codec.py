"""Benchmark: rllm-types codecs vs a pydantic v2 model set with list fields (rLLM upstream's style).

Encodes and decodes N Episodes (4 trajectories x 8 steps x 1,000 response tokens with logprobs)
through: ours msgpack (the wire format, arrays as packed bytes), ours JSON, and pydantic's JSON
(model_dump_json / model_validate_json). Prints times, sizes and ratios.

    uv run --no-sync python benchmarks/types_codec.py            # 2,000 episodes, as the issue asks
    uv run --no-sync python benchmarks/types_codec.py --episodes 200
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from typing import Any

import pydantic

from rllm.types import (
    Episode,
    FloatArray,
    Step,
    TokenArray,
    Trajectory,
    from_json,
    from_msgpack,
    to_json,
    to_msgpack,
)

TRAJECTORIES, STEPS, TOKENS = 4, 8, 1000


class PStep(pydantic.BaseModel):
    id: str
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    reward: float | None = None
    done: bool = False
    advantage: float | list[float] | None = None
    metadata: dict[str, Any] = {}


class PTrajectory(pydantic.BaseModel):
    id: str
    role: str
    steps: list[PStep]
    reward: float | None = None


class PEpisode(pydantic.BaseModel):
    id: str
    task_id: str
    rollout_index: int
    trajectories: list[PTrajectory]
    is_correct: bool | None = None
    termination_reason: str = "done"
    metrics: dict[str, float] = {}


class PEpisodes(pydantic.BaseModel):
    episodes: list[PEpisode]


def make_episodes(n: int, seed: int = 0) -> list[Episode]:
    rng = random.Random(seed)
    # A pool of token/logprob blocks reused across steps keeps set-up fast; codecs still copy all bytes.
    pool = [
        (
            TokenArray(rng.randrange(50_000) for _ in range(TOKENS)),
            FloatArray(-rng.random() * 5 for _ in range(TOKENS)),
        )
        for _ in range(16)
    ]
    out = []
    for e in range(n):
        trajs = []
        for t in range(TRAJECTORIES):
            steps = []
            for s in range(STEPS):
                ids, lps = pool[(e + t + s) % len(pool)]
                steps.append(
                    Step(
                        id=f"s{e}-{t}-{s}",
                        prompt_ids=ids[:64],
                        completion_ids=ids,
                        completion_logprobs=lps,
                        reward=1.0,
                    )
                )
            trajs.append(Trajectory(id=f"t{e}-{t}", role=f"role{t}", steps=steps, reward=0.5))
        out.append(Episode(id=f"e{e}", task_id=f"task{e // 8}", rollout_index=e % 8, trajectories=trajs))
    return out


def to_pydantic(episodes: list[Episode]) -> PEpisodes:
    return PEpisodes(
        episodes=[
            PEpisode(
                id=ep.id,
                task_id=ep.task_id,
                rollout_index=ep.rollout_index,
                trajectories=[
                    PTrajectory(
                        id=t.id,
                        role=t.role,
                        reward=t.reward,
                        steps=[
                            PStep(
                                id=s.id,
                                prompt_ids=s.prompt_ids.tolist(),
                                completion_ids=s.completion_ids.tolist(),
                                completion_logprobs=s.completion_logprobs.tolist(),
                                reward=s.reward,
                            )
                            for s in t.steps
                        ],
                    )
                    for t in ep.trajectories
                ],
            )
            for ep in episodes
        ]
    )


def timed(label: str, fn: Any) -> tuple[float, Any]:
    gc.collect()
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    print(f"  {label:<34} {elapsed:8.3f} s")
    return elapsed, result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=2000)
    args = parser.parse_args()
    episodes = make_episodes(args.episodes)
    tokens = args.episodes * TRAJECTORIES * STEPS * TOKENS
    print(f"{args.episodes} episodes, {tokens / 1e6:.1f}M response tokens with logprobs")

    print("rllm-types msgpack (packed arrays):")
    t_enc, blob = timed("encode", lambda: to_msgpack(episodes))
    t_dec, back = timed("decode", lambda: from_msgpack(blob, list[Episode]))
    assert back == episodes
    ours_mp, mp_size = t_enc + t_dec, len(blob)
    del back, blob

    print("rllm-types JSON:")
    t_enc, blob = timed("encode", lambda: to_json(episodes))
    t_dec, back = timed("decode", lambda: from_json(blob, list[Episode]))
    assert len(back) == len(episodes)
    ours_json, json_size = t_enc + t_dec, len(blob)
    del back, blob

    print("pydantic v2 JSON (list fields):")
    p_eps = to_pydantic(episodes)
    t_enc, blob = timed("encode", p_eps.model_dump_json)
    t_dec, back = timed("decode", lambda: PEpisodes.model_validate_json(blob))
    assert len(back.episodes) == len(p_eps.episodes)
    pyd_json, pyd_size = t_enc + t_dec, len(blob)

    print("\nround trip (encode + decode):")
    print(
        f"  ours msgpack   {ours_mp:8.3f} s  {mp_size / 1e6:9.1f} MB   {pyd_json / ours_mp:6.1f}x faster than pydantic JSON"
    )
    print(
        f"  ours JSON      {ours_json:8.3f} s  {json_size / 1e6:9.1f} MB   {pyd_json / ours_json:6.1f}x faster than pydantic JSON"
    )
    print(f"  pydantic JSON  {pyd_json:8.3f} s  {pyd_size / 1e6:9.1f} MB")
    print(
        f"\ntargets: msgpack >= 20x -> {'MET' if pyd_json / ours_mp >= 20 else 'MISSED'}; "
        f"JSON no slower than pydantic -> {'MET' if ours_json <= pyd_json else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
