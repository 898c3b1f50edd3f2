"""`rllm sft` end to end on CPU: chat JSONL, the tiny model, the tinker backend's local service."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rllm.cli.main import main
from rllm.engine.data.sft import lr_scale, plan_batches
from rllm.engine.data.sft_launch import build_sft
from rllm.engine.training.metrics_log import read_metrics
from rllm.types import ConfigError

FAST = ["progress=false", "backend.options.learning_rate=0.01"]
FRUITS = ["apple", "banana", "cherry", "grape", "lemon", "mango"]


def write_chats(path: Path, n: int, offset: int = 0) -> Path:
    rows = []
    for i in range(n):
        fruit = FRUITS[(i + offset) % len(FRUITS)]
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": "repeat the word"},
                    {"role": "user", "content": f"say {fruit}"},
                    {"role": "assistant", "content": fruit},
                ]
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sft_lowers_held_out_loss_checkpoints_and_resumes(tmp_path: Path) -> None:
    train = write_chats(tmp_path / "train.jsonl", 24)
    held = write_chats(tmp_path / "held.jsonl", 6, offset=1)
    out = tmp_path / "run"
    args = [*FAST, f"val_dataset={held}", "val_every=3", "batch_tokens=40", "epochs=2", "total_steps=6"]
    runner = build_sft(str(train), out_dir=str(out), overrides=args)
    result = asyncio.run(runner.fit())
    assert result.steps == 6 and result.checkpoint and Path(result.checkpoint).name == "step_000006"
    rows = read_metrics(out / "metrics.jsonl")
    val = [r["val/loss"] for r in rows if "val/loss" in r]
    assert [r["step"] for r in rows if "val/loss" in r] == [0, 3, 6]
    assert val[-1] < val[0] - 0.5, val  # the held-out answers become far likelier
    assert all(r["train/num_sequences"] >= 2 for r in rows if "train/loss" in r)
    # --resume with more steps continues at step 6 with the same batch plan; history stays one curve.
    more = build_sft(str(train), out_dir=str(out), overrides=[*args[:-1], "total_steps=8"])
    resumed = asyncio.run(more.fit(resume=True, allow_changes=["total_steps"]))
    assert resumed.steps == 8
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r]
    assert steps == list(range(1, 9))


def test_cli_sft_runs_and_reports(tmp_path: Path) -> None:
    train = write_chats(tmp_path / "train.jsonl", 8)
    code = main(
        [
            "sft",
            str(train),
            "--out",
            str(tmp_path / "run"),
            *FAST,
            "batch_tokens=20",
            "total_steps=2",
            "warmup_steps=2",
        ]
    )
    assert code == 0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["train/lr_scale"] for r in rows] == [0.5, 1.0]
    assert rows[0]["train/lr"] == pytest.approx(0.005)
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "backend").is_dir()


def test_refusals_before_start(tmp_path: Path) -> None:
    train = write_chats(tmp_path / "train.jsonl", 4)
    with pytest.raises(ConfigError, match="val_dataset"):
        build_sft(str(train), out_dir=str(tmp_path / "a"), overrides=["val_every=2"])
    # A backend without the SFT hooks is refused by name, before anything starts (the remote
    # Tinker service has them: packages/rllm-backend-tinker/tests/test_tinker_remote_sft.py).
    fireworks = ["backend.name=fireworks", "backend.options.model=accounts/fireworks/models/qwen3-8b"]
    with pytest.raises(ConfigError, match=r"warmup_steps.*backend 'fireworks'.*set_learning_rate_scale"):
        build_sft(str(train), out_dir=str(tmp_path / "b"), overrides=[*fireworks, "warmup_steps=3"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main(["sft", str(bad), "--out", str(tmp_path / "c")]) != 0


def test_sft_starts_no_sampler_unless_the_config_asks(tmp_path: Path) -> None:
    train = write_chats(tmp_path / "train.jsonl", 4)
    # Supervised training samples nothing: the local service gets sampler_weights="none" (no
    # sampler engine, server or second copy of the weights; packages/rllm-backend-tinker/tests/
    # test_tinker_no_sampler.py), and a value the user set stays.
    runner = build_sft(str(train), out_dir=str(tmp_path / "a"), overrides=FAST)
    assert runner.backend.config.sampler_weights == "none"  # pyright: ignore[reportAttributeAccessIssue]
    asked = [*FAST, "backend.options.sampler_weights=shared"]
    runner = build_sft(str(train), out_dir=str(tmp_path / "a"), overrides=asked)
    assert runner.backend.config.sampler_weights == "shared"  # pyright: ignore[reportAttributeAccessIssue]


def test_batch_plan_and_schedule() -> None:
    plan = plan_batches([10, 10, 30, 5, 5], batch_tokens=20, epochs=2, seed=1)
    for epoch in (0, 1):
        seen = sorted(i for e, batch in plan if e == epoch for i in batch)
        assert seen == [0, 1, 2, 3, 4]  # every sequence once per epoch
    assert plan == plan_batches([10, 10, 30, 5, 5], batch_tokens=20, epochs=2, seed=1)
    assert [lr_scale(s, 10, 2, "linear") for s in (0, 1, 2, 6)] == [0.5, 1.0, 1.0, 0.5]
    assert lr_scale(10, 10, 0, "cosine") == pytest.approx(0.0)


def test_sft_then_rl_starts_from_the_sft_weights(tmp_path: Path) -> None:
    from rllm.engine.data.chat_data import read_chat_jsonl, tokenize_all
    from rllm.engine.data.sft_launch import load_chat_tokenizer
    from rllm.engine.plugins import load_cookbook
    from rllm.engine.training.init_from import init_weights
    from rllm.engine.training.launch import build_trainer, init_tiny_model

    model = init_tiny_model(tmp_path / "model", cookbook=load_cookbook("say-single"))
    train = write_chats(tmp_path / "train.jsonl", 12)
    held = write_chats(tmp_path / "held.jsonl", 4, offset=2)
    sft_out = tmp_path / "sft"
    sft = build_sft(
        str(train),
        model=str(model),
        out_dir=str(sft_out),
        overrides=[*FAST, f"val_dataset={held}", "val_every=2", "total_steps=2", "batch_tokens=40"],
    )
    asyncio.run(sft.fit())
    sft_val = [r["val/loss"] for r in read_metrics(sft_out / "metrics.jsonl") if "val/loss" in r]
    held_seqs = tokenize_all(load_chat_tokenizer(str(model)), read_chat_jsonl(held))
    rl = [
        *FAST,
        "plot=false",
        "tensorboard=false",
        "rollout.workers=1",
        f"backend.options.model={model}",
        "total_steps=1",
    ]

    async def held_out_loss(init: bool) -> float:
        trainer = build_trainer(
            "say-single", out_dir=str(tmp_path / "rl-probe"), overrides=[*rl, f"init_from={sft_out}"]
        )
        assert trainer.init_checkpoint == sft_out / "checkpoints" / "step_000002"
        backend = trainer.backend
        await backend.start()
        try:
            if init:
                await init_weights(backend, trainer.init_checkpoint)
            return (await backend.eval_loss(held_seqs))["loss"]  # pyright: ignore[reportAttributeAccessIssue]
        finally:
            await backend.close()

    assert asyncio.run(held_out_loss(True)) == pytest.approx(sft_val[-1], abs=1e-5)
    assert abs(asyncio.run(held_out_loss(False)) - sft_val[-1]) > 0.1  # the fresh model differs
    # The command itself: one RL step from the SFT checkpoint.
    assert main(["train", "say-single", "--out", str(tmp_path / "rl"), "--init-from", str(sft_out), *rl]) == 0
    with pytest.raises(ConfigError, match="init_from"):
        build_trainer("say-single", out_dir=str(tmp_path / "x"), overrides=[*rl, f"init_from={tmp_path}"])


def test_cli_sft_on_a_hugging_face_dataset_with_mapped_columns_and_packing(tmp_path: Path) -> None:
    """`rllm sft hf:FOLDER:SPLIT` goes through datasets.load_dataset (the hub code path) on a
    folder of parquet files built here; single-turn columns mapped; packed rows on the backend."""
    import datasets

    folder = tmp_path / "fruit-set"
    folder.mkdir()
    rows = [{"q": f"say {fruit}", "a": fruit} for fruit in FRUITS * 2]
    datasets.Dataset.from_list(rows).to_parquet(str(folder / "train.parquet"))
    datasets.Dataset.from_list(rows[:3]).to_parquet(str(folder / "test.parquet"))
    out = tmp_path / "run"
    code = main(
        [
            "sft",
            f"hf:{folder}",
            "--out",
            str(out),
            *FAST,
            "columns.prompt=q",
            "columns.response=a",
            f"val_dataset=hf:{folder}:test",
            "val_every=2",
            "total_steps=2",
            "batch_tokens=60",
            "backend.options.pack_tokens=32",
        ]
    )
    assert code == 0
    metrics = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in metrics if "val/loss" in r] == [0, 2]
    assert all(r["train/num_sequences"] >= 2 for r in metrics if "train/loss" in r)
    assert main(["sft", f"hf:{folder}", "--out", str(tmp_path / "bad"), *FAST]) != 0  # no messages column
