"""cookbooks/README.md lists every installed cookbook (it once listed 7 of 13)."""

from __future__ import annotations

from pathlib import Path

from rllm.engine.plugins import COOKBOOKS_GROUP, available

README = Path(__file__).resolve().parents[1] / "cookbooks" / "README.md"


def test_the_cookbooks_readme_names_every_installed_cookbook() -> None:
    text = README.read_text()
    missing = [name for name in available(COOKBOOKS_GROUP) if f"`{name}`" not in text]
    assert missing == [], f"cookbooks/README.md does not list {missing}"
