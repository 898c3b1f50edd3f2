"""Trainer building blocks: config loading/validation, data order, sequence building, checkpoints."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rllm.engine.training.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_trainer_state,
    removed_line,
    save_checkpoint,
)
from rllm.engine.training.data_order import DataCursor, next_batch
from rllm.engine.training.sequences import MissingTokensError, sequences_from_trajectory, signal_sequences
from rllm.engine.training.trainer_config import ConfigError, load_config
from rllm.types import Step, Task, Trajectory


def test_config_layers_file_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('cookbook = "say"\ntotal_steps = 5\n[algorithm]\nestimator = "rloo"\n')
    config = load_config(
        path, ["algorithm.clip_high=0.28", "rollout.sampling.temperature=0.7"], base={"seed": 3}
    )
    assert (config.total_steps, config.seed, config.algorithm.estimator) == (5, 3, "rloo")
    assert config.algorithm.clip_high == 0.28 and config.rollout.sampling.temperature == 0.7


def test_overrides_leave_the_base_defaults_untouched() -> None:
    base = {"cookbook": "say", "backend": {"name": "tinker", "options": {"learning_rate": 0.1}}}
    config = load_config(None, ["backend.name=other", "backend.options.learning_rate=0.2"], base=base)
    assert config.backend.name == "other" and config.backend.options == {"learning_rate": 0.2}
    assert base == {"cookbook": "say", "backend": {"name": "tinker", "options": {"learning_rate": 0.1}}}


def test_config_yaml(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("cookbook: say\nbackend:\n  name: tinker\n  options: {learning_rate: 0.01}\n")
    assert load_config(path).backend.options == {"learning_rate": 0.01}


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        (["algorithm.clip_hgh=0.3"], "algorithm.clip_hgh", "unknown key"),
        (["total_steps=many"], "total_steps", "Expected `int`"),
        (["rollout.sampling.top_p=3"], "rollout.sampling.top_p", "top_p"),
        (["total_steps=0"], "total_steps", "total_steps must be >= 1"),
        (["val_every=5"], "val_split", "val_split"),
        (["algorithm.estimator_by_role.judge=3"], "algorithm.estimator_by_role.judge", "Expected `str`"),
        (["nonsense"], "", "key.sub=value"),
        (["rollout.prefech=true"], "rollout.prefech", "unknown key"),
        (["rollout.prefetch=sometimes"], "rollout.prefetch", "Expected `bool`"),
    ],
)
def test_bad_config_is_refused_naming_the_key(overrides: list[str], key: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_config(None, overrides, base={"cookbook": "say"})
    assert err.value.key == key
    if key:
        assert str(err.value).startswith(f"config key `{key}`: ")


def test_missing_or_invalid_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("cookbook = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    # The format follows the suffix: nothing is read as YAML by default any more.
    odd = tmp_path / "run.cfg"
    odd.write_text("cookbook: say\n")
    with pytest.raises(ConfigError, match=r"unknown suffix '\.cfg'; accepted: \.toml, \.yaml, \.yml, \.json"):
        load_config(odd)


def test_config_json(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text('{"cookbook": "say", "algorithm": {"estimator": "rloo"}}')
    assert load_config(path, ["total_steps=4"]).algorithm.estimator == "rloo"


def test_data_order_is_seeded_and_resumable() -> None:
    tasks = [Task(id=str(i), instruction="x") for i in range(10)]
    position, seen = DataCursor(), []
    for _ in range(7):
        batch, position = next_batch(tasks, 4, seed=1, position=position)
        seen.append([t.id for t in batch])
    # Every epoch covers every task exactly once; batches spill across epochs.
    flat = [i for b in seen for i in b]
    assert sorted(flat[:10]) == sorted(flat[10:20]) == [str(i) for i in range(10)]
    # Resuming from a saved cursor reproduces the next batch exactly.
    replay = DataCursor()
    for _ in range(3):
        _, replay = next_batch(tasks, 4, seed=1, position=replay)
    resumed = DataCursor(epoch=replay.epoch, cursor=replay.cursor)
    assert [t.id for t in next_batch(tasks, 4, seed=1, position=resumed)[0]] == seen[3]
    assert seen != [[t.id for t in next_batch(tasks, 4, seed=2, position=DataCursor())[0]]]


def test_multi_turn_steps_merge_when_prompts_extend() -> None:
    s1 = Step(prompt_ids=[1, 2], completion_ids=[3, 4], completion_logprobs=[-0.1, -0.2], advantage=1.0)
    s2 = Step(prompt_ids=[1, 2, 3, 4, 9, 9], completion_ids=[5], completion_logprobs=[-0.3], advantage=[0.5])
    s3 = Step(
        prompt_ids=[7], completion_ids=[8], completion_logprobs=[-0.4], advantage=-1.0
    )  # history did not extend
    seqs = sequences_from_trajectory(Trajectory(steps=[s1, s2, s3]), "g")
    assert len(seqs) == 2
    merged = seqs[0]
    assert list(merged.input_ids) == [1, 2, 3, 4, 9, 9, 5]
    assert list(merged.loss_mask) == [0, 0, 1, 1, 0, 0, 1]
    assert list(merged.advantages) == [0, 0, 1, 1, 0, 0, 0.5]
    assert [round(x, 3) for x in merged.sampler_logprobs] == [0, 0, -0.1, -0.2, 0, 0, -0.3]
    assert list(seqs[1].input_ids) == [7, 8] and list(seqs[1].loss_mask) == [0, 1]


def test_signal_sequences_counts_a_nonzero_advantage_at_a_trained_token() -> None:
    def sequence(advantage: float | list[float], completion: list[int]) -> list:
        step = Step(
            prompt_ids=[1, 2], completion_ids=completion, completion_logprobs=[-0.1] * len(completion),
            advantage=advantage,
        )  # fmt: skip
        return sequences_from_trajectory(Trajectory(steps=[step]), "g")

    flat, zero, mixed = sequence(1.0, [3, 4]), sequence(0.0, [3, 4]), sequence([0.0, -0.5], [3, 4])
    assert signal_sequences(flat + zero + mixed) == 2
    assert signal_sequences(zero + zero) == 0 and signal_sequences([]) == 0


def test_steps_without_tokens_are_refused() -> None:
    with pytest.raises(MissingTokensError, match="step 0"):
        sequences_from_trajectory(Trajectory(steps=[Step(advantage=1.0)]))


def test_checkpoints_are_atomic_and_pruned(tmp_path: Path) -> None:
    async def save_backend(path: Path) -> None:
        (path / "weights.bin").write_bytes(b"w")

    async def run() -> None:
        for step in (2, 4, 6):
            await save_checkpoint(
                tmp_path, TrainerState(step=step, data=DataCursor(epoch=1, cursor=step)), save_backend
            )

    asyncio.run(run())
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step_000006"
    assert load_trainer_state(latest).data == DataCursor(epoch=1, cursor=6)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000004", "step_000006"]
    # A half-written checkpoint (no trainer_state.json yet) is never picked.
    (tmp_path / "checkpoints" / "step_000008.tmp" / "backend").mkdir(parents=True)
    assert latest_checkpoint(tmp_path).name == "step_000006"


def test_checkpoints_past_keep_are_removed_and_each_removal_is_reported(tmp_path: Path) -> None:
    async def save_backend(path: Path) -> None:
        (path / "weights").write_text("w")

    removed: list[str] = []

    async def run() -> None:
        for step in (1, 2, 3):
            await save_checkpoint(
                tmp_path,
                TrainerState(step=step),
                save_backend,
                keep=1,
                removed=lambda p: removed.append(p.name),
            )

    asyncio.run(run())
    assert removed == ["step_000001", "step_000002"]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000003"]
    assert removed_line(tmp_path / "step_000001", 1).endswith(
        "step_000001 removed (keep_checkpoints=1 keeps the newest 1)"
    )


def test_sequences_carry_their_images_in_prompt_order():
    from rllm.types import Message, convert
    from rllm.types.images import intern_images

    a, b = "data:image/png;base64,AAAA", "data:image/png;base64,BBBB"

    def user(*urls: str) -> dict:
        return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in urls]}

    first = convert([user(a)], list[Message])
    second = convert([user(a), {"role": "assistant", "content": "x"}, user(b, a)], list[Message])
    steps = []
    for k, (msgs, prompt) in enumerate([(first, [1, 2]), (second, [1, 2, 3, 4, 5])]):
        interned, images = intern_images(msgs)
        response = [3] if k == 0 else [6]
        steps.append(
            Step(
                input=interned,
                images=images,
                prompt_ids=prompt,
                completion_ids=response,
                completion_logprobs=[-0.1],
                advantage=1.0,
            )
        )
    (seq,) = sequences_from_trajectory(Trajectory(steps=steps))
    assert seq.images == [a, b, a]


async def test_a_swallowed_ctrl_c_still_stops_the_run_at_the_next_step() -> None:
    """Ctrl-C cancels the main task; when something on the way swallows the CancelledError (as
    Python 3.11's wait_for can), the training loop still stops instead of running to its end."""
    from rllm.engine.training.trainer import _stop_if_cancel_requested

    started = asyncio.Event()

    async def step_loop() -> str:
        try:
            started.set()
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            pass  # swallowed
        _stop_if_cancel_requested()
        return "ran to the end"

    task = asyncio.create_task(step_loop())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
