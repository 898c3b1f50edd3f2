"""One declaration per loss (LossSpec): what it clips and its Tinker twin are the loss's own
fields, registered with it, and everything else reads them (the plugin side is in
test_algos_plugins.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rllm.algos import AlgorithmConfig, ConfigError, register_loss, unregister_loss
from rllm.algos.config import TRUST_REGION_LOSSES
from rllm.algos.registry import BUILTIN_LOSSES, LossSpec, get_loss, ratio_clipping_losses
from rllm.types.errors import InputError


def _loss(logprobs, old_logprobs, advantages, mask, config):
    return -advantages * logprobs, {}


@pytest.fixture
def registered() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        unregister_loss(name)


def test_the_builtin_declarations() -> None:
    clipping = {name for name in BUILTIN_LOSSES if get_loss(name).clips_ratio}
    assert clipping == {"ppo_clip", "dual_clip", "gspo", "cispo"}
    twins = {name: get_loss(name).tinker_loss for name in BUILTIN_LOSSES}
    assert twins == {
        "ppo_clip": "ppo",
        "dual_clip": "",  # no Tinker built-in: run client-side
        "gspo": "gspo",
        "cispo": "cispo",
        "importance_sampling": "importance_sampling",
        "cross_entropy": "cross_entropy",
    }
    # The old name is read off the declarations, not a second list.
    assert set(TRUST_REGION_LOSSES) == clipping
    assert set(ratio_clipping_losses()) >= clipping


def test_an_in_process_loss_declares_whether_it_clips(registered: list[str]) -> None:
    register_loss("spec_clipped", clips_ratio=True, tinker_loss="ppo")(_loss)
    register_loss("spec_plain")(_loss)
    registered += ["spec_clipped", "spec_plain"]

    spec = get_loss("spec_clipped")
    assert spec.clips_ratio and spec.tinker_loss == "ppo" and spec.fn is _loss
    assert AlgorithmConfig(loss="spec_clipped", tis="trust_region").tis == "trust_region"
    assert "spec_clipped" in ratio_clipping_losses()

    with pytest.raises(ConfigError) as info:
        AlgorithmConfig(loss="spec_plain", tis="trust_region")
    assert "\n" not in str(info.value) and "'spec_plain' does not declare" in str(info.value)


def test_a_supervised_loss_cannot_declare_a_clipped_ratio() -> None:
    with pytest.raises(InputError, match="no importance ratio to clip"):
        LossSpec("sft_clipped", fn=_loss, supervised=True, clips_ratio=True)
    with pytest.raises(InputError, match="no importance ratio to clip"):
        register_loss("sft_clipped", supervised=True, clips_ratio=True)(_loss)
    with pytest.raises(KeyError):
        get_loss("sft_clipped")  # nothing was registered
