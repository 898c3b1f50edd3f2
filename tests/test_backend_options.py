"""Every backend reads its ``backend.options`` one way (rllm.types.config_file.parse_options
through rllm.engine.backend_base.BackendBase): the same error wording for the same mistake, the
same overrides, the same "not started" error, and options checked without building anything."""

from __future__ import annotations

import asyncio
from importlib.metadata import entry_points

import pytest

from rllm.engine.backend_base import BackendBase
from rllm.types import ConfigError
from rllm.types.errors import StateError

BACKENDS = {ep.name: ep for ep in entry_points(group="rllm.backends")}
# The least each backend needs to be built (fireworks refuses an empty model up front).
MINIMAL = {"tinker": {}, "verl": {"model": "/m"}, "fireworks": {"model": "accounts/a/models/m"}}


def test_every_installed_backend_is_covered() -> None:
    assert set(BACKENDS) == set(MINIMAL)


@pytest.mark.parametrize("name", sorted(MINIMAL))
def test_a_misspelt_option_names_its_full_key(name: str) -> None:
    cls = BACKENDS[name].load()
    assert issubclass(cls, BackendBase)
    with pytest.raises(ConfigError) as info:
        cls.parse_options({**MINIMAL[name], "learning_rat": 1e-4})
    assert str(info.value) == "backend.options.learning_rat: unknown key"
    assert info.value.key == "backend.options.learning_rat"


@pytest.mark.parametrize("name", sorted(MINIMAL))
def test_a_bad_value_and_a_failed_check_name_their_key(name: str) -> None:
    cls = BACKENDS[name].load()
    with pytest.raises(ConfigError) as info:
        cls.parse_options({**MINIMAL[name], "mini_batches": "two"})
    assert str(info.value).startswith("backend.options.mini_batches: Expected `int`")
    with pytest.raises(ConfigError) as info:
        cls(MINIMAL[name], mini_batches=0)  # an override goes through the same checks
    assert str(info.value).startswith("backend.options.mini_batches: must be >= 1")


@pytest.mark.parametrize("name", sorted(MINIMAL))
def test_overrides_merge_over_options_table_by_table(name: str) -> None:
    cls = BACKENDS[name].load()
    backend = cls(MINIMAL[name], ppo_epochs=3)
    assert backend.config.ppo_epochs == 3
    assert cls(backend.config).config is backend.config  # a typed config is taken as it is
    assert cls(backend.config, mini_batches=2).config.ppo_epochs == 3


@pytest.mark.parametrize("name", sorted(MINIMAL))
def test_calls_before_start_say_so(name: str) -> None:
    backend = BACKENDS[name].load()(MINIMAL[name])
    with pytest.raises(StateError, match=r"is not started: await backend\.start\(\) first"):
        asyncio.run(backend.sync_weights())
