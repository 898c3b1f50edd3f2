"""`rllm sft DATASET`: supervised fine-tuning, under the run-folder contract of every command."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from rllm.cli.errors import INTERRUPTED
from rllm.runtime.event_loop import run

if TYPE_CHECKING:
    from rllm.engine.data.sft import SFTResult

console = Console(stderr=True)
PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True}


def folder_options(func: Any) -> Any:
    """--resume, --overwrite and --allow-changes, as every command that can resume takes them."""
    func = click.option(
        "--allow-changes",
        "allow_changes",
        multiple=True,
        metavar="KEY[,KEY]",
        help="with --resume: let these config keys differ from the run's record (docs/run-folders.md "
        "lists the keys each command may change)",
    )(func)
    func = click.option("--overwrite", is_flag=True, help="replace an earlier run in the run directory")(func)
    return click.option("--resume", is_flag=True, help="continue from the run directory's latest checkpoint")(
        func
    )


@click.command("sft", context_settings=PASS_THROUGH)
@click.argument("dataset")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@click.option("--model", "model_name", default=None, help="model path or hub name (default: tiny)")
@click.option("--backend", default=None, help="training backend (default: tinker)")
@click.option(
    "--config", type=click.Path(path_type=Path), default=None, help="SFTConfig file (TOML, YAML or JSON)"
)
@click.option("--out", default=None, help="run directory (default runs/sft-DATASET)")
@folder_options
@click.option(
    "--retokenize",
    is_flag=True,
    help="a set of stored token ids made by another tokenizer: tokenize its messages again (with a warning)",
)
def sft_command(
    dataset: str,
    overrides: tuple[str, ...],
    model_name: str | None,
    backend: str | None,
    config: Path | None,
    out: str | None,
    resume: bool,
    overwrite: bool,
    allow_changes: tuple[str, ...],
    retokenize: bool,
) -> int:
    """Supervised fine-tuning on DATASET: an OpenAI chat JSONL (assistant tokens trained only),
    hf:NAME[:SPLIT] (a Hugging Face dataset; map columns with columns.messages=, columns.prompt=
    columns.response=), a datasets save_to_disk folder, or the NAME of a set `rllm dataset
    from-eval` wrote (its stored token ids train only the model whose tokenizer made them).

    A run directory that holds an earlier run is refused unless --resume or --overwrite;
    --resume with other settings is refused unless --allow-changes names them. Ctrl-C finishes
    the step in flight and saves a checkpoint of it.

    \b
    Example:
      rllm sft chats.jsonl --model Qwen/Qwen3-0.6B --out runs/sft epochs=2 val_dataset=held.jsonl val_every=10
      rllm sft chats.jsonl --model Qwen/Qwen3-0.6B --out runs/sft --resume --allow-changes epochs epochs=3
      rllm train math --init-from runs/sft/checkpoints/step_000040
      rllm sft hf:openai/gsm8k --model Qwen/Qwen3-0.6B columns.subset=main columns.prompt=question columns.response=answer
    """
    from rllm.engine.data.sft_launch import build_sft

    runner = build_sft(
        resolve_sft_dataset(dataset),
        model=model_name,
        backend=backend,
        config_path=config,
        overrides=[*overrides, *(["retokenize=true"] if retokenize else [])],
        out_dir=out,
        resume=resume,
        overwrite=overwrite,
        allow_changes=allow_changes,
    )
    for warning in runner.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    try:
        result = run(
            runner.fit(resume=resume, overwrite=overwrite, allow_changes=allow_changes), uvloop_default=False
        )
    except KeyboardInterrupt:
        if runner.interrupt_reported:  # its lines are printed: the checkpoint it saved
            raise click.exceptions.Exit(INTERRUPTED) from None
        raise
    console.print(f"[bold green]done[/bold green]: {sft_summary(result)}")
    return 0


def resolve_sft_dataset(dataset: str) -> str:
    """DATASET as given, or the file of the set `rllm dataset from-eval --name DATASET` wrote."""
    from rllm.cli.registry import find_sft_dataset

    if not Path(dataset).exists() and "/" not in dataset and (found := find_sft_dataset(dataset)) is not None:
        return str(found)
    return dataset


def sft_summary(result: SFTResult) -> str:
    loss = (
        f"loss {result.first_loss:.3f} -> {result.final_loss:.3f}; "
        if result.first_loss is not None and result.final_loss is not None
        else ""
    )
    val = f"best held-out loss {result.best_val_loss:.3f}; " if result.best_val_loss is not None else ""
    return (
        f"{result.steps} steps in {result.wall_s:.0f} s"
        + (" (stopped early)" if result.stopped_early else "")
        + f"; {loss}{val}checkpoint {result.checkpoint}"
    )
