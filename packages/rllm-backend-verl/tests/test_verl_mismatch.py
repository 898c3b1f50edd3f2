"""Token truth on verl: ``VerlBackend.train_step`` writes the old log-probs verl's engine computes
back onto each TrainSequence (through convert.py's row layout), so the engine's mismatch metrics
and ``algorithm.max_mismatch`` work as on the local backend.

verl's FSDP2 engine runs in-process on the CPU (one rank, gloo); only the Ray cluster is replaced
by ``verl_helpers.LocalCluster``, which hands the backend that worker. The sampler is a plain transformers
forward of the same tiny model (healthy: its log-probs of the ids it reports), or a corrupted one
that reports the log-probs of other ids than the ones it returns.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Named on its own in the workspace env (no verl there), the file skips; nox -s verl runs it.
pytest.importorskip("verl")

import torch
from verl_helpers import LocalCluster, cpu_config

from rllm.algos import AlgorithmConfig
from rllm.backends.verl.backend import VerlBackend
from rllm.backends.verl.workers import local_training_worker
from rllm.engine.training.mismatch import TokenMismatchError, check_mismatch, measure_mismatch
from rllm.engine.training.sequences import sequences_from_trajectory
from rllm.types import Episode, FloatArray, Step, TokenArray, Trajectory

pytestmark = pytest.mark.verl

# (prompt, completion) per turn: turns 0 and 1 extend each other (one row whose response holds the
# observation token 15 with mask 0), turn 2 starts a new segment (a second row).
TURNS = [([10, 11], [12, 13]), ([10, 11, 12, 13, 15], [16, 14]), ([11, 17], [12])]


@pytest.fixture(scope="module")
def policy(tiny_model_path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, torch_dtype=torch.float32).eval()


def _logprobs(policy: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """[len(completion), vocab] log-probs of the policy at each completion position."""
    with torch.no_grad():
        logits = policy(input_ids=torch.tensor([prompt + completion])).logits.float()
    return torch.log_softmax(logits[0, len(prompt) - 1 : -1], -1)


def _episode(policy: torch.nn.Module, *, corrupt: bool = False) -> Episode:
    steps = []
    for turn, (prompt, completion) in enumerate(TURNS):
        table = _logprobs(policy, prompt, completion)
        scored = list(completion)
        if corrupt and turn == 1:
            # The corrupted sampler's text is another token than the id it returns: it reports the
            # log-prob of the token least like the returned one's.
            scored = [int((table[k] - table[k, t]).abs().argmax()) for k, t in enumerate(completion)]
        logprobs = table.gather(-1, torch.tensor(scored)[:, None])[:, 0]
        steps.append(
            Step(
                prompt_ids=TokenArray(prompt),
                completion_ids=TokenArray(completion),
                completion_logprobs=FloatArray(logprobs.tolist()),
                advantage=1.0,
            )
        )
    return Episode(task_id="t0", trajectories=[Trajectory(role="solver", steps=steps)])


async def _train_step(backend: VerlBackend, episode: Episode, algo: AlgorithmConfig):
    sequences = sequences_from_trajectory(episode.trajectories[0])
    assert len(sequences) == 2 and all(seq.trainer_logprobs is None for seq in sequences)
    metrics = await backend.train_step(sequences, algo)
    assert "actor/loss" in metrics
    return sequences, measure_mismatch(sequences, [episode])


@pytest.fixture(scope="module")
def backend(tiny_model_path: Path) -> VerlBackend:
    # A learning rate so small that every step sees the sampler's weights (the tests' order is free).
    # The CPU takes external rollout servers; this test samples without one (start() is not called).
    external = {"engine": "external", "server_urls": ["http://127.0.0.1:9/v1"]}
    config = cpu_config(tiny_model_path, optim={"lr": 1e-9}, micro_batch_size_per_gpu=1, rollout=external)
    algo = AlgorithmConfig(loss="ppo_clip", max_mismatch=0.05)
    backend = VerlBackend(config)
    backend.validate(algo)  # max_mismatch is no longer refused: verl records the trainer's logprobs
    backend._cluster = LocalCluster(local_training_worker(config), algo)
    return backend


async def test_healthy_sampler_measures_no_mismatch_on_verl(backend: VerlBackend, policy) -> None:
    episode = _episode(policy)
    algo = AlgorithmConfig(loss="ppo_clip", max_mismatch=0.05)
    sequences, report = await _train_step(backend, episode, algo)
    # The trainer's log-probs sit at the sampled tokens of input_ids (0 elsewhere, the observation too).
    for seq in sequences:
        assert seq.trainer_logprobs is not None
        for value, mask in zip(seq.trainer_logprobs, seq.loss_mask, strict=True):
            assert (value != 0.0) == (mask == 1.0)
    steps = episode.trajectories[0].steps
    for step in steps:
        assert step.completion_logprobs is not None
        assert step.metadata["train_logprobs"] == pytest.approx(list(step.completion_logprobs), abs=1e-4)
    assert report.recorded and report.metrics["mismatch/tokens"] == 5
    assert report.metrics["mismatch/mean_abs"] < 1e-3
    assert report.metrics["mismatch/frac_over_0.5"] == 0.0
    check_mismatch(report, algo.max_mismatch, step=1, backend=backend.name)


async def test_a_corrupted_sampler_is_caught_on_verl(backend: VerlBackend, policy) -> None:
    episode = _episode(policy, corrupt=True)
    algo = AlgorithmConfig(loss="ppo_clip", max_mismatch=0.05)
    _, report = await _train_step(backend, episode, algo)
    assert report.metrics["mismatch/mean_abs"] > 0.05
    assert report.metrics["mismatch/max_abs"] > 0.5
    drift = report.first_drift
    assert drift is not None and drift.turn == 1 and drift.token_id in TURNS[1][1]
    with pytest.raises(TokenMismatchError, match=r"^step 4: train/sampler mismatch .*'solver', turn 1"):
        check_mismatch(report, algo.max_mismatch, step=4, backend=backend.name)


async def test_a_supervised_loss_still_records_the_trainer_logprobs(backend: VerlBackend, policy) -> None:
    # cross_entropy needs no old log-probs for its loss; they are computed for the mismatch anyway.
    episode = _episode(policy)
    _, report = await _train_step(backend, episode, AlgorithmConfig(loss="cross_entropy"))
    assert report.recorded and report.metrics["mismatch/mean_abs"] < 1e-3
