"""`rllm train` on a real model: one RL step of SmolLM2-135M-Instruct on the one-turn say task,
with LoRA and with full weights, at tiny settings (2 tasks x 2 samples x 16 tokens, small
micro-batches). The step trains on the tokens the sampler produced (train/sampler logprob
mismatch ~0 on a real BPE tokenizer and template) and ends with a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from rllm.cli.main import main
from rllm.engine.metrics_log import read_metrics

pytestmark = [pytest.mark.real_model, pytest.mark.slow]
TINY_RUN = [
    "total_steps=1",
    "tasks_per_step=2",
    "group_size=2",
    "rollout.workers=1",
    "rollout.sampling.max_tokens=16",
    "val_every=0",
    "progress=false",
    "plot=false",
    "tensorboard=false",
    "algorithm.filter_zero_variance=false",
    "backend.options.micro_batch_tokens=128",
    "backend.options.learning_rate=1e-5",
]


@pytest.mark.parametrize("lora_rank", [8, 0], ids=["lora", "full"])
def test_one_rl_step_on_smollm2(smollm2: Path, tmp_path: Path, lora_rank: int) -> None:
    run = tmp_path / "run"
    args = ["train", "say-single", "--out", str(run), *TINY_RUN, f"backend.options.model={smollm2}"]
    assert main([*args, f"backend.options.lora.rank={lora_rank}"]) == 0
    (row,) = read_metrics(run / "metrics.jsonl")
    assert row["step"] == 1 and row["mismatch/tokens"] > 0
    assert row["mismatch/mean_abs"] < 1e-3, row
    assert (run / "checkpoints" / "step_000001").is_dir()
