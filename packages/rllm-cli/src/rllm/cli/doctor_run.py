"""``rllm doctor run RUN_DIR``: the training-health checks over a run folder, finished or running.

The rows of ``RUN_DIR/metrics.jsonl`` (a torn last line of a run still writing is left out) go
through the same checks the run itself ran each step (``rllm.engine.training.health``). A row from
before the health figures existed (an older run) gets its entropy and truncation figures from the
step's episode sample (``RUN_DIR/samples/``, the few groups ``rllm view`` shows), where there is one.
The table says what fired, at which step, the evidence (steps and values) and the likely cause;
exit 0 when nothing fired, 1 when something did. ``health.KEY=VALUE`` arguments set the checks'
thresholds as a training config's ``health`` section does (a run's own settings are not stored
in its folder: give them again to judge alike).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from rllm.cli.errors import FAILED, CliError

if TYPE_CHECKING:
    from rllm.engine.training.health_config import HealthSection

FROM_SAMPLES = ("tokens/entropy_proxy", "tokens/truncated_share")


def health_section(overrides: tuple[str, ...]) -> HealthSection:
    """The ``health.KEY=VALUE`` arguments as a checked HealthSection."""
    from rllm.engine.training.health_config import HealthSection
    from rllm.types import ConfigError
    from rllm.types.config_file import apply_overrides, convert_config

    wrong = [o for o in overrides if not o.startswith("health.")]
    if wrong:
        raise CliError(f"{wrong[0]!r}: only health.KEY=VALUE settings apply here (e.g. health.window=5)")
    doc = apply_overrides({}, overrides).get("health", {})
    try:
        return convert_config(doc, HealthSection)
    except ConfigError as exc:
        raise CliError(str(exc).replace("config key `", "config key `health.")) from None


def run_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics rows, each missing health figure filled in from its step's sample."""
    from rllm.engine.training.health_config import HealthSection
    from rllm.engine.training.health_measure import step_health_metrics
    from rllm.engine.training.metrics_log import read_episode_sample, read_metrics, sample_path

    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise CliError(f"{run_dir} holds no metrics.jsonl: not a training run folder", hint="check the path")
    rows = read_metrics(path)
    for row in rows:
        if all(key in row for key in FROM_SAMPLES) or "reward/mean" not in row:
            continue
        sample = sample_path(run_dir, int(row.get("step", 0)))
        if sample.is_file():
            measured = step_health_metrics(read_episode_sample(sample).episodes, [], HealthSection())
            row.update({k: v for k, v in measured.items() if k in FROM_SAMPLES and k not in row})
    return rows


def report(run_dir: Path, section: HealthSection) -> dict[str, Any]:
    """What the checks found over the run's rows (the JSON ``--json`` prints)."""
    from rllm.engine.training.health import HealthMonitor
    from rllm.engine.training.health_config import CHECKS

    rows = run_rows(run_dir)
    monitor = HealthMonitor(section)
    for row in rows:
        monitor.observe(int(row.get("step", 0)), dict(row))
    steps = [int(r["step"]) for r in rows if "reward/mean" in r]
    return {
        "run": str(run_dir),
        "steps": max(steps, default=0),
        "healthy": not monitor.fired,
        "judged": [name for name in CHECKS if name in monitor.judged],
        "fired": [
            {
                "check": f.name,
                "first_step": f.first_step,
                "last_step": f.last_step,
                "steps": f.steps,
                "evidence": f.evidence,
                "likely_cause": f.cause,
            }
            for name in CHECKS
            if (f := monitor.fired.get(name)) is not None
        ],
    }


def print_health(result: dict[str, Any], console: Console) -> None:
    judged_line = ", ".join(result["judged"]) or "none (no health figures in the rows)"
    if result["healthy"]:
        console.print(
            f"[green]healthy[/green]: {result['run']}, {result['steps']} steps; nothing fired "
            f"(checks judged: {judged_line})",
            soft_wrap=True,
        )
        return
    table = Table(title=f"rllm doctor run {result['run']} ({result['steps']} steps)")
    for column in ("check", "fired at", "held", "evidence", "likely cause"):
        table.add_column(column, overflow="fold")
    for f in result["fired"]:
        held = f"{f['steps']} steps, last {f['last_step']}" if f["steps"] > 1 else "1 step"
        table.add_row(
            f"[red]{f['check']}[/red]", str(f["first_step"]), held, f["evidence"], f["likely_cause"]
        )
    console.print(table)
    console.print(f"checks judged: {judged_line}", soft_wrap=True)


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON (for CI)")
def run_command(run_dir: Path, overrides: tuple[str, ...], as_json: bool) -> int:
    """The training-health checks over RUN_DIR's metrics (a finished or a running run).

    Names each failure that fired (the sampler not serving the trained weights, learning rate
    0, no advantage or gradient, entropy collapse, length blow-up, reward hacking, groups with no
    signal, mismatch creep, format drift), when, with its evidence and likely cause. Exit 0 when
    nothing fired, 1 when something did. health.KEY=VALUE sets a threshold as in a training config.

    \b
    Example:
      rllm doctor run runs/say
      rllm doctor run runs/math health.window=20 --json
    """
    result = report(run_dir, health_section(overrides))
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        print_health(result, Console(highlight=False))
    return 0 if result["healthy"] else FAILED
