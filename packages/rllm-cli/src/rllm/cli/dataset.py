"""`rllm dataset list|pull|register|inspect|remove`: the local registry of task datasets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from rllm.cli.errors import CliError
from rllm.cli.registry import (
    SFT_SET_FILE,
    ColumnMap,
    DatasetRegistry,
    hub_cache,
    legacy_sft_dataset_path,
    quiet_datasets,
    read_local_file,
    sft_dataset_path,
    sft_set_dir,
    sft_sets,
)
from rllm.runtime.hub_names import check_hub_name

out = Console()
err = Console(stderr=True)


def _columns(func: Any) -> Any:
    """The shared column-mapping options of `register` and `pull`."""
    func = click.option(
        "--id-column", default=None, help="column holding unique task ids (default: the row number)"
    )(func)
    func = click.option(
        "--answer-column",
        "ground_truth_column",
        default="answer",
        show_default=True,
        help="column holding the ground truth ('' for none)",
    )(func)
    func = click.option(
        "--instruction-column", default="question", show_default=True, help="column holding the prompt"
    )(func)
    func = click.option("--force", is_flag=True, help="replace the split if NAME already has it")(func)
    return click.option("--split", default="train", show_default=True, help="split name to store as")(func)


def _column_map(instruction_column: str, ground_truth_column: str, id_column: str | None) -> ColumnMap:
    return ColumnMap(instruction=instruction_column, ground_truth=ground_truth_column or None, id=id_column)


@click.group("dataset")
def dataset_group() -> None:
    """Manage datasets in the local registry ($RLLM_HOME/datasets, default ~/.rllm).

    \b
    Example:
      rllm dataset register mymath data/test.jsonl --split test --answer-column solution
      rllm dataset inspect mymath
    """


@dataset_group.command("list")
def list_datasets() -> int:
    """List registered datasets with their splits and row counts.

    \b
    Example:
      rllm dataset list
    """
    registry = DatasetRegistry()
    table = Table(title=f"datasets in {registry.root}")
    for column in ("name", "splits", "source"):
        table.add_column(column)
    for name in registry.names():
        info = registry.info(name)
        splits = ", ".join(f"{s} ({i.rows})" for s, i in info.splits.items())
        sources = dict.fromkeys(info.split_source(s) for s in info.splits)
        table.add_row(name, splits, ", ".join(sources))
    out.print(table)
    sets = sft_sets()
    if sets:
        from rllm.engine.training.run_folder import read_record

        table = Table(title="SFT sets (rllm dataset from-eval; train with `rllm sft NAME`)")
        for column in ("name", "sequences", "token ids of", "path"):
            table.add_column(column)
        for name, path in sets.items():
            record = read_record(path.parent) if path.name == SFT_SET_FILE else None
            model = str(record.config.get("tokenizer_source", "?")) if record else "unrecorded"
            with path.open("rb") as lines:
                count = sum(1 for line in lines if line.strip())
            table.add_row(name, str(count), model, str(path))
        out.print(table)
    return 0


def check_not_a_cookbook(name: str) -> None:
    """A dataset named like a cookbook would never be used: `rllm train/eval NAME` runs the cookbook."""
    from rllm.engine.plugins import COOKBOOKS_GROUP, available

    if name in available(COOKBOOKS_GROUP):
        raise CliError(
            f"{name!r} is a cookbook: `rllm train {name}` and `rllm eval {name}` would run it, never "
            "this dataset: register it under another name"
        )


@dataset_group.command("register")
@click.argument("name")
@click.argument("path", type=click.Path(path_type=Path))
@_columns
def register(
    name: str,
    path: Path,
    split: str,
    force: bool,
    instruction_column: str,
    ground_truth_column: str,
    id_column: str | None,
) -> int:
    """Register a local jsonl, json, parquet or csv file as dataset NAME (one split).

    A split NAME already has is refused unless --force.

    \b
    Example:
      rllm dataset register mymath train.jsonl --instruction-column problem --answer-column solution
      rllm dataset register mymath test.jsonl --split test
    """
    columns = _column_map(instruction_column, ground_truth_column, id_column)
    check_not_a_cookbook(name)
    registry = DatasetRegistry()
    if not force:
        registry.check_new_split(name, split)  # before reading the file
    info = registry.add(name, str(path), split, columns, read_local_file(path), force=True)
    err.print(f"registered {name}/{split}: {info.splits[split].rows} tasks")
    return 0


@dataset_group.command("pull")
@click.argument("hub_name")
@click.option("--name", default=None, help="local name (default: the part after the last '/')")
@click.option("--config", "hub_config", default=None, help="the hub dataset's configuration name")
@click.option("--hub-split", default=None, help="the hub split to load (default: --split)")
@_columns
def pull(
    hub_name: str,
    name: str | None,
    hub_config: str | None,
    hub_split: str | None,
    split: str,
    force: bool,
    instruction_column: str,
    ground_truth_column: str,
    id_column: str | None,
) -> int:
    """Load HUB_NAME from the Hugging Face hub (needs network access) and register it.

    \b
    Example:
      rllm dataset pull openai/gsm8k --config main --split test --answer-column answer
    """
    local = name or hub_name.rsplit("/", 1)[-1]
    check_not_a_cookbook(local)
    registry = DatasetRegistry()
    if not force:
        registry.check_new_split(local, split)  # before the download
    check_hub_name(hub_name, "dataset", cache_dirs=[hub_cache()])  # one line when it cannot load
    data = quiet_datasets().load_dataset(
        hub_name, hub_config, split=hub_split or split, cache_dir=str(hub_cache())
    )
    columns = _column_map(instruction_column, ground_truth_column, id_column)
    info = registry.add(local, f"hf:{hub_name}", split, columns, data, force=True)
    err.print(f"registered {local}/{split}: {info.splits[split].rows} tasks")
    return 0


@dataset_group.command("inspect")
@click.argument("name")
@click.option("--split", default=None, help="split to show (default: the first)")
@click.option("-n", "--rows", default=5, show_default=True, help="rows to show")
def inspect(name: str, split: str | None, rows: int) -> int:
    """Show a dataset's splits, column mapping and first rows.

    \b
    Example:
      rllm dataset inspect mymath --split test -n 3
    """
    registry = DatasetRegistry()
    info = registry.info(name)
    split = split or next(iter(info.splits))
    out.print(f"[bold]{name}[/bold]")
    for each, split_info in info.splits.items():
        columns = info.split_columns(each)
        out.print(
            f"split {each}: {split_info.rows} rows from {info.split_source(each)}; columns: instruction <- "
            f"{columns.instruction}, ground_truth <- {columns.ground_truth}, id <- {columns.id or '(row number)'}",
            highlight=False,
            soft_wrap=True,
        )
    table = Table(title=f"{name}/{split}")
    for column in ("id", "instruction", "ground_truth", "metadata"):
        table.add_column(column, overflow="fold")
    for row in registry.rows(name, split, limit=rows):
        truth = json.loads(row["ground_truth"])
        table.add_row(row["id"], row["instruction"][:200], str(truth)[:80], row["metadata"][:80])
    out.print(table)
    return 0


@dataset_group.command("remove")
@click.argument("name")
def remove(name: str) -> int:
    """Remove dataset NAME and its files from the registry.

    \b
    Example:
      rllm dataset remove mymath
    """
    DatasetRegistry().remove(name)
    err.print(f"removed {name}")
    return 0


@dataset_group.command("from-eval")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--name", required=True, help="name of the SFT set (`rllm sft NAME` reads it)")
@click.option("--min-reward", default=1.0, show_default=True, help="keep episodes with at least this reward")
@click.option(
    "--max-per-task", default=0, show_default=True, help="keep at most this many episodes a task (0: all)"
)
@click.option(
    "--from-step",
    default=None,
    type=click.IntRange(min=0),
    help="a training run: only the samples of this step and later",
)
@click.option(
    "--tokenizer",
    "tokenizer_model",
    default=None,
    metavar="MODEL",
    help="the model (folder or hub name) that answered, whose tokenizer made the ids (default: a "
    "training run's own model; an eval run must name it)",
)
@click.option("--overwrite", is_flag=True, help="replace the set NAME")
def from_eval(
    run_dir: Path,
    name: str,
    min_reward: float,
    max_per_task: int,
    from_step: int | None,
    tokenizer_model: str | None,
    overwrite: bool,
) -> int:
    """Turn an `rllm eval` run's good episodes, or the per-step samples an `rllm train` run kept
    (RUN_DIR/samples), into an SFT set (the sampler's token ids, unchanged).

    The set records the tokenizer its ids are of (a hash of vocabulary and chat template), and
    `rllm sft` trains it only with a model that tokenizes the same way. A set NAME that exists is
    refused unless --overwrite.

    \b
    Example:
      rllm eval say --base-url http://127.0.0.1:8000/v1 --out runs/eval-say
      rllm dataset from-eval runs/eval-say --tokenizer runs/say/tiny-model --min-reward 1.0 --name say-good
      rllm sft say-good --model runs/say/tiny-model
      rllm dataset from-eval runs/train-say --from-step 100 --min-reward 1.0 --name say-late
    """
    from rllm.engine.data.trace_data import (
        check_ids_fit,
        ids_tokenizer,
        read_run_episodes,
        sft_records,
        write_records,
    )
    from rllm.engine.training.model_check import load_tokenizer, model_config, tokenizer_fingerprint
    from rllm.engine.training.run_folder import RunFolder

    folder = RunFolder(sft_set_dir(name), "dataset from-eval", flag="--name")
    legacy = legacy_sft_dataset_path(name)
    folder.check(overwrite=overwrite)
    if legacy.is_file() and not overwrite:
        raise CliError(
            f"set {name!r} already exists ({legacy}): pass --overwrite to replace it, or another --name"
        )
    model = ids_tokenizer(run_dir, tokenizer_model)
    episodes = read_run_episodes(run_dir, from_step)
    try:
        tokenizer = load_tokenizer(model)
    except (OSError, ValueError) as exc:
        raise CliError(f"--tokenizer {model}: cannot load its tokenizer ({exc})") from None
    fingerprint = tokenizer_fingerprint(tokenizer)
    records, stats = sft_records(
        episodes, min_reward, max_per_task, tokenizer=fingerprint, tokenizer_source=model
    )
    if not records:
        raise CliError(
            f"{run_dir}: no episode with reward >= {min_reward} and token ids "
            f"({stats.episodes} episodes, {stats.above_threshold} above the threshold)"
        )
    # A model's embedding table may be larger than its tokenizer (padded): its ids are still its own.
    vocab = (model_config(model) or {}).get("vocab_size")
    check_ids_fit(records, max(len(tokenizer), vocab if isinstance(vocab, int) else 0), model)
    settings = {
        "source": str(run_dir.resolve()),
        "min_reward": min_reward,
        "max_per_task": max_per_task,
        "from_step": from_step,
        "tokenizer": fingerprint,
        "tokenizer_source": model,
    }
    RunFolder(folder.path, "dataset from-eval", settings, flag="--name").begin(overwrite=overwrite)
    legacy.unlink(missing_ok=True)
    path = write_records(sft_dataset_path(name), records)
    err.print(
        f"wrote {stats.records} sequences to {path} from {stats.above_threshold} of {stats.episodes} episodes "
        f"(reward >= {min_reward}; {stats.capped} over the per-task cap, {stats.duplicates} duplicates dropped; "
        f"ids of {model}'s tokenizer {fingerprint})",
        highlight=False,
        soft_wrap=True,
    )
    return 0
