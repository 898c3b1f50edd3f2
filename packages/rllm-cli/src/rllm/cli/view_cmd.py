"""`rllm view RUN_DIR`: the trace viewer in the browser (or `--table` for the metrics in the shell)."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from rllm.cli.errors import CliError
from rllm.cli.viewer.data import RunNotFoundError, RunView
from rllm.cli.viewer.eval_folder import EVAL_SUMMARY
from rllm.cli.viewer.server import ViewerServer
from rllm.engine.training.metrics_log import read_metrics

EVAL_RESULTS = "results.jsonl"
TABLE_COLUMNS = {
    "step": "step",
    "reward/mean": "reward",
    "val/reward/mean": "val reward",
    "train/loss": "loss",
    "time/rollout_s": "rollout s",
    "time/train_s": "train s",
}


@click.command("view")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="address to listen on (loopback by default)"
)
@click.option("--port", default=8765, show_default=True, help="port (0: any free port)")
@click.option(
    "--table",
    is_flag=True,
    help="print the metrics table (an eval folder: its summary) and exit instead of serving the page",
)
@click.option(
    "--open/--no-open",
    "open_browser",
    default=False,
    help="also open the page in a browser ($BROWSER or the desktop's; default: only print its URL)",
)
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="tokenizer.json for token texts (default: the run's tiny model's, or that of a local model folder the run's record names)",
)
def view_command(
    run_dir: Path, host: str, port: int, table: bool, open_browser: bool, tokenizer: Path | None
) -> int:
    """Browse RUN_DIR (a `rllm train` run or a `rllm eval` folder): episodes per step, messages,
    tokens coloured by logprob, curves. Serves the page on a loopback URL it prints; --open also
    opens it in a browser.

    \b
    Example:
      rllm view runs/say-single            # then open the URL it prints (http://127.0.0.1:8765/)
      rllm view runs/say-single --open     # ... in a browser it opens
      rllm view runs/say-single --table    # the metrics as a table in the shell
      rllm view runs/eval --table          # an eval folder's summary, as `rllm eval` printed it
    """
    if table:
        return print_table(run_dir)
    try:
        run_view = RunView(run_dir, tokenizer)
    except RunNotFoundError as exc:
        raise CliError(
            str(exc), hint="point it at a `rllm train` run folder or a `rllm eval` output folder"
        ) from None
    try:
        server = ViewerServer(run_view, host=host, port=port)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror}", hint="try --port 0") from None
    console = Console(stderr=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/yellow] serving {run_dir} beyond loopback ({host})")
    # One line, never wrapped at the terminal's width: the URL is copied (or read by a script).
    console.print(f"viewing {run_dir} at [bold]{server.url}[/bold] (Ctrl-C stops)", soft_wrap=True)
    if open_browser and not webbrowser.open(server.url):
        # webbrowser says no more than False (no browser here, $BROWSER would not start).
        console.print(
            "[yellow]warning:[/yellow] no browser could be opened here: open the URL above yourself"
        )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0


def print_table(run_dir: Path) -> int:
    """Up to ~20 evenly spaced metric rows of a training run as a table; an eval folder's
    summary (as `rllm eval` printed it)."""
    if not run_dir.is_dir():
        raise CliError(f"{run_dir} does not exist" if not run_dir.exists() else f"{run_dir} is not a folder")
    rows = read_metrics(run_dir / "metrics.jsonl")
    if not rows and ((run_dir / EVAL_SUMMARY).is_file() or (run_dir / EVAL_RESULTS).is_file()):
        return print_eval_summary(run_dir)
    if not rows:
        raise CliError(f"no metrics.jsonl with rows in {run_dir}")
    table = Table(title=str(run_dir))
    keys = [k for k in TABLE_COLUMNS if any(k in r for r in rows)]
    for key in keys:
        table.add_column(TABLE_COLUMNS[key], justify="right")
    stride = max(1, len(rows) // 20)
    for row in rows[::stride] + ([rows[-1]] if (len(rows) - 1) % stride else []):
        table.add_row(*(_fmt(row.get(k)) for k in keys))
    Console().print(table)
    return 0


def print_eval_summary(run_dir: Path) -> int:
    """An eval folder's summary.json as the table `rllm eval` printed at its end."""
    import msgspec

    from rllm.cli.eval_cmd import summary_table
    from rllm.engine.evaluation import EvalSummary

    path = run_dir / EVAL_SUMMARY
    if not path.is_file():
        raise CliError(
            f"{run_dir} holds an evaluation that did not finish (no {EVAL_SUMMARY})",
            hint="`rllm eval ... --out DIR --resume` finishes it and writes the summary",
        )
    try:
        summary = msgspec.json.decode(path.read_bytes(), type=EvalSummary)
    except msgspec.DecodeError as exc:
        raise CliError(f"{path} is not an evaluation summary: {exc}") from None
    Console().print(summary_table(summary, title=str(run_dir)))
    return 0


def _fmt(value: object) -> str:
    if value is None:
        return ""
    return f"{value:.3f}" if isinstance(value, float) else str(value)
