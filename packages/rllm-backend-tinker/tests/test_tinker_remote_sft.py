"""SFT on the remote service: the official ``tinker`` SDK over real HTTP to FakeTinkerServer
(rllm.testing.tinker). Held-out loss is a forward-only pass; the LR schedule rides on each
optim_step's Adam parameters; `rllm sft`'s runner trains, validates and checkpoints there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rllm.backends.tinker import TinkerBackend
from rllm.engine.data.sft import SFT_ALGORITHM, SFTConfig, SFTRunner
from rllm.engine.training.metrics_log import read_metrics
from rllm.testing.tinker import FAKE_API_KEY, FakeTinkerServer
from rllm.tiny.tokenizer import build_tokenizer
from rllm.types import FloatArray, TokenArray, TrainSequence

MODEL = "Qwen/Qwen3-4B-Instruct-2507"
FRUITS = ["apple", "banana", "cherry", "grape"]


# The fake Tinker service (fake_tinker) and a clean TINKER_* environment come from conftest.py.
pytestmark = pytest.mark.usefixtures("no_tinker_env")


def remote_options(server: FakeTinkerServer) -> dict[str, Any]:
    return {
        "service": "remote",
        "model": MODEL,
        "lora": {"rank": 8},
        "learning_rate": 0.05,
        "remote": {"base_url": server.url, "api_key": FAKE_API_KEY, "inference_url": "https://t.example/v1"},
    }


def sequence(tokens: list[int], prompt: int) -> TrainSequence:
    n = len(tokens)
    return TrainSequence(
        input_ids=TokenArray(tokens),
        loss_mask=FloatArray([0.0] * prompt + [1.0] * (n - prompt)),
        advantages=FloatArray([0.0] * n),
        sampler_logprobs=FloatArray([0.0] * n),
    )


def model_steps(server: FakeTinkerServer, backend: TinkerBackend, name: str) -> list[Any]:
    model_id = backend.service.training_client.model_id  # pyright: ignore[reportAttributeAccessIssue]
    return [b for b in server.bodies(name) if b.get("model_id") == model_id]


async def test_remote_eval_loss_is_the_service_models_nll_and_the_lr_scale_is_sent(
    fake_tinker: FakeTinkerServer,
) -> None:
    backend = TinkerBackend(remote_options(fake_tinker))
    await backend.start()
    try:
        model_id = backend.service.training_client.model_id  # pyright: ignore[reportAttributeAccessIssue]
        batch = [sequence([3, 9, 4, 7, 1], 2), sequence([5, 6, 2, 8], 3)]
        expected, count = 0.0, 0.0
        for seq in batch:
            logprobs = np.array(fake_tinker.model_logprobs(model_id, list(seq.input_ids)))
            mask = np.array(list(seq.loss_mask))[1:]
            expected -= float((logprobs * mask).sum())
            count += float(mask.sum())
        before = fake_tinker.models[model_id].optimizer_steps
        out = await backend.eval_loss(batch)
        assert out["num_tokens"] == count == 4.0
        assert out["loss"] == pytest.approx(expected / count, abs=1e-5)
        assert fake_tinker.models[model_id].optimizer_steps == before  # forward only: no update
        assert backend.set_learning_rate_scale(0.25) == pytest.approx(0.0125)
        metrics = await backend.train_step(batch, SFT_ALGORITHM)
        # the service's summed loss is the token-mean NLL (the datums carry the aggregation weights)
        assert metrics["loss"] == pytest.approx(expected / count, abs=1e-5)
        [step] = model_steps(fake_tinker, backend, "optim_step")
        assert step["adam_params"]["learning_rate"] == pytest.approx(0.0125)
    finally:
        await backend.close()
    assert fake_tinker.violations == []


async def test_sft_runner_on_the_remote_service_trains_validates_and_checkpoints(
    fake_tinker: FakeTinkerServer, tmp_path: Path
) -> None:
    tokenizer = build_tokenizer(["say", *FRUITS])
    chats = tmp_path / "chats.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"say {f}"}, {"role": "assistant", "content": f}]}
        for f in FRUITS
    ]
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows * 3))
    config = SFTConfig(
        dataset=str(chats),
        val_dataset=str(chats),
        val_every=2,
        warmup_steps=2,
        lr_schedule="linear",
        batch_tokens=40,
        total_steps=4,
        epochs=2,
        out_dir=str(tmp_path / "run"),
        progress=False,
    )
    backend = TinkerBackend(remote_options(fake_tinker))
    result = await SFTRunner(config, backend, tokenizer).fit()
    assert result.steps == 4 and result.checkpoint is not None
    assert (Path(result.checkpoint) / "backend" / "tinker_remote_state.json").is_file()
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    val = [r["val/loss"] for r in metrics if "val/loss" in r]
    assert [r["step"] for r in metrics if "val/loss" in r] == [0, 2, 4]
    assert val[-1] < val[0], val  # the service model learned the replies
    assert [r["train/lr_scale"] for r in metrics if "train/loss" in r] == pytest.approx([0.5, 1.0, 1.0, 0.5])
    assert fake_tinker.violations == []
