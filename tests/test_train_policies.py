"""Two policies in one training run, end to end on CPU: the solver-judge cookbook (unchanged)
through the real gateway, rollout engine, local sampler and trainer, its judge role on its own
LoRA adapter, the solvers on the default one; synchronous and asynchronous (K = 1)."""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from rllm.backends.tinker.local import policies as multi
from rllm.cli.main import main
from rllm.engine.plugins import load_cookbook
from rllm.engine.training import launch
from rllm.engine.training.checkpoint import checkpoint_dir
from rllm.engine.training.health import HealthStop
from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_episode_sample, read_metrics, sample_path
from rllm.engine.training.mismatch import TokenMismatchError
from rllm.engine.training.trainer_config import load_config
from rllm.sdk.cookbook import Cookbook
from rllm.sdk.evaluator import evaluator
from rllm.types import ConfigError, Episode, EvalOutput, Task

sys.path.insert(0, str(Path(__file__).parent))  # importlib mode: the helper beside this file
from corrupting_proxy import CorruptedSamplerBackend

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TWO_POLICIES = ["backend.options.lora.rank=4", "policies.judge.learning_rate=0.02", "roles.judge=judge"]
FAST = [
    "progress=false",
    "plot=false",
    "tensorboard=false",
    "total_steps=2",
    "tasks_per_step=2",
    "group_size=2",
    "val_every=0",
    "rollout.sampling.max_tokens=6",
    "sample_groups=2",
    "algorithm.filter_zero_variance=false",
]


def _run(out: Path, *overrides: str) -> list[dict]:
    trainer = build_trainer("solver-judge", out_dir=str(out), overrides=[*FAST, *TWO_POLICIES, *overrides])
    asyncio.run(trainer.fit())
    rows = read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    return rows


@pytest.mark.parametrize("staleness", [0, 1])
def test_two_policies_train_in_one_run(tmp_path: Path, staleness: int) -> None:
    rows = _run(tmp_path, f"rollout.max_staleness={staleness}")
    for row in rows:
        # Every step updated both policies, each from its own roles' sequences.
        assert row["policy/judge/train/sequences"] == row["episodes"]
        assert row["policy/default/train/sequences"] == 2 * row["episodes"]
        assert row["policy/judge/train/lr"] == pytest.approx(0.02)
        assert row["policy/default/train/lr"] != pytest.approx(0.02)
        assert "policy/judge/advantage/judge/mean" in row and "policy/default/advantage/solver_0/mean" in row
        # Train/sampler mismatch per policy: each over its own roles' tokens, together the run's.
        tokens = {name: row.get(f"policy/{name}/mismatch/tokens", 0.0) for name in ("default", "judge")}
        assert sum(tokens.values()) == row.get("mismatch/tokens", 0.0)
        if staleness == 0:  # (K = 1 leaves out the tokens an older version sampled)
            assert min(tokens.values()) > 0, row
            assert (
                row["policy/judge/mismatch/mean_abs"] < 1e-3
                and row["policy/default/mismatch/mean_abs"] < 1e-3
            )
    sample = read_episode_sample(sample_path(tmp_path, 2))
    answered = {
        (t.role, s.metadata.get("policy")) for e in sample.episodes for t in e.trajectories for s in t.steps
    }
    assert answered == {("judge", "judge"), ("solver_0", "default"), ("solver_1", "default")}
    # The judge's calls were sampled by the judge's adapter (the sampler answers under its name).
    models = {(t.role, s.metadata["model"]) for e in sample.episodes for t in e.trajectories for s in t.steps}
    assert {m for r, m in models if r == "judge"} == {"judge"}
    assert "judge" not in {m for r, m in models if r != "judge"}
    checkpoint = checkpoint_dir(tmp_path, 2) / "backend"
    assert (checkpoint / "policies" / "judge" / "adapter_model.safetensors").is_file()
    if staleness == 0:
        # `rllm export --policy NAME`: that policy's adapter; an unknown policy is refused by name.
        exported = tmp_path / "judge"
        assert (
            main(["export", str(tmp_path), "--policy", "judge", "--adapter-only", "--to", str(exported)]) == 0
        )
        weights = "adapter_model.safetensors"
        assert (exported / weights).read_bytes() == (checkpoint / "policies" / "judge" / weights).read_bytes()
        assert not (exported / "optimizer.pt").exists()
        merged = tmp_path / "judge-merged"
        assert main(["export", str(tmp_path), "--policy", "judge", "--to", str(merged)]) == 0
        assert (merged / "config.json").is_file()
        assert main(["export", str(tmp_path), "--policy", "jduge", "--to", str(tmp_path / "x")]) != 0
        # `rllm serve RUN`: every adapter, each under its policy's name.
        served, answered_as = _serve_and_ask(tmp_path, "judge")
        assert "judge" in served and len(served) == 2 and answered_as == "judge"
        # --resume: every adapter back from the checkpoint (bitwise: test_tinker_policies.py), one more step.
        resumed = build_trainer(
            "solver-judge",
            out_dir=str(tmp_path),
            overrides=[*FAST, *TWO_POLICIES, "total_steps=3"],
            resume=True,
            allow_changes=("total_steps",),
        )
        asyncio.run(resumed.fit(resume=True, allow_changes=("total_steps",)))
        last = read_metrics(tmp_path / "metrics.jsonl")[-1]
        assert last["step"] == 3 and last["policy/judge/train/sequences"] == last["episodes"]


