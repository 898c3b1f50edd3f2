"""The report of ``rllm doctor tokens``: one pass/fail/warn/skip line per check, with the first
token where a comparison parted (``first_diff``), printed as a table or as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass
class Check:
    name: str
    status: str  # "pass", "fail", "warn", "skip"
    detail: str = ""
    first_diff: dict[str, Any] | None = None


@dataclass
class Report:
    model: str
    tool_format: str | None
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "tool_format": self.tool_format,
            "ok": self.ok,
            "checks": [asdict(c) for c in self.checks],
        }


def first_diff(tok: Any, want: list[int], got: list[int]) -> dict[str, Any]:
    """Where ``got`` stops starting with ``want``: the index and both tokens (id and text)."""
    i = next((k for k, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))

    def show(ids: list[int]) -> Any:
        return (
            None if i >= len(ids) else {"id": ids[i], "text": tok.decode([ids[i]], skip_special_tokens=False)}
        )

    return {"index": i, "expected": show(want), "got": show(got)}


_STYLE = {"pass": "green", "fail": "red", "warn": "yellow", "skip": "dim"}


def print_report(report: Report, console: Console) -> None:
    table = Table(title=f"rllm doctor tokens {report.model} (tool format: {report.tool_format or 'none'})")
    for col in ("check", "result", "detail", "first differing token"):
        table.add_column(col, overflow="fold")
    for c in report.checks:
        diff = ""
        if c.first_diff:
            d = c.first_diff
            diff = f"#{d['index']}: expected {d['expected']}, got {d['got']}"
        table.add_row(c.name, f"[{_STYLE[c.status]}]{c.status}[/]", c.detail, diff)
    console.print(table)
