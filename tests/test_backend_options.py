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


# Where each backend's AdamW settings (rllm.algos.optim.AdamWSettings) live in its options, and
# its own spellings and defaults: verl keeps them under `optim`, with the learning rate as `lr`.
ADAMW_SECTION = {"tinker": (), "fireworks": (), "verl": ("optim",)}
ADAMW_SPELLING = {"verl": {"learning_rate": "lr"}}
ADAMW_DEFAULTS = {
    "learning_rate": 1e-5,
    "weight_decay": 0.0,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "grad_clip": 1.0,
}
ADAMW_OWN_DEFAULTS = {"verl": {"learning_rate": 1e-6, "weight_decay": 0.01}}
ADAMW_VALUES = {
    "learning_rate": 3e-4,
    "weight_decay": 0.05,
    "betas": (0.8, 0.95),
    "eps": 1e-6,
    "grad_clip": 0.5,
}


def _adamw_options(name: str, settings: dict[str, object]) -> dict[str, object]:
    """``settings`` (AdamW keys) placed and spelt as backend ``name`` takes them."""
    spelt: dict[str, object] = {ADAMW_SPELLING.get(name, {}).get(k, k): v for k, v in settings.items()}
    for table in reversed(ADAMW_SECTION[name]):
        spelt = {table: spelt}
    return {**MINIMAL[name], **spelt}


def _adamw_of(name: str, config: object) -> object:
    for table in ADAMW_SECTION[name]:
        config = getattr(config, table)
    return config


def test_every_backend_is_placed_for_the_optimizer_checks() -> None:
    assert set(ADAMW_SECTION) == set(MINIMAL)


@pytest.mark.parametrize("name", sorted(MINIMAL))
def test_every_backend_takes_the_same_optimizer_keys_with_its_own_defaults(name: str) -> None:
    from rllm.algos.optim import ADAMW_KEYS, AdamWSettings

    cls = BACKENDS[name].load()
    defaults = _adamw_of(name, cls.parse_options(MINIMAL[name]))
    assert isinstance(defaults, AdamWSettings)  # declared once, in rllm.algos
    want = {**ADAMW_DEFAULTS, **ADAMW_OWN_DEFAULTS.get(name, {})}
    assert {key: getattr(defaults, key) for key in ADAMW_KEYS} == want

    given = _adamw_of(name, cls.parse_options(_adamw_options(name, ADAMW_VALUES)))
    assert {key: getattr(given, key) for key in ADAMW_KEYS} == ADAMW_VALUES


@pytest.mark.parametrize("name", sorted(MINIMAL))
def test_every_backend_refuses_an_optimizer_typo_and_a_bad_value_naming_the_key(name: str) -> None:
    cls = BACKENDS[name].load()
    prefix = ".".join(("backend.options", *ADAMW_SECTION[name]))
    with pytest.raises(ConfigError) as info:
        cls.parse_options(_adamw_options(name, {"weight_decya": 0.1}))
    assert str(info.value) == f"{prefix}.weight_decya: unknown key"
    with pytest.raises(ConfigError) as info:
        cls.parse_options(_adamw_options(name, {"eps": 0.0}))
    assert str(info.value) == f"{prefix}.eps: must be a finite number > 0, got 0.0"
    with pytest.raises(ConfigError) as info:
        cls.parse_options(_adamw_options(name, {"learning_rate": -1.0}))
    lr_key = ADAMW_SPELLING.get(name, {}).get("learning_rate", "learning_rate")
    assert str(info.value) == f"{prefix}.{lr_key}: must be a finite number > 0, got -1.0"
