"""`rllm export RUN_DIR --to DIR`: a trained checkpoint as a plain Hugging Face model folder.

Found through the ``rllm.export`` entry point group: each backend registers
``export(checkpoint, to, *, adapter_only) -> Path | None``, which answers None for a checkpoint
that is not its own, so the CLI asks each installed backend and never imports one by name.
"""

from __future__ import annotations

import inspect
from importlib.metadata import entry_points
from pathlib import Path

import click
from rich.console import Console

from rllm.cli.errors import CliError
from rllm.cli.run_model import resolve_run_model
from rllm.engine.training.run_folder import RunFolder

EXPORT_GROUP = "rllm.export"


def export_checkpoint(
    weights: Path, to: Path, *, adapter_only: bool = False, policy: str | None = None
) -> tuple[str, Path]:
    """(backend name, folder written) for the first installed backend that knows ``weights``;
    with ``policy``, among the backends whose exporter takes one (a run with several policies)."""
    exporters = sorted(entry_points(group=EXPORT_GROUP), key=lambda ep: ep.name)
    for ep in exporters:
        export = ep.load()
        if policy is None:
            written = export(weights, to, adapter_only=adapter_only)
        elif "policy" in inspect.signature(export).parameters:
            written = export(weights, to, adapter_only=adapter_only, policy=policy)
        else:
            continue
        if written is not None:
            return ep.name, Path(written)
    names = ", ".join(ep.name for ep in exporters) or "none"
    raise CliError(f"no installed backend recognises the checkpoint {weights} (exporters: {names})")


@click.command("export")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--to", "to", type=click.Path(path_type=Path), required=True, help="folder to write the model to"
)
@click.option("--step", type=int, default=None, help="the checkpoint's step (default: the latest)")
@click.option("--adapter-only", is_flag=True, help="LoRA runs: write the adapter alone (PEFT format)")
@click.option(
    "--policy",
    default=None,
    help="a run with several policies: this policy's adapter (default: the default policy)",
)
@click.option("--overwrite", is_flag=True, help="replace the model --to holds (every file of it)")
@click.option("--force", is_flag=True, hidden=True, help="deprecated: --overwrite")
def export_command(
    run_dir: Path,
    to: Path,
    step: int | None,
    adapter_only: bool,
    policy: str | None,
    overwrite: bool,
    force: bool,
) -> int:
    """Export a run's checkpoint (RUN_DIR, or one checkpoint folder) as a Hugging Face model folder.

    LoRA adapters are merged into the base model unless --adapter-only. transformers
    (`AutoModelForCausalLM.from_pretrained(DIR)`) and vLLM (`vllm serve DIR`) load the result.
    A --to that holds anything is refused unless --overwrite, which replaces the model there
    whole (no file of the earlier export is left beside the new one); --force is its old name.

    \b
    Example:
      rllm export runs/say --to models/say
      rllm export runs/say --step 20 --to models/say-20 --adapter-only
      rllm export runs/say --step 20 --to models/say-20 --overwrite
      rllm export runs/solver-judge --policy judge --to models/judge
    """
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if force:
        err.print("[yellow]warning:[/yellow] --force is deprecated: it means --overwrite (use that)")
        overwrite = True
    model = resolve_run_model(run_dir, step)
    settings = {"source": str(model.path.resolve()), "step": model.step, "adapter_only": adapter_only}
    if policy is not None:
        settings["policy"] = policy
    if to.resolve() == model.path.resolve() or to.resolve() in model.path.resolve().parents:
        raise CliError(f"--to {to} is the checkpoint's own folder (or holds it): pick another")
    folder = RunFolder(to, "export", settings, flag="--to")
    folder.begin(overwrite=overwrite)  # checked first: nothing is removed from a folder that does not fit
    backend, written = export_checkpoint(model.path, to, adapter_only=adapter_only, policy=policy)
    what = f"{model.name}, policy {policy}" if policy else model.name
    err.print(f"exported {what} ({backend} checkpoint) to {written}")
    return 0