def test_a_corrupted_policy_sampler_stops_the_run_naming_that_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The judge's sampler answers with wrong token ids (tests/corrupting_proxy.py), the solvers'
    # (the default policy's) with true ones: algorithm.max_mismatch is checked for each policy on
    # its own tokens, so the line names the judge's policy, not a mean over both.
    monkeypatch.setattr(launch, "backend_class", lambda name: JudgeSamplerCorrupted)
    overrides = [*FAST, *TWO_POLICIES, "algorithm.max_mismatch=0.05", "ckpt_every=0"]
    code = main(["train", "solver-judge", "--out", str(tmp_path), *overrides])
    err = capsys.readouterr().err
    assert code == 1, err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    prefix = f"error: {TokenMismatchError.__name__}: step 1: policy 'judge''s train/sampler mismatch "
    assert line.startswith(prefix), line
    assert "first drifting token: role 'judge'" in line
    assert not (tmp_path / "metrics.jsonl").exists() or not read_metrics(tmp_path / "metrics.jsonl")


class JudgeSamplerCorrupted(CorruptedSamplerBackend):
    only = "judge"  # the judge policy's model name (its adapter is served under it)


@evaluator
def paid_for_odd_lengths(task: Task, episode: Episode) -> EvalOutput:
    """Each role paid for an odd-length reply: about half of a random model's, so both roles'
    groups carry a learning signal and both adapters move every step."""
    rewards = {role: float(len(str(episode.artifacts.get(role, ""))) % 2) for role in ("speaker", "repeater")}
    return EvalOutput(reward=statistics.fmean(rewards.values()), trajectory_rewards=rewards)


def test_an_adapter_whose_sync_never_loads_is_named_by_weights_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # say-duo's flow, its repeater on its own adapter; a test double of the weight sync copies
    # every adapter into its sampler but the repeater's (the versions still advance). Each policy
    # has its own probe set, scored under its own model name: the repeater's is the one that stays.
    copy = multi.copy_adapter

    def all_but_the_repeaters(source: Any, target: Any, names: list[str]) -> None:
        if not any(".repeater." in name for name in names):
            copy(source, target, names)

    monkeypatch.setattr(multi, "copy_adapter", all_but_the_repeaters)
    duo = load_cookbook("say-duo")
    cookbook = Cookbook(
        name="duo-parity",
        flow=duo.flow,
        evaluator=paid_for_odd_lengths,
        load_tasks=duo.load_tasks,
        train_defaults=duo.train_defaults,
    )
    overrides = [
        *FAST[:4],
        "total_steps=4",
        "tasks_per_step=4",
        "group_size=4",
        "val_every=0",
        "ckpt_every=0",
        "rollout.sampling.max_tokens=2",
        "backend.options.lora.rank=4",
        "backend.options.learning_rate=5e-3",
        "policies.repeater.learning_rate=5e-3",
        "roles.repeater=repeater",
        "health.stop_on=[weights_stale]",
        "rollout.workers=1",  # the flows in this process: the evaluator is defined here
    ]
    trainer = build_trainer("duo-parity", cookbook=cookbook, out_dir=str(tmp_path), overrides=overrides)
    with pytest.raises(HealthStop, match=r"weights_stale.*policy 'repeater': ") as stopped:
        asyncio.run(trainer.fit())
    assert "policy 'default'" not in str(stopped.value), stopped.value
    rows = read_metrics(tmp_path / "metrics.jsonl")
    moved = [
        row["policy/default/probe/logprob_change"]
        for row in rows
        if "policy/default/probe/logprob_change" in row
    ]
    assert moved and min(moved) > 1e-5, rows  # the speaker's adapter reached its sampler every time


def _serve_and_ask(run: Path, model: str) -> tuple[list[str], str]:
    """`rllm serve RUN --port 0` as a user runs it: the models it lists, and the model a
    completion asking for ``model`` was answered as. Waits for its "serving ... at URL" line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rllm.cli.main", "serve", str(run), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving "), line
        url = line.split(" at ")[-1].strip()
        with urllib.request.urlopen(f"{url}/models") as response:
            listed = [card["id"] for card in json.loads(response.read())["data"]]
        body = {"model": model, "prompt": "say: apple", "max_tokens": 1, "temperature": 0}
        request = urllib.request.Request(
            f"{url}/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request) as response:
            answer = json.loads(response.read())
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    return listed, answer["model"]


def test_a_role_mapped_to_an_unknown_policy_is_refused_before_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="role 'judge' maps to unknown policy 'jduge'"):
        build_trainer(
            "solver-judge", out_dir=str(tmp_path), overrides=[*FAST, *TWO_POLICIES, "roles.judge=jduge"]
        )
    assert not (tmp_path / "metrics.jsonl").exists()


def test_the_cookbooks_two_policy_config_loads() -> None:
    cookbook = load_cookbook("solver-judge")
    base = {**cookbook.train_defaults, "cookbook": "solver-judge"}
    config = load_config(ROOT / "cookbooks" / "solver_judge" / "configs" / "two_policies.yaml", base=base)
    assert config.roles == {"judge": "judge"}
    assert config.policies["judge"].lora is not None and config.policies["judge"].lora.rank == 16
