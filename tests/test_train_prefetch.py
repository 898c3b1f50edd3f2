"""rollout.prefetch end to end on CPU: the tiny model, the say cookbook, the real gateway, rollout
engine, sampler server and optimizer.

Step N+1's rollouts start while step N trains; their calls wait at the gateway's door until the
new weights are in. Shown here: every prefetched trace carries the new weight version and the
trainer's logprobs match the sampler's; prefetch on and off train identically; a failed train
step, a token-truth refusal and Ctrl-C each cancel the prefetched rollouts with no session left.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.training.checkpoint import latest_checkpoint
from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_episode_sample, read_metrics, sample_path
from rllm.engine.training.mismatch import TokenMismatchError
from rllm.engine.training.trainer import Trainer
from rllm.gateway.calls import CallLedger
from rllm.types import FloatArray, TrainSequence

pytestmark = pytest.mark.slow

FAST = [
    "progress=false",
    "plot=false",
    "tensorboard=false",
    "val_every=0",
    "ckpt_every=0",
    "tasks_per_step=4",
    "group_size=4",
    "rollout.workers=1",
    "rollout.prefetch=true",  # off by default (benchmarks/history/issue-35.md, "#35 round 9")
    # A random model rarely scores: keep every group so each step trains (and syncs).
    "algorithm.filter_zero_variance=false",
]
CALLS_PER_STEP = 16  # say-single: one call per rollout, 4 tasks x 4


def test_prefetched_rollouts_sample_the_new_weights_token_for_token(tmp_path: Path) -> None:
    trainer = build_trainer(
        "say-single", out_dir=str(tmp_path), overrides=[*FAST, "total_steps=4", "sample_groups=4"]
    )
    assert trainer.config.rollout.prefetch
    asyncio.run(trainer.fit())
    rows = read_metrics(tmp_path / "metrics.jsonl")
    # Step 1 starts cold; steps 2-4 ran while the step before them trained.
    assert [row["rollout/prefetched"] for row in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [row["weight_version"] for row in rows] == [1, 2, 3, 4]
    for step, row in enumerate(rows, start=1):
        assert row["mismatch/mean_abs"] < 1e-3, row
        sample = read_episode_sample(sample_path(tmp_path, step))
        steps = [s for e in sample.episodes for t in e.trajectories for s in t.steps]
        assert len(steps) == CALLS_PER_STEP
        # Every call of step N was sampled on the weights of update N - 1, though it started
        # before that update was trained.
        assert {s.weight_version for s in steps} == {step - 1}
        for s in steps:
            assert s.completion_logprobs is not None
            assert s.metadata["train_logprobs"] == pytest.approx(list(s.completion_logprobs), abs=1e-2)


# One request per sampler forward and seeded sampling: two runs see the same tokens.
DETERMINISTIC = [
    *FAST,
    "seed=0",
    "total_steps=3",
    "rollout.sampling.seed=7",
    "backend.options.sampler_max_batch=1",
]


def test_prefetch_on_and_off_train_identically(tmp_path: Path) -> None:
    runs: dict[str, list[dict[str, Any]]] = {}
    for name in ("off", "on"):
        built = build_trainer(
            "say-single",
            out_dir=str(tmp_path / name),
            overrides=[*DETERMINISTIC, f"rollout.prefetch={'true' if name == 'on' else 'false'}"],
        )
        asyncio.run(built.fit())
        runs[name] = read_metrics(tmp_path / name / "metrics.jsonl")
    keys = ("batch/", "advantage/", "train/", "reward/", "weight_version", "mismatch/tokens")

    def per_step(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in r.items() if k.startswith(keys) and not k.endswith(("_s", "_gb"))} for r in rows
        ]

    assert len(runs["on"]) == 3
    assert per_step(runs["on"]) == per_step(runs["off"])
    assert [r["rollout/prefetched"] for r in runs["off"]] == [0.0, 0.0, 0.0]
    weights = []
    for name in ("off", "on"):
        ckpt = latest_checkpoint(tmp_path / name)
        assert ckpt is not None
        weights.append(load_file(str(ckpt / "backend" / "model.safetensors")))
    assert weights[0].keys() == weights[1].keys()
    assert all(weights[0][k].equal(weights[1][k]) for k in weights[0])


class Door:
    """Counts the calls that wait at a paused gateway's door (``CallLedger.wait_admitted``, the
    real one, wrapped) and sets ``full`` when ``expected`` of them wait."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, expected: int) -> None:
        self.waiting = 0
        self.full = asyncio.Event()
        inner = CallLedger.wait_admitted
        door = self

        async def wait_admitted(ledger: CallLedger, parsed: Any) -> None:
            if not ledger.admitting:
                door.waiting += 1
                if door.waiting >= expected:
                    door.full.set()
            await inner(ledger, parsed)

        monkeypatch.setattr(CallLedger, "wait_admitted", wait_admitted)


class WatchedTrainer(Trainer):
    """Records, when a prefetch is cancelled, its rollouts' task and the gateway's open sessions."""

    engine: RolloutEngine
    cancelled: asyncio.Task[Any] | None = None
    sessions_left: list[dict[str, Any]] | None = None

    async def _loop(self, engine: RolloutEngine, state: Any) -> list[float]:
        self.engine = engine
        return await super()._loop(engine, state)

    async def _cancel_prefetch(self) -> None:
        prefetch = self._prefetch
        await super()._cancel_prefetch()
        if prefetch is not None:
            self.cancelled = prefetch.rollouts
            self.sessions_left = await self.engine.client.list_sessions()


