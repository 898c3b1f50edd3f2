"""AdamWSettings: the optimizer settings every backend's config inherits (the per-backend side,
keys, defaults and typos, is tests/test_backend_options.py)."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllm.algos.optim import ADAMW_KEYS, AdamWSettings


class Renamed(AdamWSettings, kw_only=True, forbid_unknown_fields=True, rename={"learning_rate": "lr"}):
    """A backend that spells one key its own way (msgspec renames only the fields a class
    declares, so it redeclares that one, here with its own default) and has its own defaults."""

    learning_rate: float = 1e-6
    weight_decay: float = 0.01


def test_the_keys_and_defaults() -> None:
    assert tuple(f.name for f in msgspec.structs.fields(AdamWSettings)) == ADAMW_KEYS
    assert AdamWSettings() == AdamWSettings(
        learning_rate=1e-5, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, grad_clip=1.0
    )
    assert AdamWSettings().adamw_problems() == []


@pytest.mark.parametrize(
    ("options", "key", "message"),
    [
        ({"learning_rate": 0.0}, "learning_rate", "must be a finite number > 0, got 0.0"),
        ({"learning_rate": math.inf}, "learning_rate", "must be a finite number > 0, got inf"),
        ({"weight_decay": -0.1}, "weight_decay", "must be a finite number >= 0, got -0.1"),
        ({"betas": (0.9, 1.0)}, "betas", "each must be in [0, 1), got [0.9, 1.0]"),
        ({"eps": 0.0}, "eps", "must be a finite number > 0, got 0.0"),
        ({"grad_clip": math.nan}, "grad_clip", "must be a number (<= 0 disables clipping), got nan"),
    ],
)
def test_each_bad_setting_is_named(options: dict, key: str, message: str) -> None:
    assert AdamWSettings(**options).adamw_problems() == [(key, message)]


def test_a_renamed_key_is_named_as_its_config_spells_it() -> None:
    settings = msgspec.convert({"lr": -1.0, "eps": 0.0}, Renamed)
    assert settings.learning_rate == -1.0 and (Renamed().learning_rate, Renamed().weight_decay) == (
        1e-6,
        0.01,
    )
    assert [key for key, _ in settings.adamw_problems()] == ["lr", "eps"]
    with pytest.raises(msgspec.ValidationError, match="learning_rate"):
        msgspec.convert({"learning_rate": 1e-3}, Renamed)


@given(grad_clip=st.floats(allow_nan=False), weight_decay=st.floats(min_value=0, max_value=1e6))
def test_any_clip_and_any_finite_decay_are_accepted(grad_clip: float, weight_decay: float) -> None:
    """grad_clip <= 0 (or inf) means no clipping; only nan is a mistake."""
    assert AdamWSettings(grad_clip=grad_clip, weight_decay=weight_decay).adamw_problems() == []
