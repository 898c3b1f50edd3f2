"""`rllm export` of a verl checkpoint through verl's own FSDP merger, on the CPU.

verl's FSDP2 engine (one rank, in-process) trains the tiny model one step; ``VerlBackend``
saves the step's checkpoint (FSDP shards, ``huggingface/``) inside a Trainer checkpoint of a run
folder; ``rllm export RUN --to DIR`` gives a folder that plain transformers loads, whose
log-probs are the trainer's (to bfloat16 rounding: verl's merger writes bfloat16 weights).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

# Named on its own in the workspace env (no verl there), the file skips; nox -s verl runs it.
pytest.importorskip("verl")

import torch
from click.testing import CliRunner
from verl_helpers import LocalCluster, cpu_config, reference_log_probs, sequence

from rllm.algos import AlgorithmConfig
from rllm.backends.verl.actor import compute_log_probs
from rllm.backends.verl.backend import VerlBackend
from rllm.backends.verl.convert import to_data_proto
from rllm.backends.verl.workers import local_training_worker
from rllm.cli.main import cli
from rllm.engine.checkpoint import TrainerState, save_checkpoint

pytestmark = pytest.mark.verl

BATCH = [
    sequence([10, 11, 12, 13, 14], [0, 0, 1, 1, 1], 1.0, "a"),
    sequence([10, 11, 15, 16], [0, 0, 1, 1], -1.0, "a"),
]


def _log_probs(model_path: Path, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=dtype).float().eval()
    data = to_data_proto(BATCH, pad_token_id=0)
    with torch.no_grad():
        return reference_log_probs(model, data.batch)[0][data.batch["response_mask"].bool()]


def test_a_verl_run_exports_through_verls_merger(tiny_model_path: Path, tmp_path: Path) -> None:
    external = {"engine": "external", "server_urls": ["http://127.0.0.1:9/v1"]}  # start() is not called
    config = cpu_config(tiny_model_path, optim={"lr": 1e-2}, rollout=external)
    algo = AlgorithmConfig(loss="ppo_clip")
    backend = VerlBackend(config)
    backend.validate(algo)
    worker = local_training_worker(config)
    backend._cluster = LocalCluster(worker, algo)
    run = tmp_path / "say"
    asyncio.run(backend.train_step(BATCH, algo))
    asyncio.run(save_checkpoint(run, TrainerState(step=1), backend.save_checkpoint))
    data = to_data_proto(BATCH, pad_token_id=0)
    trained = compute_log_probs(worker, data)["log_probs"][data.batch["response_mask"].bool()]

    out = tmp_path / "exported"
    result = CliRunner().invoke(cli, ["export", str(run), "--to", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert "".join(result.stderr.split()) == "".join(f"exported say-step1 (verl checkpoint) to {out}".split())
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not list(out.glob("*.pt")) and not (out / "lora_adapter").exists()
    exported = _log_probs(out)
    # bfloat16 weights: close to the trainer's, and nearer to them than the untrained model is.
    torch.testing.assert_close(exported, trained, atol=0.05, rtol=0.0)
    initial = _log_probs(tiny_model_path)
    assert (exported - trained).abs().max() < (initial - trained).abs().max()

    # A full-weight checkpoint has no adapter to write alone.
    result = CliRunner().invoke(cli, ["export", str(run), "--to", str(tmp_path / "a"), "--adapter-only"])
    assert result.exit_code != 0 and "holds full weights, not a LoRA adapter" in result.stderr
