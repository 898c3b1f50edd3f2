"""Which backends honour rollout.max_staleness > 0, and that the others are refused by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rllm.backends.tinker import TinkerBackend
from rllm.engine.plugins import backend_class
from rllm.engine.training.staleness import check_backend
from rllm.types import ConfigError


def test_tinker_local_with_copied_sampler_weights_honours_the_bound() -> None:
    check_backend(TinkerBackend({"model": "unused"}), 2)


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        (lambda: TinkerBackend({"model": "unused", "service": "remote"}), "remote Tinker service"),
        (lambda: TinkerBackend({"model": "unused", "sampler_weights": "shared"}), "sampler_weights"),
        (lambda: backend_class("verl"), "backend 'verl' does not support asynchronous training"),
        (lambda: backend_class("fireworks"), "backend 'fireworks' does not support asynchronous training"),
    ],
)
def test_backends_that_cannot_keep_the_bound_are_refused_by_name(
    backend: Callable[[], Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        check_backend(backend(), 1)
    assert err.value.key == "rollout.max_staleness"
    check_backend(backend(), 0)  # K = 0 (synchronous) is every backend's


class _Aborting:
    """A stand-in backend that declares it can abort and continue calls, or says why it cannot."""

    name = "aborting"

    def __init__(self, why: str | None = None) -> None:
        self.why = why

    def validate_async(self, max_staleness: int) -> None:
        pass

    def validate_partial(self) -> None:
        if self.why is not None:
            raise ConfigError(self.why)


def test_partial_rollouts_need_k_above_0_and_a_backend_that_can_abort() -> None:
    check_backend(_Aborting(), 1, partial=True)  # declared: taken
    with pytest.raises(ConfigError, match="backend 'aborting': its sampler cannot") as err:
        check_backend(_Aborting("its sampler cannot"), 1, partial=True)
    assert err.value.key == "rollout.partial"
    with pytest.raises(ConfigError, match="max_staleness=0 every rollout has finished"):
        check_backend(_Aborting(), 0, partial=True)
    check_backend(TinkerBackend({"model": "unused"}), 1, partial=True)  # the local sampler aborts
    for backend, message in (
        (backend_class("verl"), "backend 'verl' cannot abort a call in flight"),
        (backend_class("fireworks"), "backend 'fireworks' cannot abort a call in flight"),
        (TinkerBackend({"model": "unused", "service": "remote"}), "remote Tinker service"),
    ):
        with pytest.raises(ConfigError, match=message) as err:
            check_backend(backend, 1, partial=True)
        assert err.value.key == "rollout.partial"


def test_partial_rollouts_without_a_max_tokens_are_refused_at_config_time_naming_the_key() -> None:
    from rllm.engine.training.trainer_config import config_from_dict

    base = {"cookbook": "say", "rollout": {"max_staleness": 1, "partial": True}}
    with pytest.raises(ConfigError, match=r"set sampling\.max_tokens") as err:
        config_from_dict(base)
    assert err.value.key == "rollout.sampling.max_tokens"
    with_budget = {**base, "rollout": {**base["rollout"], "sampling": {"max_tokens": 8}}}
    assert config_from_dict(with_budget).rollout.sampling.max_tokens == 8
    # Without partial rollouts a call may leave its budget to the sampler, as before.
    assert (
        config_from_dict({"cookbook": "say", "rollout": {"max_staleness": 1}}).rollout.sampling.max_tokens
        is None
    )


def test_partial_validation_calls_get_the_training_budget_unless_they_set_their_own() -> None:
    from rllm.engine.training.trainer_config import config_from_dict

    rollout = {"max_staleness": 1, "partial": True, "sampling": {"max_tokens": 8}}
    # The default val_sampling (greedy) sets no budget: validation calls would get a 400 each.
    config = config_from_dict({"cookbook": "say", "rollout": rollout})
    assert config.rollout.sampling_for(True).max_tokens == 8
    assert config.rollout.sampling_for(True).temperature == 0.0
    own = {**rollout, "val_sampling": {"temperature": 0.0, "max_tokens": 3}}
    assert config_from_dict({"cookbook": "say", "rollout": own}).rollout.sampling_for(True).max_tokens == 3
    # Without partial rollouts validation keeps leaving its budget to the sampler.
    plain = config_from_dict({"cookbook": "say", "rollout": {"sampling": {"max_tokens": 8}}})
    assert plain.rollout.sampling_for(True).max_tokens is None
