"""Every config struct, at every depth, refuses an unknown key and names its dotted path.

The walk finds each Struct reachable from TrainerConfig and GatewayConfig (through fields,
unions, lists and dicts), so a struct added later is covered without editing this test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from msgspec import inspect as mi

from rllm.engine.training.trainer_config import TrainerConfig, config_from_dict
from rllm.gateway import GatewayConfig
from rllm.types import ConfigError
from rllm.types.config_file import convert_config


def struct_paths(root: type) -> Iterator[tuple[str, mi.StructType]]:
    """(dotted path, struct info) for every struct reachable from ``root``, first path found."""
    seen: set[type] = set()
    stack: list[tuple[str, Any]] = [("", mi.type_info(root))]
    while stack:
        path, info = stack.pop()
        if isinstance(info, mi.StructType):
            if info.cls in seen:
                continue
            seen.add(info.cls)
            yield path, info
            stack += [(f"{path}.{f.encode_name}".lstrip("."), f.type) for f in info.fields]
        elif isinstance(info, mi.UnionType):
            stack += [(path, t) for t in info.types]
        elif isinstance(info, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
            stack.append((f"{path}[0]", info.item_type))
        elif isinstance(info, mi.DictType):
            stack.append((f"{path}.k", info.value_type))


def _nest(path: str, leaf: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = leaf
    for part in reversed(path.split(".") if path else []):
        doc = {part: doc}
    return doc


ALL = [(root, path, info) for root in (TrainerConfig, GatewayConfig) for path, info in struct_paths(root)]


def test_the_walk_reaches_the_nested_structs() -> None:
    names = {info.cls.__name__ for _, _, info in ALL}
    assert {
        "TrainerConfig",
        "TrainRolloutSettings",
        "SamplingParams",
        "AlgorithmConfig",
        "GatewayConfig",
    } <= names


@pytest.mark.parametrize(("root", "path", "info"), ALL, ids=[f"{r.__name__}:{p or '.'}" for r, p, _ in ALL])
def test_every_reachable_struct_forbids_unknown_fields(root: type, path: str, info: mi.StructType) -> None:
    assert info.forbid_unknown_fields, f"{info.cls.__name__} (at {path or 'top'}) accepts unknown keys"


@pytest.mark.parametrize(
    "path", ["", "rollout", "rollout.sampling", "rollout.val_sampling", "algorithm", "backend", "gateway"]
)
def test_a_typo_at_any_depth_of_a_training_config_names_its_dotted_key(path: str) -> None:
    doc = {"cookbook": "say", **_nest(path, {"temprature": 0.5})}
    with pytest.raises(ConfigError) as caught:
        config_from_dict(doc)
    key = f"{path}.temprature".lstrip(".")
    assert caught.value.key == key
    assert key in str(caught.value) and "unknown key" in str(caught.value)


def test_a_typo_in_the_gateway_default_sampling_names_its_dotted_key() -> None:
    with pytest.raises(ConfigError) as caught:
        convert_config({"default_sampling": {"temprature": 0.5}}, GatewayConfig)
    assert caught.value.key == "default_sampling.temprature"


def test_known_nested_keys_still_convert() -> None:
    config = config_from_dict(
        {"cookbook": "say", "rollout": {"sampling": {"temperature": 0.5, "top_p": 0.9}}}
    )
    assert config.rollout.sampling.temperature == 0.5
    assert msgspec.structs.asdict(config.rollout.sampling)["top_p"] == 0.9