class DoorBackend(TinkerBackend):
    """The local backend; its first train step waits until the next step's calls are all at the
    door, then does what ``failure`` says: ``raise``, ``mismatch`` (trains, then reports trainer
    logprobs 1 nat off the sampler's) or ``cancel`` (Ctrl-C: cancels the run's main task)."""

    door: Door
    failure: str
    main: asyncio.Task[Any] | None = None

    async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        await self.door.full.wait()
        if self.failure == "raise":
            raise RuntimeError("the train step failed (on purpose)")
        if self.failure == "cancel":
            assert self.main is not None
            self.main.cancel()
            await asyncio.Event().wait()  # the cancellation lands here, as Ctrl-C's would
        metrics = await super().train_step(batch, algo)
        for seq in batch:
            assert seq.trainer_logprobs is not None
            seq.trainer_logprobs = FloatArray(x + 1.0 for x in seq.trainer_logprobs)
        return metrics


def _run_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str, extra: list[str]
) -> tuple[WatchedTrainer, BaseException]:
    built = build_trainer("say-single", out_dir=str(tmp_path), overrides=[*FAST, "total_steps=3", *extra])
    backend = DoorBackend(built.backend.config)  # pyright: ignore[reportAttributeAccessIssue]
    backend.door = Door(monkeypatch, CALLS_PER_STEP)
    backend.failure = failure
    trainer = WatchedTrainer(built.config, built.cookbook, backend)

    async def main() -> None:
        backend.main = asyncio.current_task()
        await trainer.fit()

    with pytest.raises(BaseException) as err:
        asyncio.run(main())
    # The next step's rollouts were cancelled while their calls waited, and took their
    # sessions with them.
    assert trainer.cancelled is not None and trainer.cancelled.cancelled()
    assert trainer.sessions_left == []
    assert backend.door.waiting == CALLS_PER_STEP
    return trainer, err.value


def _no_rows(out: Path) -> bool:
    path = out / "metrics.jsonl"
    return not path.exists() or not read_metrics(path)


def test_a_failed_train_step_cancels_the_prefetched_rollouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, error = _run_failing(tmp_path, monkeypatch, "raise", [])
    assert isinstance(error, RuntimeError) and "on purpose" in str(error)
    assert _no_rows(tmp_path)
    assert not sample_path(tmp_path, 1).exists() and not sample_path(tmp_path, 2).exists()
    assert latest_checkpoint(tmp_path) is None


def test_a_token_truth_refusal_cancels_the_prefetched_rollouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, error = _run_failing(tmp_path, monkeypatch, "mismatch", ["algorithm.max_mismatch=0.05"])
    assert isinstance(error, TokenMismatchError)
    assert str(error).startswith("step 1: train/sampler mismatch ")
    # As without prefetch: step 1's sample is written (the viewer shows the drift), nothing after.
    assert sample_path(tmp_path, 1).exists() and not sample_path(tmp_path, 2).exists()
    assert _no_rows(tmp_path)


def test_ctrl_c_during_the_train_step_cancels_the_prefetched_rollouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, error = _run_failing(tmp_path, monkeypatch, "cancel", [])
    assert isinstance(error, asyncio.CancelledError)
    # Interrupted mid-update: no checkpoint (the weights may be ahead of the state), as without
    # prefetch, and no row for the step.
    assert latest_checkpoint(tmp_path) is None
    assert not trainer.interrupt_reported
    assert _no_rows(tmp_path)


def test_no_prefetch_across_validation_checkpoints_or_the_last_step(tmp_path: Path) -> None:
    trainer = build_trainer(
        "say-single",
        out_dir=str(tmp_path),
        overrides=[
            *FAST,
            "total_steps=6",
            "val_split=test",
            "val_tasks=2",
            "val_every=2",
            "ckpt_every=3",
            "sample_groups=0",
        ],
    )
    asyncio.run(trainer.fit())
    rows = read_metrics(tmp_path / "metrics.jsonl")[1:]  # row 0: the validation before step 1
    # Step 3 follows step 2's validation, step 4 step 3's checkpoint, step 5 step 4's validation.
    assert [row["rollout/prefetched"] for row in rows] == [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert [row["weight_version"] for row in rows] == [1, 2, 3, 4, 5, 6]


class RenamingBackend(TinkerBackend):
    """The local backend under a new model name after every sync, as Tinker's remote service
    names each synced sampler checkpoint (the gateway maps any name to what the sampler serves)."""

    syncs = 0

    def served_model_name(self) -> str:
        return f"{super().served_model_name()}@{self.syncs}"

    async def sync_weights(self) -> int:
        version = await super().sync_weights()
        self.syncs += 1
        return version


def test_a_backend_that_renames_its_model_at_each_sync_stops_prefetching(tmp_path: Path) -> None:
    built = build_trainer(
        "say-single", out_dir=str(tmp_path), overrides=[*FAST, "total_steps=3", "sample_groups=4"]
    )
    backend = RenamingBackend(built.backend.config)  # pyright: ignore[reportAttributeAccessIssue]
    trainer = WatchedTrainer(built.config, built.cookbook, backend)
    asyncio.run(trainer.fit())
    # Step 2's rollouts, prefetched under the old name, were cancelled at the first sync (before
    # any of their calls was let in) and run again under the new one; no prefetch after that.
    assert trainer.cancelled is not None and trainer.cancelled.cancelled()
    assert trainer.sessions_left == []
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [row["rollout/prefetched"] for row in rows] == [0.0, 0.0, 0.0]
    assert [row["weight_version"] for row in rows] == [1, 2, 3]
    for step in (1, 2, 3):
        sample = read_episode_sample(sample_path(tmp_path, step))
        assert {s.weight_version for e in sample.episodes for t in e.trajectories for s in t.steps} == {
            step - 1
        }
