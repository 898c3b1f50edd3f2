"""The engine's modules moved into subpackages (training/, rollout/, data/): the old flat paths
still import, as the very same module, with a DeprecationWarning that names the new path."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import pytest

import rllm.engine
from rllm.engine import MOVED_MODULES

ENGINE_DIR = Path(rllm.engine.__file__).parent
# What stays at the top of rllm.engine: the contracts every part shares and evaluation.
TOP_LEVEL = {"__init__", "backend", "backend_base", "capabilities", "evaluation", "modality",
             "pass_at_k", "plugins"}  # fmt: skip


def test_the_flat_folder_holds_only_the_shared_contracts() -> None:
    assert {p.stem for p in ENGINE_DIR.glob("*.py")} == TOP_LEVEL


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_path_imports_the_moved_module_with_a_warning(old: str) -> None:
    new_name = f"rllm.engine.{MOVED_MODULES[old]}"
    assert (ENGINE_DIR / (MOVED_MODULES[old].replace(".", "/") + ".py")).is_file()
    new = importlib.import_module(new_name)
    sys.modules.pop(f"rllm.engine.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"rllm.engine.{old} moved to {new_name}"):
        old_module = importlib.import_module(f"rllm.engine.{old}")
    assert old_module is new


def test_from_import_of_an_old_module_name_works() -> None:
    sys.modules.pop("rllm.engine.trainer", None)
    if "trainer" in vars(rllm.engine):
        delattr(rllm.engine, "trainer")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from rllm.engine import trainer
    from rllm.engine.training import trainer as moved

    assert trainer is moved
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)


def test_an_unknown_module_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("rllm.engine.no_such_module")
