"""Every public exception class the project defines derives from rllm.types.RLLMError.

The walk covers every package named in the import-linter contracts (the root pyproject lists
each product package and cookbook there). A module that cannot be imported here for want of an
optional third-party package (verl's) is checked from its source instead. Private classes (a
leading underscore) are control flow inside one module and never reach a caller.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import pickle
import pkgutil
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from rllm.types import ConfigError, RLLMError
from rllm.types.errors import DeadlineError, InputError, LookupFailed, StateError

ROOT = Path(__file__).resolve().parents[1]
# rLLM's packages (the import-linter roots) and every cookbook (found by folder, as check_deps does).
ROOT_PACKAGES: list[str] = [
    *tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"],
    *sorted(p.name for p in ROOT.glob("cookbooks/*/src/rllm_cookbook_*") if p.is_dir()),
]


def _walk() -> tuple[list[ModuleType], dict[str, ModuleNotFoundError]]:
    """Import every module of every root package; missing optional third-party packages are noted."""
    modules: list[ModuleType] = []
    missing: dict[str, ModuleNotFoundError] = {}
    for root in ROOT_PACKAGES:
        package = importlib.import_module(root)
        modules.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{root}."):
            try:
                modules.append(importlib.import_module(info.name))
            except ModuleNotFoundError as exc:
                if (exc.name or "").startswith(("rllm", "rllm_cookbook")):
                    raise  # one of ours: a real breakage, not an optional extra
                missing[info.name] = exc
    return modules, missing


MODULES, UNIMPORTABLE = _walk()


def _public_exceptions() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for module in MODULES:
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found.append(value)
    return found


def test_every_public_exception_is_an_rllm_error() -> None:
    found = _public_exceptions()
    # The walk must have reached every layer, the backends and the cookbooks.
    reached = {
        c.__module__.split(".")[0] if c.__module__.startswith("rllm_") else c.__module__ for c in found
    }
    for package in ("rllm.types", "rllm.sdk", "rllm.gateway", "rllm.engine", "rllm.cli", "rllm.backends"):
        assert any(m.startswith(package) for m in reached), (package, sorted(reached))
    assert "rllm_cookbook_countdown" in reached
    strays = [f"{c.__module__}.{c.__qualname__}" for c in found if not issubclass(c, RLLMError)]
    assert strays == [], f"derive these from rllm.types.RLLMError (keeping their builtin base): {strays}"


def test_exceptions_in_modules_needing_optional_packages_derive_from_it_too() -> None:
    """Checked from the source: each class whose bases name an exception lists RLLMError or one
    of the project's own exceptions among them."""
    ours = {c.__name__ for c in _public_exceptions()} | {"RLLMError"}
    for name in UNIMPORTABLE:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        tree = ast.parse(Path(spec.origin).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
            is_exception = any(
                isinstance(getattr(builtins, b, None), type)
                and issubclass(getattr(builtins, b), BaseException)
                for b in bases
            ) or any(b in ours for b in bases)
            if is_exception:
                assert ours & set(bases), f"{name}.{node.name} ({bases}) does not derive from RLLMError"


def test_one_config_error_class() -> None:
    """algos and engine re-export the one ConfigError; it is a ValueError for older except clauses."""
    from rllm.algos import ConfigError as AlgosConfigError
    from rllm.engine import ConfigError as EngineConfigError

    assert AlgosConfigError is ConfigError and EngineConfigError is ConfigError
    assert issubclass(ConfigError, ValueError)
    configs = [c for c in _public_exceptions() if c.__name__ == "ConfigError"]
    assert configs == [ConfigError]


# Builtins product code may raise bare: the protocols that define them ask for exactly these
# (abstract methods, a module's __getattr__, the peer-gone signal asyncio's own streams raise,
# the exit status of a command).
BARE_OK = {"NotImplementedError", "AttributeError", "ConnectionResetError", "SystemExit"}
PRODUCT_SOURCES = [
    path
    for pattern in ("packages/*/src/**/*.py", "cookbooks/*/src/**/*.py")
    for path in sorted(ROOT.glob(pattern))
    if "rllm-testing" not in path.parts
]


def bare_builtin_raises(source: str) -> list[tuple[int, str]]:
    """(line, name) of each ``raise`` of a builtin exception class other than BARE_OK in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(raised, ast.Name) and raised.id not in BARE_OK:
                value = getattr(builtins, raised.id, None)
                if isinstance(value, type) and issubclass(value, BaseException):
                    found.append((node.lineno, raised.id))
    return found


def test_product_code_raises_rllm_errors_not_bare_builtins() -> None:
    """``raise ValueError(...)`` escapes ``except RLLMError``: raise InputError, ConfigError,
    StateError... (rllm.types.errors; each keeps the builtin base) or the package's own class."""
    assert len(PRODUCT_SOURCES) > 150  # the glob reached every package and cookbook
    strays = [
        f"{path.relative_to(ROOT)}:{line}: raise {name}"
        for path in PRODUCT_SOURCES
        for line, name in bare_builtin_raises(path.read_text())
    ]
    assert strays == [], "\n".join(strays)


def test_the_bare_raise_scan_sees_every_form() -> None:
    source = (
        "def f(x):\n"
        "    if x:\n"
        "        raise ValueError('bad')\n"
        "    try:\n"
        "        pass\n"
        "    except OSError as exc:\n"
        "        raise RuntimeError from exc\n"
        "    raise NotImplementedError\n"
        "    raise InputError('fine')\n"
    )
    assert bare_builtin_raises(source) == [(3, "ValueError"), (7, "RuntimeError")]


@pytest.mark.parametrize(
    "error",
    [StateError("not started"), InputError("bad"), LookupFailed("no step 3"), DeadlineError("late")],
)
def test_general_errors_keep_their_builtin_base_and_message(error: RLLMError) -> None:
    builtin = next(b for b in type(error).__mro__ if b.__module__ == "builtins" and b is not Exception)
    assert isinstance(error, RLLMError) and isinstance(error, builtin)
    assert str(error) == error.args[0]  # LookupFailed too: no KeyError quotes around the message
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy)) == (type(error), str(error))


@pytest.mark.parametrize("error", [ConfigError("config key `a.b`: unknown key", "a.b")])
def test_config_error_keeps_its_key_across_processes(error: ConfigError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.key) == (ConfigError, str(error), "a.b")
