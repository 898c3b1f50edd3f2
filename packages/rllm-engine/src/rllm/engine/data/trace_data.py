"""Eval traces to an SFT set: the episodes of an `rllm eval` run (or the per-step samples a
training run kept, ``OUT/samples/step_N.msgpack``) above a reward, as token sequences.

Each kept trajectory becomes the sequences ``rllm.engine.training.sequences`` builds for RL, from the
sampler's own token ids (never re-tokenized): the completions are trained (loss mask 1), the
prompts, tool outputs and user turns are context. Exact duplicates (same token ids) are kept
once, and at most ``max_per_task`` episodes of a task are kept (the first ones in the file), so a
task the model always solves does not crowd out the rest. Records are JSON lines that
``rllm.engine.data.chat_data.read_chat_jsonl`` reads back (``input_ids`` + ``loss_mask``, with the
conversation's ``messages`` and the role for people), each naming the tokenizer its ids are of
(``tokenizer``: a fingerprint of vocabulary and chat template; ``tokenizer_source``: the model),
so that `rllm sft` refuses to train them with another (rllm.engine.data.stored_ids).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from rllm.engine.training.metrics_log import read_episode_sample, sample_path, sample_steps
from rllm.engine.training.model_check import run_model
from rllm.engine.training.sequences import sequences_from_trajectory
from rllm.engine.training.train_step import episode_reward
from rllm.types import Episode, from_json, to_builtins
from rllm.types.errors import InputError


class FromEvalStats(msgspec.Struct, kw_only=True):
    episodes: int = 0
    above_threshold: int = 0
    capped: int = 0  # episodes dropped by max_per_task
    duplicates: int = 0  # sequences dropped as exact duplicates
    records: int = 0


def read_eval_episodes(run_dir: str | Path) -> list[Episode]:
    """The episodes an `rllm eval` run saved (``RUN_DIR/episodes.jsonl``; a torn last line is skipped)."""
    path = Path(run_dir) / "episodes.jsonl"
    if not path.is_file():
        raise InputError(f"{run_dir} has no episodes.jsonl (run `rllm eval` with episodes saved)")
    lines = path.read_bytes().splitlines()
    episodes: list[Episode] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            episodes.append(from_json(line, Episode))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if number == len(lines):  # a run killed mid-write
                break
            raise InputError(f"{path}:{number}: not an episode ({exc})") from None
    return episodes


def read_training_samples(run_dir: str | Path, from_step: int = 0) -> list[Episode]:
    """The episodes a training run's samples hold (``sample_groups`` groups a step: the best, the
    worst and the first), steps ``>= from_step`` in order; later steps come from a better policy."""
    steps = [s for s in sample_steps(Path(run_dir)) if s >= from_step]
    if not steps:
        raise InputError(
            f"{run_dir} has no training samples"
            + (f" from step {from_step} on" if from_step else "")
            + " (samples/step_N.msgpack; a run with sample_groups=0 keeps none)"
        )
    episodes: list[Episode] = []
    for step in steps:
        path = sample_path(Path(run_dir), step)
        try:
            episodes.extend(read_episode_sample(path).episodes)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise InputError(f"{path}: not an episode sample ({exc})") from None
    return episodes


def read_run_episodes(run_dir: str | Path, from_step: int | None = None) -> list[Episode]:
    """An `rllm eval` run's episodes, or a training run's samples (``from_step`` applies only to those)."""
    root = Path(run_dir)
    if (root / "episodes.jsonl").is_file():
        if from_step:
            raise InputError(
                f"{run_dir} is an eval run (episodes.jsonl): from_step applies to a training run"
            )
        return read_eval_episodes(root)
    if sample_steps(root):
        return read_training_samples(root, from_step or 0)
    raise InputError(
        f"{run_dir} has neither episodes.jsonl (an `rllm eval` run) nor samples/ (an `rllm train` run)"
    )


def sft_records(
    episodes: list[Episode],
    min_reward: float,
    max_per_task: int = 0,
    *,
    tokenizer: str | None = None,
    tokenizer_source: str = "",
) -> tuple[list[dict[str, Any]], FromEvalStats]:
    """JSON-ready SFT records of the episodes whose reward is >= ``min_reward``; each names the
    tokenizer its ids are of (``tokenizer``: its fingerprint, of the model ``tokenizer_source``)
    when given, which `rllm sft` checks (rllm.engine.data.stored_ids)."""
    named = {"tokenizer": tokenizer, "tokenizer_source": tokenizer_source} if tokenizer else {}
    stats = FromEvalStats(episodes=len(episodes))
    per_task: Counter[str] = Counter()
    seen: set[bytes] = set()
    records: list[dict[str, Any]] = []
    for episode in episodes:
        reward = episode_reward(episode)
        if reward < min_reward:
            continue
        stats.above_threshold += 1
        if max_per_task and per_task[episode.task_id] >= max_per_task:
            stats.capped += 1
            continue
        per_task[episode.task_id] += 1
        for trajectory in episode.trajectories:
            if not any(s.completion_ids for s in trajectory.steps):
                continue
            group = f"{episode.task_id}/{trajectory.role}"
            # SFT trains on every completion alike: a zero advantage only satisfies the builder.
            steps = [msgspec.structs.replace(s, advantage=0.0) for s in trajectory.steps]
            plain = msgspec.structs.replace(trajectory, steps=steps)
            for sequence in sequences_from_trajectory(plain, group, f"episode {episode.id}"):
                key = bytes(memoryview(sequence.input_ids))
                if key in seen:
                    stats.duplicates += 1
                    continue
                seen.add(key)
                last = trajectory.steps[-1]
                messages = [to_builtins(m) for m in last.input]
                if last.output is not None:
                    messages.append(to_builtins(last.output))
                records.append(
                    {
                        "id": f"{episode.id}/{trajectory.role}/{len(records)}",
                        "task_id": episode.task_id,
                        "role": trajectory.role,
                        "reward": reward,
                        "messages": messages,
                        "input_ids": list(sequence.input_ids),
                        "loss_mask": list(sequence.loss_mask),
                        **named,
                    }
                )
    stats.records = len(records)
    return records, stats


def ids_tokenizer(run_dir: str | Path, tokenizer: str | None) -> str:
    """The model whose tokenizer made a run's stored ids: ``tokenizer`` when given, else a
    training run's own model (its record); an eval run's endpoint does not say, so it must be named."""
    if tokenizer:
        return tokenizer
    root = Path(run_dir)
    if (model := run_model(root)) is not None:
        return model
    what = (
        "an `rllm eval` run" if (root / "episodes.jsonl").is_file() else "a run without a record of its model"
    )
    raise InputError(
        f"{run_dir} is {what}: its token ids are the ids of the model that answered, which it does "
        "not name; pass --tokenizer MODEL (the folder or hub name of that model)"
    )


def check_ids_fit(records: list[dict[str, Any]], vocab_size: int, model: str) -> None:
    """Ids past ``model``'s vocabulary are not its ids: refused, naming the largest."""
    largest = max((max(r["input_ids"]) for r in records if r["input_ids"]), default=-1)
    if largest >= vocab_size:
        raise InputError(
            f"the run's token ids go up to {largest}, past {model}'s {vocab_size} tokens: they were "
            "made by another tokenizer; name the model that answered with --tokenizer"
        )


def write_records(path: str | Path, records: list[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)
    return path


__all__ = [
    "FromEvalStats",
    "check_ids_fit",
    "ids_tokenizer",
    "read_eval_episodes",
    "read_run_episodes",
    "read_training_samples",
    "sft_records",
    "write_records",
]
