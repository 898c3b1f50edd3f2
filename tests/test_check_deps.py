"""scripts/check_deps.py: every workspace member declares exactly what its source imports."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_deps", ROOT / "scripts" / "check_deps.py")
assert _spec is not None and _spec.loader is not None
check_deps = importlib.util.module_from_spec(_spec)
sys.modules["check_deps"] = check_deps  # dataclasses look their module up while the class is built
_spec.loader.exec_module(check_deps)


def _member(
    root: Path, folder: str, name: str, deps: list[str], files: dict[str, str], tool: str = ""
) -> None:
    directory = root / "packages" / folder
    (directory / "src").mkdir(parents=True)
    listed = ", ".join(f'"{d}"' for d in deps)
    (directory / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "0.1.0"\ndependencies = [{listed}]\n{tool}'
    )
    for relative, source in files.items():
        path = directory / "src" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)


def test_the_workspace_declares_what_it_imports() -> None:
    assert check_deps.check(ROOT) == []


def test_undeclared_unused_and_stale_exemptions_are_each_reported(tmp_path: Path) -> None:
    _member(tmp_path, "low", "rllm-low", ["msgspec>=0.19"], {"rllm/low/__init__.py": "import msgspec\n"})
    _member(
        tmp_path,
        "high",
        "rllm-high",
        # rllm-low is imported but undeclared (it arrives only through rllm-mid); numpy is unused
        ["numpy>=1.26", "PyYAML>=6; python_version < '3.14'", "msgspec"],
        {
            "rllm/high/__init__.py": "from rllm.low import x\n",
            "rllm/high/inner.py": "def f():\n    import yaml\n    from . import sibling\n",
        },
        tool='[tool.rllm.deps]\nnot-imported = ["msgspec"]\n',
    )
    assert check_deps.check(tmp_path) == [
        "rllm-high: imports rllm-low without declaring it (src/rllm/high/__init__.py imports rllm.low)",
        "rllm-high: declares numpy but no module imports it",
    ]


def test_an_exemption_for_an_imported_dependency_is_refused(tmp_path: Path) -> None:
    _member(
        tmp_path,
        "one",
        "rllm-one",
        ["msgspec"],
        {"rllm/one/__init__.py": "import msgspec\n"},
        tool='[tool.rllm.deps]\nnot-imported = ["msgspec"]\n',
    )
    assert check_deps.check(tmp_path) == [
        "rllm-one: [tool.rllm.deps] not-imported lists msgspec, which is imported or undeclared"
    ]


def test_first_party_modules_map_to_the_deepest_member(tmp_path: Path) -> None:
    _member(tmp_path, "backends-x", "rllm-backend-x", [], {"rllm/backends/x/__init__.py": ""})
    _member(tmp_path, "cli", "rllm-cli", [], {"rllm/cli/__init__.py": "import rllm.backends.x.thing\n"})
    assert check_deps.check(tmp_path) == [
        "rllm-cli: imports rllm-backend-x without declaring it (src/rllm/cli/__init__.py imports rllm.backends.x.thing)"
    ]


def test_a_cookbook_may_use_only_types_and_sdk(tmp_path: Path) -> None:
    _member(tmp_path, "engine", "rllm-engine", [], {"rllm/engine/__init__.py": "x = 1\n"})
    _member(tmp_path, "sdk", "rllm-sdk", [], {"rllm/sdk/__init__.py": "x = 1\n"})
    cookbook = tmp_path / "cookbooks" / "demo"
    (cookbook / "src" / "rllm_cookbook_demo").mkdir(parents=True)
    (cookbook / "pyproject.toml").write_text(
        '[project]\nname = "rllm-cookbook-demo"\nversion = "0.1.0"\ndependencies = ["rllm-sdk", "rllm-engine"]\n'
    )
    (cookbook / "src" / "rllm_cookbook_demo" / "__init__.py").write_text(
        "from rllm.sdk import x\nfrom rllm.engine import x as y\n"
    )
    assert check_deps.check(tmp_path) == [
        "rllm-cookbook-demo: a cookbook or adapter uses only rllm-types and rllm-sdk of rLLM, not rllm-engine "
        "(src/rllm_cookbook_demo/__init__.py imports rllm.engine)"
    ]


def test_an_environment_adapter_may_use_only_types_and_sdk(tmp_path: Path) -> None:
    _member(tmp_path, "engine", "rllm-engine", [], {"rllm/engine/__init__.py": "x = 1\n"})
    _member(
        tmp_path,
        "rllm-adapter-demo",
        "rllm-adapter-demo",
        ["rllm-engine"],
        {"rllm_adapter_demo/__init__.py": "from rllm.engine import x\n"},
    )
    assert check_deps.check(tmp_path) == [
        "rllm-adapter-demo: a cookbook or adapter uses only rllm-types and rllm-sdk of rLLM, not rllm-engine "
        "(src/rllm_adapter_demo/__init__.py imports rllm.engine)"
    ]
