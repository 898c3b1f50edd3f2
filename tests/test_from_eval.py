"""`rllm dataset from-eval`: an eval run of a scripted model becomes an SFT set of exactly its good episodes."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from rllm.cli.main import main
from rllm.engine.data.chat_data import read_chat_jsonl, tokenize_chat
from rllm.engine.data.trace_data import read_eval_episodes, sft_records
from rllm.engine.evaluation import evaluate
from rllm.engine.training.model_check import load_tokenizer
from rllm.engine.training.run_folder import RunFolder
from rllm.sdk import AgentConfig, Task, evaluator, final_answer, rollout
from rllm.sdk.rewards import math_reward
from rllm.testing import MockUpstream
from rllm.tiny import init_tiny_model


def graded_reply(body):
    """Task i answers correctly on attempts r < i: task 0 never, task 3 always (of 3)."""
    task, attempt = body["messages"][-1]["content"].split("|")
    return "\\boxed{4}" if int(attempt) < int(task) else "\\boxed{5}"


@rollout
def solver(task: Task, config: AgentConfig) -> None:
    client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0)
    content = f"{task.metadata['n']}|{config.metadata['rollout_index']}"
    client.chat.completions.create(model=config.model, messages=[{"role": "user", "content": content}])
    client.close()


@evaluator
def math_eval(task: Task, episode):
    return math_reward(final_answer(episode), task.ground_truth)


DATASET = [
    {"id": f"task-{i}", "instruction": "2+2", "ground_truth": "4", "metadata": {"n": i}} for i in range(4)
]


async def test_from_eval_keeps_exactly_the_good_episodes_with_their_token_ids(tmp_path, monkeypatch) -> None:
    # The model that answers: the mock, with tiny model's tokenizer (its ids are that model's).
    model = str(init_tiny_model(tmp_path / "model", seed=0))
    async with MockUpstream(responder=graded_reply, tokenizer=load_tokenizer(model)) as upstream:
        await evaluate(
            DATASET, solver, math_eval, upstream.url, attempts=3, output_dir=tmp_path, progress=False
        )
    episodes = read_eval_episodes(tmp_path)
    good = [e for e in episodes if e.is_correct]
    assert len(episodes) == 12 and len(good) == 6  # 0 + 1 + 2 + 3

    records, stats = sft_records(episodes, min_reward=1.0)
    assert stats.records == 6 and stats.above_threshold == 6 and stats.duplicates == 0
    by_episode = {e.id: e for e in good}
    for record in records:
        (step,) = by_episode[record["id"].split("/")[0]].trajectories[0].steps
        assert step.prompt_ids is not None and step.completion_ids is not None
        assert record["input_ids"] == [*step.prompt_ids, *step.completion_ids]  # the sampler's ids
        assert record["loss_mask"] == [0.0] * len(step.prompt_ids) + [1.0] * len(step.completion_ids)
    assert sft_records(episodes, min_reward=1.01)[0] == []
    capped, capped_stats = sft_records(episodes, min_reward=1.0, max_per_task=1)
    assert sorted(r["task_id"] for r in capped) == ["task-1", "task-2", "task-3"] and capped_stats.capped == 3
    twice, twice_stats = sft_records(episodes + episodes, min_reward=1.0)
    assert len(twice) == 6 and twice_stats.duplicates == 6

    # The command writes the set where `rllm sft NAME` finds it; the ids come back unchanged,
    # with the tokenizer they are of (named: an eval run does not know which model answered).
    monkeypatch.setenv("RLLM_HOME", str(tmp_path / "home"))
    good = [
        "dataset",
        "from-eval",
        str(tmp_path),
        "--name",
        "good",
        "--min-reward",
        "1.0",
        "--tokenizer",
        model,
    ]
    assert main(good) == 0
    path = tmp_path / "home" / "sft" / "good" / "sft.jsonl"
    examples = read_chat_jsonl(path)
    assert [list(tokenize_chat(None, e).input_ids) for e in examples] == [r["input_ids"] for r in records]  # pyright: ignore[reportArgumentType]
    assert (
        main(
            [
                "dataset",
                "from-eval",
                str(tmp_path),
                "--name",
                "none",
                "--min-reward",
                "2",
                "--tokenizer",
                model,
            ]
        )
        != 0
    )
    lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert all(line["reward"] == pytest.approx(1.0) and line["messages"] for line in lines)


async def test_from_eval_reads_a_training_runs_samples_filtered_by_reward_and_step(
    tmp_path, monkeypatch
) -> None:
    """The per-step samples the Trainer writes (write_episode_sample) are a from-eval source too."""
    from rllm.engine.training.metrics_log import write_episode_sample

    eval_dir, run = tmp_path / "eval", tmp_path / "run"
    model = str(init_tiny_model(tmp_path / "model", seed=0))
    async with MockUpstream(responder=graded_reply, tokenizer=load_tokenizer(model)) as upstream:
        await evaluate(
            DATASET, solver, math_eval, upstream.url, attempts=3, output_dir=eval_dir, progress=False
        )
    episodes = read_eval_episodes(eval_dir)
    # A training run's record names its model: the tokenizer of its samples' ids is that model's.
    RunFolder(run, "train", {"backend": {"name": "tinker", "options": {"model": model}}}).begin()
    # step 1 holds tasks 0 and 1, step 2 tasks 2 and 3 (every group kept: sample_groups=4)
    for step, tasks in ((1, {"task-0", "task-1"}), (2, {"task-2", "task-3"})):
        chosen = [e for e in episodes if e.task_id in tasks]
        write_episode_sample(run, step, chosen, [t.id for e in chosen for t in e.trajectories], groups=4)

    monkeypatch.setenv("RLLM_HOME", str(tmp_path / "home"))
    assert main(["dataset", "from-eval", str(run), "--name", "all", "--min-reward", "1.0"]) == 0
    kept = [
        json.loads(line)
        for line in (tmp_path / "home" / "sft" / "all" / "sft.jsonl").read_text().splitlines()
    ]
    assert {r["tokenizer_source"] for r in kept} == {model}
    expected, _ = sft_records(episodes, min_reward=1.0)
    assert sorted(r["input_ids"] for r in kept) == sorted(
        r["input_ids"] for r in expected
    )  # the sampler's ids
    assert sorted(r["task_id"] for r in kept) == ["task-1", "task-2", "task-2", "task-3", "task-3", "task-3"]
    assert main(["dataset", "from-eval", str(run), "--name", "late", "--from-step", "2"]) == 0
    late = [
        json.loads(line)
        for line in (tmp_path / "home" / "sft" / "late" / "sft.jsonl").read_text().splitlines()
    ]
    assert sorted(r["task_id"] for r in late) == ["task-2", "task-2", "task-3", "task-3", "task-3"]
    assert main(["dataset", "from-eval", str(run), "--name", "x", "--from-step", "3"]) != 0  # no such samples
    assert (
        main(["dataset", "from-eval", str(eval_dir), "--name", "x", "--from-step", "1"]) != 0
    )  # an eval run
    assert main(["dataset", "from-eval", str(tmp_path / "nothing"), "--name", "x"]) != 0
