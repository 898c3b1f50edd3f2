"""benchmarks/RESULTS.md stays a page a reader can use: one table of current figures on top with a
row for every benchmark script, each row linking to its section on the page; the history index
names every history file and each one it names exists; and wherever the repository cites a
section of RESULTS.md or of a history file by its heading, that heading exists.

Reads files only: no benchmark runs here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "RESULTS.md"
HISTORY = BENCHMARKS / "history"
TABLE_COLUMNS = (
    "benchmark",
    "what it measures",
    "peer",
    "current figure (target)",
    "date",
    "machine",
    "command",
)
# Where citations of the results live: docs, READMEs, code comments, scripts, tests.
CITING = ("README.md", "noxfile.py", "docs", "cookbooks", "packages", "scripts", "tests", "benchmarks")
CITING_SUFFIXES = {".py", ".md", ".sh", ".toml"}
SKIPPED_DIRS = {".venv", "node_modules", "__pycache__", ".pytest_cache", ".nox"}
ROW_LINK = re.compile(r"\[([^\]]+)\]\(#([^)\s]+)\)")
MD_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
# A citation: the page's path (RESULTS.md or history/<file>.md, not a path that merely ends so), then
# a comma and the start of the section's heading in double quotes.
CITATION = re.compile(r"(?<![\w/.-])(?:benchmarks/)?(RESULTS\.md|history/[\w.-]+\.md)(?:,\s*\"([^\"]+)\")?")
CONTINUED = re.compile(r"\s*(?:#\s*)?\"([^\"]+)\"")


def _headings(text: str) -> list[str]:
    """Markdown headings outside fenced code blocks, without their leading #s."""
    headings, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.+)", line)):
            headings.append(match.group(1).strip())
    return headings


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _top_table() -> list[list[str]]:
    """The rows (cells) of the first table on the page, which must come before any section."""
    lines = RESULTS.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert not any(line.startswith("## ") for line in lines[:first]), (
        "the table of current figures comes first"
    )
    table = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        table.append(_cells(line))
    assert tuple(table[0]) == TABLE_COLUMNS, f"the top table's columns are {table[0]}"
    return table[2:]  # past the header and its |---| line


def _row_link(row: list[str]) -> tuple[str, str]:
    match = ROW_LINK.fullmatch(row[0])
    assert match, f"a row's first cell must link to its section: {row[0]!r}"
    return match.group(1), match.group(2)


def test_every_benchmark_script_has_its_row_in_the_top_table() -> None:
    names = [_row_link(row)[0] for row in _top_table()]
    scripts = sorted(path.name for path in BENCHMARKS.glob("*.py"))
    assert scripts, "no benchmark scripts found"
    missing = [script for script in scripts if script not in names]
    assert missing == [], f"benchmarks/RESULTS.md has no row for {missing}"
    repeated = sorted({name for name in names if names.count(name) > 1})
    assert repeated == [], f"more than one row for {repeated}"


def test_every_row_links_to_its_own_section_and_fills_every_column() -> None:
    anchors = {_anchor(heading) for heading in _headings(RESULTS.read_text())}
    for row in _top_table():
        name, anchor = _row_link(row)
        assert anchor == _anchor(name), f"the row {name!r} links to #{anchor}, not to its own section"
        assert anchor in anchors, f"the row {name!r} links to #{anchor}: no such section in RESULTS.md"
        assert len(row) == len(TABLE_COLUMNS), f"the row {name!r} has {len(row)} cells"
        assert all(row), f"the row {name!r} leaves a column empty (write '—' or 'not measured yet')"


def _linked_files(page: Path) -> list[Path]:
    """Files a page's relative Markdown links point at (anchors stripped)."""
    return [
        (page.parent / target).resolve()
        for target in MD_LINK.findall(page.read_text())
        if "://" not in target and not target.startswith("mailto:")
    ]


def test_the_history_index_lists_every_history_file_and_each_exists() -> None:
    index = HISTORY / "README.md"
    linked = _linked_files(index)
    absent = [str(path.relative_to(ROOT)) for path in linked if not path.is_file()]
    assert absent == [], f"benchmarks/history/README.md links to missing files {absent}"
    unlisted = sorted(
        path.name
        for path in HISTORY.glob("*.md")
        if path.name != "README.md" and path.resolve() not in linked
    )
    assert unlisted == [], f"benchmarks/history/README.md does not list {unlisted}"


def test_links_of_the_results_and_history_pages_reach_files() -> None:
    for page in [RESULTS, *sorted(HISTORY.glob("*.md"))]:
        absent = [str(path) for path in _linked_files(page) if not path.exists()]
        assert absent == [], f"{page.relative_to(ROOT)} links to missing files {absent}"


def _citing_files() -> list[Path]:
    files: list[Path] = []
    for name in CITING:
        top = ROOT / name
        if top.is_file():
            files.append(top)
            continue
        files += [
            path
            for path in top.rglob("*")
            if path.suffix in CITING_SUFFIXES and path.is_file() and not SKIPPED_DIRS & set(path.parts)
        ]
    this = Path(__file__).resolve()  # its messages name the pages; they are not citations
    return [path for path in files if path.resolve() != this]


def test_citations_of_results_sections_name_a_heading_that_exists() -> None:
    headings: dict[str, list[str]] = {"RESULTS.md": _headings(RESULTS.read_text())}
    for path in HISTORY.glob("*.md"):
        headings[f"history/{path.name}"] = _headings(path.read_text())
    broken = []
    for path in _citing_files():
        lines = path.read_text(errors="replace").splitlines()
        for number, line in enumerate(lines, 1):
            for match in CITATION.finditer(line):
                page, section = match.group(1), match.group(2)
                if section is None and line[match.end() :].strip() == "," and number < len(lines):
                    # the heading wrapped onto the next line (after a comment's # or a docstring's indent)
                    wrapped = CONTINUED.match(lines[number])
                    section = wrapped.group(1) if wrapped else None
                where = f"{path.relative_to(ROOT)}:{number}"
                if page not in headings:
                    broken.append(f"{where}: benchmarks/{page} does not exist")
                elif section and not any(section in heading for heading in headings[page]):
                    broken.append(f"{where}: benchmarks/{page} has no section {section!r}")
    assert broken == [], "citations of benchmark results that lead nowhere:\n" + "\n".join(broken)
