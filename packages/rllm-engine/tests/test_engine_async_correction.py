"""Which off-policy correction K > 0 turns on by default, and what the config refuses."""

from __future__ import annotations

from typing import Any

import pytest

from rllm.engine.training.trainer_config import config_from_dict
from rllm.types.errors import ConfigError


def _config(k: int, **algorithm: Any):
    doc: dict[str, Any] = {"cookbook": "say", "rollout": {"max_staleness": k}}
    if algorithm:
        doc["algorithm"] = algorithm
    return config_from_dict(doc)


@pytest.mark.parametrize(
    ("algorithm", "tis"),
    [
        ({}, "trust_region"),  # the default loss, PPO-clip: its clip around the sampler's policy
        ({"loss": "dual_clip"}, "trust_region"),
        ({"loss": "cispo"}, "trust_region"),
        ({"loss": "gspo"}, "trust_region"),
        ({"loss": "importance_sampling"}, "token"),  # no clip of its own: capped token weights
        ({"tis": "sequence"}, "sequence"),  # named by the user: kept
        ({"tis": "token"}, "token"),
    ],
)
def test_k_above_zero_turns_on_a_correction_that_fits_the_loss(algorithm: dict[str, Any], tis: str) -> None:
    assert _config(1, **algorithm).algorithm.tis == tis


def test_k_zero_keeps_the_synchronous_loss() -> None:
    assert _config(0).algorithm.tis == "none"


def test_trust_region_on_a_loss_without_a_clip_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigError, match="trust_region"):
        _config(1, loss="importance_sampling", tis="trust_region")


def test_no_correction_at_k_above_zero_is_refused_unless_opted_out() -> None:
    with pytest.raises(ConfigError, match="uncorrected_staleness"):
        _config(2, tis="none")


def test_a_registered_loss_gets_the_correction_its_declaration_fits() -> None:
    """The default is read off the loss's own LossSpec (``clips_ratio``, ``supervised``), so a
    user's loss that declares a clipped ratio gets the trust region like the built-in ones."""
    from rllm.algos.registry import register_loss, unregister_loss

    def mine(logprobs, old_logprobs, advantages, mask, config):
        return -advantages * logprobs, {}

    register_loss("async_clipped", clips_ratio=True)(mine)
    register_loss("async_plain")(mine)
    register_loss("async_supervised", supervised=True)(mine)
    try:
        assert _config(1, loss="async_clipped").algorithm.tis == "trust_region"
        assert _config(1, loss="async_plain").algorithm.tis == "token"
        assert _config(1, loss="async_supervised").algorithm.tis == "none"
        with pytest.raises(ConfigError, match="'async_plain' does not declare"):
            _config(1, loss="async_plain", tis="trust_region")
    finally:
        for name in ("async_clipped", "async_plain", "async_supervised"):
            unregister_loss(name)


def test_an_unknown_loss_is_named_by_the_typed_decode() -> None:
    with pytest.raises(ConfigError, match="'no_such_loss'"):
        _config(1, loss="no_such_loss")
