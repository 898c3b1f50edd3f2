"""`rllm train say` runs its rollouts with the same settings whether they come from the trainer's
defaults, the cookbook's train_defaults or overrides: pinned as the engine receives them."""

from __future__ import annotations

from pathlib import Path

import pytest

from rllm.engine.plugins import load_cookbook
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.training.trainer_config import TrainerConfig, load_config, training_rollout
from rllm.types import ConfigError, SamplingParams


def say_config(overrides: list[str] = (), path: Path | None = None) -> TrainerConfig:
    """Layered as ``rllm train say`` layers it (rllm.engine.training.launch.build_trainer)."""
    cookbook = load_cookbook("say")
    base = {"out_dir": "runs/say", **cookbook.train_defaults, "cookbook": "say"}
    return load_config(path, list(overrides), base=base)


def test_say_rollouts_as_the_engine_gets_them() -> None:
    engine = say_config().engine_rollout("policy")
    assert engine == RolloutConfig(
        concurrency=64,
        workers=2,
        deadline_s=120.0,
        max_retries=1,
        sampling=SamplingParams(temperature=1.0, max_tokens=2),
        val_sampling=SamplingParams(temperature=0.0),
        sandbox_backend="bubblewrap",
        sandbox_warm=0,
        model="policy",
        progress=False,
    )
    # Everything else is the engine's own default.
    assert (engine.n, engine.retry_backoff_s, engine.eval_timeout_s, engine.gc_gen0_threshold) == (
        1,
        1.0,
        300.0,
        50_000,
    )


def test_overrides_and_files_reach_the_engine(tmp_path: Path) -> None:
    engine = say_config(["rollout.concurrency=32", "rollout.sampling.max_tokens=4"]).engine_rollout("m")
    assert engine.concurrency == 32 and engine.sampling == SamplingParams(temperature=1.0, max_tokens=4)
    assert (engine.deadline_s, engine.max_retries, engine.workers) == (120.0, 1, 2)
    consent = say_config(["sandbox.allow_task_network=true"]).engine_rollout("m")
    assert consent.sandbox_allow_task_network and not engine.sandbox_allow_task_network
    path = tmp_path / "run.yaml"
    path.write_text("rollout:\n  deadline_s: 30\n  worker_prefetch: 3\n")
    engine = say_config(path=path).engine_rollout("m")
    assert (engine.deadline_s, engine.worker_prefetch, engine.max_retries) == (30.0, 3, 1)


def test_a_config_without_a_rollout_section_gets_the_training_defaults() -> None:
    assert TrainerConfig(cookbook="say").rollout == training_rollout()
    assert load_config(None, base={"cookbook": "say"}).rollout == training_rollout()
    rollout = training_rollout()
    assert (rollout.deadline_s, rollout.max_retries) == (120.0, 1)
    assert (rollout.sampling.temperature, rollout.val_sampling.temperature) == (1.0, 0.0)


@pytest.mark.parametrize(
    ("key", "instead"), [("n", "group_size"), ("model", "model"), ("progress", "progress")]
)
def test_what_the_trainer_decides_is_refused_in_the_rollout_section(key: str, instead: str) -> None:
    with pytest.raises(ConfigError, match=instead) as err:
        say_config([f"rollout.{key}=1"])
    assert err.value.key == f"rollout.{key}"


def test_bad_rollout_values_name_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        say_config(["rollout.concurrency=0"])
    assert err.value.key == "rollout.concurrency"


def test_the_old_consent_key_is_refused_naming_the_new_one(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"^config key `rollout.sandbox_allow_task_network`: moved to sandbox.allow_task_network; use that key$",
    ):
        say_config(["rollout.sandbox_allow_task_network=true"])
    path = tmp_path / "run.toml"
    path.write_text("[rollout]\nsandbox_allow_task_network = false\n")
    with pytest.raises(ConfigError, match=r"moved to sandbox\.allow_task_network"):
        say_config(path=path)
