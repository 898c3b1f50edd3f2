"""Print `rllm doctor tokens`'s table for every template the tests carry, as Markdown.

docs/token-truth.md ("The doctor's output for the tests' templates") is this script's output:
regenerate it with ``uv run python scripts/doctor_tables.py`` after a change to the doctor, the
gateway's cumulative mode or a test template. The tokenizers are built here exactly as
``packages/rllm-cli/tests/test_cli_doctor.py`` builds them (that module's ``build``), offline.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def templates(tmp: Path) -> list[tuple[str, str, str | None]]:
    """(title, MODEL, --tokenizer) for each template of the doctor's tests."""
    sys.path.insert(0, str(ROOT / "packages" / "rllm-cli" / "tests"))
    from test_cli_doctor import THINK_STRIPPING, build  # type: ignore[import-not-found]

    from rllm.tiny.vlm import build_image_processor, build_vlm_tokenizer

    vlm = tmp / "tiny_vlm"
    build_vlm_tokenizer().save_pretrained(vlm)
    build_image_processor().save_pretrained(vlm)
    return [
        ("`tiny` (rllm.tiny)", "tiny", None),
        ("Qwen2.5 (hermes)", "qwen2.5", build(tmp / "qwen2_5", "qwen2_5")),
        ("Llama-3.1 (JSON)", "llama-3.1", build(tmp / "llama3_1", "llama3_1")),
        ("Qwen3-style (strips thinking)", "qwen3", build(tmp / "qwen3", "qwen2_5", THINK_STRIPPING)),
        ("gpt-oss (harmony)", "gpt-oss", build(tmp / "gpt_oss", "gpt_oss")),
        ("tiny Qwen2-VL (image processor)", "tiny-vlm", str(vlm)),
    ]


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main() -> None:
    from rllm.cli.doctor import run_doctor

    with tempfile.TemporaryDirectory() as tmp:
        for title, model, tok in templates(Path(tmp)):
            t0 = time.perf_counter()
            report = run_doctor(model, tok, None, None)
            took = time.perf_counter() - t0
            print(f"#### {title}: tool format {report.tool_format or 'none'}, exit {0 if report.ok else 1}\n")
            print(f"{title}: {took:.1f} s", file=sys.stderr)
            print("| check | result | detail | first differing token |\n|---|---|---|---|")
            for c in report.checks:
                diff = ""
                if c.first_diff:
                    d = c.first_diff
                    exp, got = d["expected"], d["got"]
                    diff = f"#{d['index']}: expected {exp and exp['text']!r}, got {got and got['text']!r}"
                print(f"| {c.name} | {c.status} | {cell(c.detail)} | {cell(diff)} |")
            print()


if __name__ == "__main__":
    main()
