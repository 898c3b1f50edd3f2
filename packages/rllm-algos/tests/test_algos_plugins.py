"""Estimators and losses from an installed package's entry points (``rllm.estimators``,
``rllm.losses``): a tiny distribution is written at test time (a module and its .dist-info) into
a directory put on the path, as ``pip install`` would leave it, and found without any code."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rllm.algos import AlgorithmConfig, ConfigError, compute_advantages
from rllm.algos.registry import (
    available_estimators,
    available_losses,
    get_estimator,
    get_loss,
    refresh_plugins,
    unregister_estimator,
    unregister_loss,
)
from rllm.types import Step, Trajectory, TrajectoryGroup

PLUGIN = '''
import numpy as np
import torch

from rllm.algos.registry import LossSpec

CALLS = []


def centred(batch, config):
    """Advantage = reward minus the batch mean (not a built-in)."""
    CALLS.append("estimator")
    return batch.rewards - batch.rewards.mean()


def plain_pg(logprobs, old_logprobs, advantages, mask, config):
    """REINFORCE on log pi (not a built-in)."""
    CALLS.append("loss")
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
    return -adv * logprobs, {"plain_pg/used": torch.ones_like(logprobs)}


def _clipped_pg(logprobs, old_logprobs, advantages, mask, config):
    """PPO-clip written out again (not a built-in): its ratio is clipped, and it says so below."""
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    return torch.maximum(-adv * ratio, -adv * clipped), {}


CLIPPED_PG = LossSpec("clipped_pg", fn=_clipped_pg, clips_ratio=True)
'''


def install_plugin(site: Path) -> None:
    """What installing a wheel of package ``rllm-plugin-demo`` leaves in site-packages."""
    (site / "rllm_plugin_demo.py").write_text(textwrap.dedent(PLUGIN))
    info = site / "rllm_plugin_demo-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rllm-plugin-demo\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[rllm.estimators]\ncentred = rllm_plugin_demo:centred\n\n[rllm.losses]\n"
        "plain_pg = rllm_plugin_demo:plain_pg\nclipped_pg = rllm_plugin_demo:CLIPPED_PG\n"
    )


@pytest.fixture
def plugin_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    install_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    refresh_plugins()
    yield tmp_path
    unregister_estimator("centred")
    unregister_loss("plain_pg")
    unregister_loss("clipped_pg")
    sys.modules.pop("rllm_plugin_demo", None)
    monkeypatch.undo()
    refresh_plugins()


def _group(rewards: list[float]) -> TrajectoryGroup:
    trajectories = [Trajectory(steps=[Step()], reward=r) for r in rewards]
    return TrajectoryGroup(task_id="t", role="solver", trajectories=trajectories)


def test_without_the_package_the_names_are_refused() -> None:
    refresh_plugins()
    assert "centred" not in available_estimators() and "plain_pg" not in available_losses()
    with pytest.raises(ConfigError, match="centred"):
        AlgorithmConfig(estimator="centred")
    with pytest.raises(ConfigError, match="plain_pg"):
        AlgorithmConfig(loss="plain_pg")


def test_an_installed_estimator_and_loss_are_found_and_used(plugin_site: Path) -> None:
    assert {"centred"} <= available_estimators() and {"plain_pg"} <= available_losses()
    assert "rllm_plugin_demo" not in sys.modules  # naming them imports nothing
    config = AlgorithmConfig(estimator="centred", loss="plain_pg")

    group = _group([1.0, 0.0, 0.5])
    compute_advantages([group], config)
    assert [t.steps[0].advantage for t in group.trajectories] == pytest.approx([0.5, -0.5, 0.0])
    assert get_estimator("centred").fn.__module__ == "rllm_plugin_demo"

    import torch

    from rllm.algos.losses import compute_policy_loss

    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)
    loss, metrics = compute_policy_loss(
        logprobs, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2), config
    )
    assert loss.item() == pytest.approx(np.mean([1.0, 2.0, -0.5, -0.5]))
    assert metrics["plain_pg/used"] == 1.0
    assert not get_loss("plain_pg").supervised
    assert sys.modules["rllm_plugin_demo"].CALLS == ["estimator", "loss"]


def test_a_fresh_process_finds_them_when_decoding_a_config(plugin_site: Path) -> None:
    """What ``rllm train ... algorithm.loss=plain_pg`` does to the ``algorithm`` table: decode it
    in a new process that has only the installed package on its path, no registering code."""
    code = (
        "import msgspec\n"
        "from rllm.algos import AlgorithmConfig\n"
        "c = msgspec.convert({'estimator': 'centred', 'loss': 'plain_pg'}, AlgorithmConfig)\n"
        "print(c.estimator, c.loss)\n"
    )
    env_path = f"{plugin_site}"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["centred", "plain_pg"]


def test_a_plugin_loss_that_declares_a_clipped_ratio_takes_the_trust_region(plugin_site: Path) -> None:
    """``tis = "trust_region"`` is the loss's own declaration (LossSpec.clips_ratio), not a list
    of built-in names: a plugin's spec that declares it is accepted, a bare function refused."""
    config = AlgorithmConfig(loss="clipped_pg", tis="trust_region")
    assert get_loss("clipped_pg").clips_ratio and not get_loss("plain_pg").clips_ratio

    import torch

    from rllm.algos.losses import compute_policy_loss

    # The ratio is taken against the sampler's logprobs: 1.5 is clipped to 1.2 (no gradient).
    logprobs = torch.log(torch.tensor([[0.6]])).requires_grad_()
    loss, _ = compute_policy_loss(
        logprobs,
        torch.log(torch.tensor([[0.6]])),
        torch.tensor([1.0]),
        torch.ones(1, 1),
        config,
        sampler_logprobs=torch.log(torch.tensor([[0.4]])),
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1.2) and logprobs.grad is not None
    assert logprobs.grad.item() == 0.0

    with pytest.raises(ConfigError) as info:
        AlgorithmConfig(loss="plain_pg", tis="trust_region")
    message = str(info.value)
    assert "\n" not in message
    assert "'plain_pg' does not declare that it clips one (LossSpec.clips_ratio)" in message
    assert "'clipped_pg'" in message and "tis='token'" in message  # what to use instead
    AlgorithmConfig(loss="plain_pg", tis="token")
