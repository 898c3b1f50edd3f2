"""Each package README names every module of its package (one line each), so the lists stay true.

The gateway and runtime READMEs describe their modules in their own way and are not checked here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNCHECKED = {"rllm-gateway", "rllm-runtime", "rllm-testing"}
PACKAGES = sorted(
    p for p in [*ROOT.glob("packages/*"), *ROOT.glob("cookbooks/*")] if (p / "README.md").is_file()
)


def _module_names(package: Path) -> list[str]:
    """Modules relative to the package's import root (``local/generation``, ``viewer/server``)."""
    inits = sorted((package / "src").rglob("__init__.py"), key=lambda p: len(p.parts))
    if not inits:
        return []
    root = inits[0].parent  # the shallowest package: rllm/engine, rllm_cookbook_say, ...
    names = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if path.name == "__init__.py" or "tasks" in relative.parts[:1]:
            continue  # packages are named by their modules; terminal's task files are data
        names.append(relative.with_suffix("").as_posix())
    return names


@pytest.mark.parametrize("package", [p for p in PACKAGES if p.name not in UNCHECKED], ids=lambda p: p.name)
def test_readme_lists_every_module(package: Path) -> None:
    readme = (package / "README.md").read_text()
    missing = [name for name in _module_names(package) if f"`{name}`" not in readme]
    assert missing == [], f"{package.name}/README.md does not list {missing}"
