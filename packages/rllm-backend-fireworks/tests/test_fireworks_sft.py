"""Plain SFT (`rllm sft --backend fireworks`) against the loopback FAKE of the Fireworks service
(rllm.testing.fireworks: a bigram model per trainer job, not the real service): cross entropy
through ``forward_backward_custom``, an optimizer step per batch, the loss going down, a
checkpoint the fireworks backend can load, and nothing left provisioned."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from fireworks_helpers import options

from rllm.engine.data.sft_launch import build_sft
from rllm.engine.training.metrics_log import read_metrics
from rllm.testing.chat_tokenizer import build_tiny_chat_tokenizer
from rllm.testing.fireworks import FakeFireworksServer

VOCAB = 400  # the tiny chat tokenizer's size; the fake's bigram table covers every id


def _chats(path: Path) -> Path:
    rows = [
        {"messages": [{"role": "user", "content": f"echo: {w}"}, {"role": "assistant", "content": w}]}
        for w in ["hello world", "the quick fox", "lazy dog", "forty two"] * 2
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_sft_on_the_fake_fireworks_service(tmp_path: Path) -> None:
    tokenizer = build_tiny_chat_tokenizer(str(tmp_path / "tok"), vocab_size=VOCAB)
    with FakeFireworksServer(vocab_size=VOCAB) as server:
        flags = [f"backend.options.{k}={v}" for k, v in options(server, tokenizer=tokenizer).items()]
        runner = build_sft(
            str(_chats(tmp_path / "chats.jsonl")),
            backend="fireworks",
            out_dir=str(tmp_path / "run"),
            overrides=[*flags, "epochs=6", "batch_tokens=64", "progress=false"],
        )
        result = asyncio.run(runner.fit())
        assert result.steps == len(runner.plan) >= 6
        (model,) = server.models.values()
        assert model.optimizer_steps == result.steps  # one optimizer step per SFT batch
        rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
        losses = [row["train/loss"] for row in rows]
        assert len(losses) == result.steps and sum(losses[-3:]) < sum(losses[:3])
        assert result.checkpoint is not None
        state = json.loads((Path(result.checkpoint) / "backend" / "fireworks_state.json").read_text())
        assert state["optimizer_steps"] == result.steps
        assert server.violations == []
        assert server.jobs == {} and server.deployments == {}  # what start() created is gone
