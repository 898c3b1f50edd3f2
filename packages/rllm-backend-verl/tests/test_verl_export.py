"""`rllm export` of a verl checkpoint through verl's own FSDP merger, on the CPU.

verl's FSDP2 engine (one rank, in-process) trains the tiny model one step; ``VerlBackend``
saves the step's checkpoint (FSDP shards, ``huggingface/``) inside a Trainer checkpoint of a run
folder; ``rllm export RUN --to DIR`` gives a folder that plain transformers loads, whose
log-probs are the trainer's (to bfloat16 rounding: verl's merger writes bfloat16 weights).
The same with a LoRA adapter (``lora.rank`` > 0): merged into the base, or alone in PEFT format
with ``--adapter-only``.
"""

from __future__ import annotations

import asyncio
import json
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
from rllm.engine.training.checkpoint import TrainerState, save_checkpoint

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


def _train_and_save(model: Path, run: Path, **options: object) -> torch.Tensor:
    """One verl training step on BATCH, checkpointed as step 1 of the run folder ``run``; the
    trained policy's log-probs of BATCH's sampled tokens, as the trainer computes them."""
    external = {"engine": "external", "server_urls": ["http://127.0.0.1:9/v1"]}  # start() is not called
    config = cpu_config(model, optim={"lr": 1e-2}, rollout=external, **options)
    algo = AlgorithmConfig(loss="ppo_clip")
    backend = VerlBackend(config)
    backend.validate(algo)
    worker = local_training_worker(config)
    backend._cluster = LocalCluster(worker, algo)
    asyncio.run(backend.train_step(BATCH, algo))
    asyncio.run(save_checkpoint(run, TrainerState(step=1), backend.save_checkpoint))
    data = to_data_proto(BATCH, pad_token_id=0)
    return compute_log_probs(worker, data)["log_probs"][data.batch["response_mask"].bool()]


def test_a_verl_run_exports_through_verls_merger(tiny_model_path: Path, tmp_path: Path) -> None:
    run = tmp_path / "say"
    trained = _train_and_save(tiny_model_path, run)

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


def test_a_verl_lora_run_exports_merged_and_as_a_peft_adapter(tiny_model_path: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = tmp_path / "say"
    trained = _train_and_save(tiny_model_path, run, lora={"rank": 4, "alpha": 8})
    initial = _log_probs(tiny_model_path)
    # The adapter moved the policy (else equal log-probs below would prove nothing).
    assert (initial - trained).abs().max() > 0.1

    out = tmp_path / "merged"
    result = CliRunner().invoke(cli, ["export", str(run), "--to", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    # A plain model folder: the adapter merged into the weights, no adapter files, no shards.
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not list(out.glob("adapter_*")) and not (out / "lora_adapter").exists()
    assert not list(out.glob("*.pt"))
    from safetensors.torch import load_file

    assert not [
        key for key in load_file(str(out / "model.safetensors")) if "lora_" in key or "base_layer" in key
    ]
    merged = _log_probs(out)
    # The base weights went through verl's merger in bfloat16: the trainer's log-probs to that
    # rounding, and far nearer to them than the untrained model's.
    torch.testing.assert_close(merged, trained, atol=0.02, rtol=0.0)
    assert (merged - trained).abs().max() < (initial - trained).abs().max() / 10

    adapter = tmp_path / "adapter"
    result = CliRunner().invoke(
        cli, ["export", str(run), "--to", str(adapter), "--adapter-only"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.stderr
    # The adapter's two files, and the record every writing command leaves (docs/run-folders.md).
    assert sorted(p.name for p in adapter.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "rllm-run.json",
    ]
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8)
    # PEFT loads it onto the base model, and it gives the trainer's log-probs.
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, torch_dtype=torch.float32)
    policy = PeftModel.from_pretrained(base, str(adapter)).eval()
    data = to_data_proto(BATCH, pad_token_id=0)
    with torch.no_grad():
        with_adapter = reference_log_probs(policy, data.batch)[0][data.batch["response_mask"].bool()]
    torch.testing.assert_close(with_adapter, trained, atol=0.02, rtol=0.0)
    assert (with_adapter - trained).abs().max() < (initial - trained).abs().max() / 10
