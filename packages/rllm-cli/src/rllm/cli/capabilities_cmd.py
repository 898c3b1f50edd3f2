"""`rllm capabilities`: which algorithm options, execution flows and training modes each
installed backend honours, asked of the backends' own checks (rllm.engine.capabilities), and
which flows and modes each environment adapter runs (rllm.cli.adapters)."""

from __future__ import annotations

from pathlib import Path

import click

from rllm.cli.errors import FAILED, CliError


def full_markdown() -> str:
    """docs/capabilities.md: the backends' matrix, then the environment adapters' table."""
    from rllm.cli.adapters import render_markdown as adapters_markdown
    from rllm.engine.capabilities import render_markdown

    return render_markdown() + adapters_markdown()


@click.command("capabilities")
@click.option(
    "--write", "write_to", type=click.Path(path_type=Path), default=None, help="write the table to this file"
)
@click.option(
    "--check",
    "check",
    type=click.Path(path_type=Path),
    default=None,
    help="exit 1 if this file differs from the table",
)
def capabilities_command(write_to: Path | None, check: Path | None) -> int:
    """Print the capability matrix (Markdown), generated from the backends' validation, and the
    environment adapters' flows and modes."""
    table = full_markdown()
    if write_to is not None:
        write_to.write_text(table, encoding="utf-8")
        click.echo(f"wrote {write_to}")
        return 0
    if check is not None:
        if not check.is_file() or check.read_text(encoding="utf-8") != table:
            raise CliError(
                f"{check} is not the current capability matrix",
                hint=f"rllm capabilities --write {check}",
                exit_code=FAILED,
            )
        click.echo(f"{check} is current")
        return 0
    click.echo(table, nl=False)
    return 0
