"""`rllm train NAME --sft DATASET`: SFT then RL in one process, on the tiny model and the local
Tinker service. RL starts from the very weights `rllm sft` + `rllm train --init-from` would give
it; --resume does not redo a finished SFT phase; every mistake is refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rllm.cli.main import main
from rllm.engine.data.trace_data import read_training_samples
from rllm.engine.plugins import load_cookbook
from rllm.engine.training.checkpoint import latest_checkpoint
from rllm.engine.training.launch import init_tiny_model
from rllm.engine.training.metrics_log import read_metrics

pytestmark = pytest.mark.slow

RL = [
    "tasks_per_step=2",
    "group_size=2",
    "val_every=0",
    "rollout.workers=1",
    "progress=false",
    "plot=false",
    "tensorboard=false",
    "sample_groups=2",
    "seed=0",
    "backend.options.learning_rate=1e-3",
]
SFT = ["total_steps=3", "batch_tokens=40", "backend.options.learning_rate=0.01", "seed=0", "progress=false"]


def write_chats(path: Path) -> Path:
    """The say-single tasks answered right: "say: WORD" -> WORD (words the tiny model knows)."""
    tasks = load_cookbook("say-single").load_tasks("train")
    rows = [
        {
            "messages": [
                {"role": "user", "content": t.instruction},
                {"role": "assistant", "content": str(t.ground_truth)},
            ]
        }
        for t in tasks
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows * 2))
    return path


def weights(checkpoint: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(str(checkpoint / "backend" / "model.safetensors"))


def completion_logprobs(model_dir: Path, prompt: list[int], completion: list[int]) -> list[float]:
    """Each completion token's logprob under a saved model's weights (a plain transformers
    forward pass, apart from the backend's own sampler)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[len(prompt) + i - 1, token]) for i, token in enumerate(completion)]


def test_one_command_starts_rl_from_the_weights_of_sft_then_init_from(tmp_path: Path) -> None:
    model = init_tiny_model(tmp_path / "model", cookbook=load_cookbook("say-single"))
    chats = write_chats(tmp_path / "chats.jsonl")
    rl = [*RL, f"backend.options.model={model}", "total_steps=1"]
    # Two commands: `rllm sft`, then `rllm train --init-from`.
    assert main(["sft", str(chats), "--model", str(model), "--out", str(tmp_path / "sft"), *SFT]) == 0
    two = tmp_path / "two"
    assert main(["train", "say-single", "--out", str(two), "--init-from", str(tmp_path / "sft"), *rl]) == 0
    # One command.
    one = tmp_path / "one"
    sft = [f"sft.{item}" for item in SFT]
    assert main(["train", "say-single", "--out", str(one), "--sft", str(chats), *rl, *sft]) == 0

    sft_two, sft_one = latest_checkpoint(tmp_path / "sft"), latest_checkpoint(one / "sft")
    assert sft_two is not None and sft_one is not None and sft_one.name == "step_000003"
    a, b = weights(sft_two), weights(sft_one)
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-5  # pyright: ignore[reportOperatorIssue]
    losses = [
        [r["train/loss"] for r in read_metrics(d / "metrics.jsonl")] for d in (tmp_path / "sft", one / "sft")
    ]
    assert losses[0] == losses[1] and len(losses[0]) == 3
    # RL's first rollouts were sampled by the SFT weights: their logprobs are the SFT checkpoint's
    # (step 1's samples come before any RL update), and not the fresh model's.
    episodes = read_training_samples(one, 1)
    steps = [s for e in episodes for t in e.trajectories for s in t.steps if s.completion_ids is not None]
    assert steps
    for step in steps[:4]:
        prompt, completion = list(step.prompt_ids or []), list(step.completion_ids or [])
        sampled = list(step.completion_logprobs or [])
        assert sampled == pytest.approx(
            completion_logprobs(sft_two / "backend", prompt, completion), abs=1e-5
        )
        fresh = completion_logprobs(Path(model), prompt, completion)
        assert max(abs(x - y) for x, y in zip(sampled, fresh, strict=True)) > 1e-3  # SFT moved them


def test_resume_does_not_redo_a_finished_sft_phase_and_continues_an_unfinished_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chats = write_chats(tmp_path / "chats.jsonl")
    out = tmp_path / "run"
    args = ["train", "say-single", "--out", str(out), "--sft", str(chats), *RL, "sft.ckpt_every=1"]
    args += [f"sft.{item}" for item in SFT]
    assert main([*args, "total_steps=1"]) == 0
    sft_rows = (out / "sft" / "metrics.jsonl").read_bytes()
    sft_ckpt = latest_checkpoint(out / "sft")
    assert sft_ckpt is not None and (out / "sft" / "done.json").is_file()
    stamp = (sft_ckpt / "trainer_state.json").stat().st_mtime_ns
    capsys.readouterr()

    assert main([*args, "total_steps=1"]) == 2  # a second fresh run into the folder
    assert "already holds a training run" in capsys.readouterr().err

    assert main([*args, "--resume", "--allow-changes", "total_steps", "total_steps=2"]) == 0
    assert "not redone" in capsys.readouterr().err
    assert (out / "sft" / "metrics.jsonl").read_bytes() == sft_rows
    assert (sft_ckpt / "trainer_state.json").stat().st_mtime_ns == stamp
    assert latest_checkpoint(out / "sft") == sft_ckpt
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]  # RL continued its own

    # An SFT phase stopped after step 2 (its checkpoint then, none of RL's yet): the on-disk state
    # a kill leaves, made here by removing what came later. --resume trains step 3 only, then RL
    # from step 0.
    import shutil

    (out / "sft" / "done.json").unlink()
    shutil.rmtree(out / "sft" / "checkpoints" / "step_000003")
    for name in ("checkpoints", "samples"):
        shutil.rmtree(out / name)
    assert main([*args, "--resume", "--allow-changes", "total_steps", "total_steps=1"]) == 0
    assert "sft done: 3 steps" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(out / "sft" / "metrics.jsonl")] == [1, 2, 3]
    assert (out / "sft" / "done.json").is_file()
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1]

    # --overwrite replaces both phases: SFT from step 0 again.
    assert main([*args, "--overwrite", "total_steps=1"]) == 0
    assert "sft done: 3 steps" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(out / "sft" / "metrics.jsonl")] == [1, 2, 3]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["sft.epochz=3"], "config key `sft.epochz`: unknown key"),
        (["sft.backend.options.learning_rat=1"], "`sft.backend.options.learning_rat`: unknown key"),
        (["sft.epochs=0"], "`sft.epochs`: epochs must be >= 1"),
        (["sft.out_dir=elsewhere"], "`sft.out_dir`: not settable"),
        (["sft.backend.name=fireworks"], "`sft.backend.name`: not settable"),
        (["sft.backend={name: fireworks}"], "`sft.backend.name`: not settable"),
        (["--init-from", "runs/x"], "--sft and --init-from both set the starting weights"),
        (["init_from=runs/x"], "config key `init_from`: --sft trains the starting weights itself"),
        (["--resume"], "--resume: run folder"),
        (["--allow-changes", "total_steps"], "--allow-changes applies to --resume only"),
    ],
)
def test_refusals_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    chats = write_chats(tmp_path / "chats.jsonl")
    out = tmp_path / "run"
    assert main(["train", "say-single", "--out", str(out), "--sft", str(chats), *RL, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not out.exists()  # nothing built, nothing written


def test_a_missing_dataset_is_refused_before_any_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    missing = tmp_path / "nope.jsonl"
    assert main(["train", "say-single", "--out", str(out), "--sft", str(missing), *RL]) == 2
    assert f"--sft: {missing} is not a file" in capsys.readouterr().err
    assert not out.exists()
