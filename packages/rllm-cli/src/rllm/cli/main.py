"""The `rllm` command (click). Every subcommand lives in its own module of ``rllm.cli``.

rllm train NAME [key.sub=value ...]     rllm eval NAME --base-url URL | --model openai/...
rllm sft CHATS.jsonl --model M          (supervised fine-tuning, assistant tokens only)
rllm train NAME --sft CHATS.jsonl       (SFT into OUT/sft, then RL from it, in one process)
rllm distill NAME --teacher URL         (on-policy distillation)
rllm dataset list|pull|register|inspect|remove
rllm cookbook list|info NAME            rllm cookbooks | rllm backends
rllm view RUN_DIR                       rllm serve RUN_DIR | MODEL_PATH
rllm export RUN_DIR --to DIR
rllm gateway serve [...]                rllm model init-tiny PATH
rllm model import SRC.gguf --out DIR
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from rllm.cli.adapters import adapter_cookbook
from rllm.cli.agent_cmd import agent_group
from rllm.cli.capabilities_cmd import capabilities_command
from rllm.cli.cookbook import cookbook_group
from rllm.cli.dataset import dataset_group
from rllm.cli.doctor import doctor_group
from rllm.cli.errors import BAD_INPUT, INTERRUPTED, CliError, as_cli_error
from rllm.cli.eval_cmd import eval_command, train_cookbook
from rllm.cli.export_cmd import export_command
from rllm.cli.model_import_cmd import import_command
from rllm.cli.quiet import QUIET_LOGGERS, quiet_third_party
from rllm.cli.serve import serve_command
from rllm.cli.sft_cmd import folder_options, resolve_sft_dataset, sft_command, sft_summary
from rllm.cli.view_cmd import view_command
from rllm.engine.plugins import BACKENDS_GROUP, COOKBOOKS_GROUP, available, load_cookbook
from rllm.runtime.event_loop import run
from rllm.types.errors import NothingToDo

if TYPE_CHECKING:
    from rllm.engine.training.trainer import Trainer, TrainResult

console = Console(stderr=True)
PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True}


class RllmGroup(click.Group):
    """Turns any exception from a command into a one-line error (traceback only with --debug)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CliError:
            if ctx.params.get("debug"):  # --debug promises a traceback for every failure
                console.print_exception()
            raise
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except NothingToDo as exc:
            console.print(str(exc), highlight=False, soft_wrap=True)
            return 0
        except KeyboardInterrupt:
            raise click.Abort() from None
        except Exception as exc:
            if ctx.params.get("debug"):
                console.print_exception()
            raise as_cli_error(exc) from exc


@click.group(cls=RllmGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="show the full traceback when a command fails")
@click.version_option(package_name="rllm-cli", prog_name="rllm")
def cli(debug: bool) -> None:
    """Train and evaluate language agents with RL.

    \b
    Example:
      rllm train say-single total_steps=20
      rllm view runs/say-single

    Shell completion (bash; zsh and fish alike with zsh_source / fish_source):
      eval "$(_RLLM_COMPLETE=bash_source rllm)"
    """
    logging.basicConfig(level=logging.WARNING)
    if not debug:
        quiet_third_party()


@cli.command(context_settings=PASS_THROUGH)
@click.argument("name")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@click.option("--backend", default=None, help="training backend (default: tinker)")
@click.option(
    "--config", type=click.Path(path_type=Path), default=None, help="TrainerConfig file (TOML, YAML or JSON)"
)
@click.option("--out", default=None, help="run directory (default runs/NAME)")
@folder_options
@click.option("--agent", default=None, help="cookbook name or module:attr whose flow trains (datasets)")
@click.option("--evaluator", default=None, help="cookbook name or module:attr that grades (datasets)")
@click.option(
    "--init-from", default=None, help="start from this checkpoint's weights (RUN/checkpoints/step_N or RUN)"
)
@click.option(
    "--sft",
    "sft_dataset",
    default=None,
    metavar="DATASET",
    help="first fine-tune on DATASET (as `rllm sft` takes it) into OUT/sft, then RL from it; sft.KEY=VALUE sets its SFTConfig keys",
)
@click.option("-v", "--verbose", is_flag=True, help="log at INFO level")
def train(
    name: str,
    overrides: tuple[str, ...],
    backend: str | None,
    config: Path | None,
    out: str | None,
    resume: bool,
    overwrite: bool,
    allow_changes: tuple[str, ...],
    agent: str | None,
    evaluator: str | None,
    init_from: str | None,
    sft_dataset: str | None,
    verbose: bool,
) -> int:
    """Train cookbook NAME's agent (or registered dataset NAME with --agent, as in `rllm eval`);
    `key.sub=value` arguments override the config.

    \b
    Example:
      rllm train say-single --out runs/demo total_steps=20 rollout.concurrency=32
      rllm train say-single --out runs/demo --resume
      rllm train say-single --out runs/demo --overwrite
      rllm train mymath --agent math
      rllm train say-single --sft chats.jsonl --out runs/warm sft.epochs=30 sft.backend.options.learning_rate=3e-3

    A run directory that holds an earlier run is refused unless --resume or --overwrite;
    --resume with other settings is refused unless --allow-changes names them (total_steps, ...:
    docs/run-folders.md), and --init-from only starts a run (never with --resume).

    --sft DATASET fine-tunes first, in the same process (one start-up): a normal SFT run in
    OUT/sft, on this run's backend, model, backend options and seed, then RL from its final
    checkpoint exactly as --init-from would. sft.KEY=VALUE sets an SFTConfig key for that phase
    (sft.epochs, sft.batch_tokens, sft.lr_schedule, ...), sft.backend.options.KEY=VALUE a backend
    option for it alone; --resume does not redo a finished SFT phase.
    """
    from rllm.engine.training.launch import build_trainer

    if verbose:
        logging.getLogger().setLevel(logging.INFO)
        for quieted in QUIET_LOGGERS:
            logging.getLogger(quieted).setLevel(logging.NOTSET)
    if sft_dataset is not None and init_from:
        raise CliError("--sft and --init-from both set the starting weights: pass one")
    if sft_dataset is None and (stray := next((o for o in overrides if o.startswith("sft.")), None)):
        key = stray.partition("=")[0]
        raise CliError(
            f"{key} sets a key of the SFT phase, which only --sft DATASET runs: pass --sft, or drop it"
        )
    cookbook = train_cookbook(name, agent, evaluator)
    if sft_dataset is not None:
        from rllm.engine.training.warm_start import build_warm_start

        job = build_warm_start(
            name,
            resolve_sft_dataset(sft_dataset),
            cookbook=cookbook,
            config_path=config,
            overrides=overrides,
            backend=backend,
            out_dir=out,
            resume=resume,
            overwrite=overwrite,
            allow_changes=allow_changes,
        )
        sft_result = run(job.run_sft(), uvloop_default=False)
        if sft_result is None:
            console.print(
                f"sft: finished earlier in {job.sft_dir}; not redone", highlight=False, soft_wrap=True
            )
        else:
            console.print(f"[bold green]sft done[/bold green]: {sft_summary(sft_result)}", soft_wrap=True)
        trainer, resume, overwrite = job.rl_trainer(), job.rl_resume, job.rl_overwrite
        allow_changes = tuple(job.rl_allow_changes) if resume else ()
    else:
        flags = [f"init_from={init_from}"] if init_from else []
        trainer = build_trainer(
            name,
            cookbook=cookbook,
            config_path=config,
            overrides=[*flags, *overrides],
            backend=backend,
            out_dir=out,
            resume=resume,
            overwrite=overwrite,
            allow_changes=allow_changes,
        )
    result = _fit(trainer, resume=resume, overwrite=overwrite, allow_changes=allow_changes)
    reward = (
        f"reward {result.first_reward:.3f} -> {result.final_reward:.3f}; "
        if result.first_reward is not None and result.final_reward is not None
        else ""
    )
    console.print(
        f"[bold green]done[/bold green]: {result.steps} steps in {result.wall_s:.0f} s; "
        f"{reward}run dir {result.out_dir}" + (f"; plot {result.plot}" if result.plot else ""),
        soft_wrap=True,  # paths stay whole, to be copied
    )
    if result.checkpoint:
        console.print(
            f"checkpoint {result.checkpoint} (rllm serve {result.out_dir})", highlight=False, soft_wrap=True
        )
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    return 0


@cli.command(context_settings=PASS_THROUGH)
@click.argument("name")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--teacher", required=True, help="the teacher's OpenAI-compatible base URL (.../v1) with prompt_logprobs"
)
@click.option("--reward-coef", default=None, type=float, help="add this times the task reward's advantage")
@click.option("--backend", default=None, help="training backend (default: tinker)")
@click.option(
    "--config", type=click.Path(path_type=Path), default=None, help="TrainerConfig file (TOML, YAML or JSON)"
)
@click.option("--out", default=None, help="run directory (default runs/NAME)")
@folder_options
@click.option("--init-from", default=None, help="start from this checkpoint's weights")
def distill(
    name: str,
    overrides: tuple[str, ...],
    teacher: str,
    reward_coef: float | None,
    backend: str | None,
    config: Path | None,
    out: str | None,
    resume: bool,
    overwrite: bool,
    allow_changes: tuple[str, ...],
    init_from: str | None,
) -> int:
    """On-policy distillation: the student samples cookbook NAME's tasks, the teacher scores its
    tokens; per-token advantage = teacher - student logprob (optionally + the task reward's).
    With distill.loss=topk the student trains instead on the exact KL over the teacher's top
    distill.topk tokens at each position (the local tinker backend; faster to learn). It needs no
    group: run it with group_size=1 and about 3x RL's learning rate (rllm-engine README).

    \b
    Example:
      rllm serve runs/teacher/model --port 8001 &
      rllm distill say-single --teacher http://127.0.0.1:8001/v1 --out runs/distill total_steps=40
      rllm distill say-single --teacher URL distill.loss=topk group_size=1 backend.options.learning_rate=3e-3
    """
    from rllm.engine.training.launch import build_trainer

    if not teacher.startswith(("http://", "https://")):
        raise CliError(
            f"--teacher {teacher!r} is not a URL",
            hint="serve a local teacher with `rllm serve PATH` and pass its http://HOST:PORT/v1",
        )
    # Every group trains: the teacher's advantages do not depend on the rewards varying.
    flags = [f"distill.teacher={teacher}", "algorithm.filter_zero_variance=false"]
    flags += [f"distill.reward_coef={reward_coef}"] if reward_coef is not None else []
    flags += [f"init_from={init_from}"] if init_from else []
    trainer = build_trainer(
        name,
        cookbook=adapter_cookbook(name),  # None: cookbook NAME
        config_path=config,
        overrides=[*flags, *overrides],
        backend=backend,
        out_dir=out,
        resume=resume,
        overwrite=overwrite,
        allow_changes=allow_changes,
    )
    result = _fit(trainer, resume=resume, overwrite=overwrite, allow_changes=allow_changes)
    console.print(
        f"[bold green]done[/bold green]: {result.steps} steps in {result.wall_s:.0f} s; run dir {result.out_dir}"
    )
    return 0


@cli.group()
def model() -> None:
    """Model utilities."""


@model.command("init-tiny")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--cookbook", default="say", show_default=True, help="whose task texts train the tokenizer")
@click.option("--backend", default="tinker", show_default=True)
@click.option("--overwrite", is_flag=True, help="replace the model PATH holds")
def init_tiny(path: Path, cookbook: str, backend: str, overwrite: bool) -> int:
    """Build a tiny random model and a locally trained tokenizer at PATH.

    A PATH that holds anything (a model, another command's folder) is refused unless
    --overwrite, which replaces a model folder whole.

    \b
    Example:
      rllm model init-tiny models/tiny --cookbook say
    """
    from rllm.engine.plugins import backend_class
    from rllm.engine.training.launch import task_vocabulary
    from rllm.engine.training.run_folder import RunFolder

    settings = {"cookbook": cookbook, "backend": backend, "seed": 0}
    folder = RunFolder(path, "model init-tiny", settings, flag="PATH")
    folder.check(overwrite=overwrite)  # before the cookbook's tasks are read
    words = task_vocabulary(load_cookbook(cookbook))
    cls = backend_class(backend)
    folder.begin(overwrite=overwrite)
    written = cls.init_tiny_model(path, vocab_words=words, seed=0)
    console.print(f"tiny model written to {written}", highlight=False, soft_wrap=True)
    return 0


model.add_command(import_command)


@cli.command("cookbooks")
def list_cookbooks() -> int:
    """List installed cookbook names (`rllm cookbook list` shows details)."""
    click.echo("\n".join(available(COOKBOOKS_GROUP)))
    return 0


# What each bundled backend needs beyond `uv sync` (a backend from elsewhere shows its package).
BACKEND_NEEDS: dict[str, str] = {
    "tinker": "local: torch (CPU or one GPU); remote: the tinker SDK and TINKER_API_KEY",
    "verl": "the verl extra (verl, ray, vllm) and GPUs; CPU runs need external vLLM servers",
    "fireworks": "the fireworks-ai training SDK and FIREWORKS_API_KEY",
}
DEFAULT_BACKEND = "tinker"


@cli.command("backends")
def list_backends() -> int:
    """List installed training backends: the default, and what each needs.

    \b
    Example:
      rllm backends
    """
    for name in available(BACKENDS_GROUP):
        default = " (default)" if name == DEFAULT_BACKEND else ""
        click.echo(f"{name}{default}: needs {BACKEND_NEEDS.get(name, 'see its package README')}")
    return 0


@cli.command(context_settings=PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def gateway(args: tuple[str, ...]) -> int:
    """Run the rLLM gateway: the same server as `rllm-gateway serve`.

    \b
    Subcommands:
      serve   run the gateway until SIGINT/SIGTERM (`rllm gateway serve --help` for its flags)

    \b
    Example:
      rllm gateway serve --upstream http://127.0.0.1:8000/v1 --port 9000
      rllm gateway serve --help
    """
    from rllm.gateway.command import main as gateway_main

    if not args or args[0] in ("-h", "--help"):
        click.echo(click.get_current_context().get_help())
        return 0
    return gateway_main(list(args)) or 0


cli.add_command(eval_command)
cli.add_command(sft_command)
cli.add_command(agent_group)
cli.add_command(capabilities_command)
cli.add_command(view_command)
cli.add_command(dataset_group)
cli.add_command(cookbook_group)
cli.add_command(serve_command)
cli.add_command(export_command)
cli.add_command(doctor_group)


def _fit(
    trainer: Trainer, *, resume: bool, overwrite: bool = False, allow_changes: tuple[str, ...] = ()
) -> TrainResult:
    """Run the trainer; Ctrl-C exits 130 with one line: the trainer's own when it saved a
    checkpoint on the way out, else main's "interrupted"."""
    try:
        # uvloop: the same rewards step for step, less CPU
        # (benchmarks/history/issue-35.md, "#35 round 9").
        fit = trainer.fit(resume=resume, overwrite=overwrite, allow_changes=allow_changes)
        return run(fit, uvloop_default=True)
    except KeyboardInterrupt:
        if trainer.interrupt_reported:
            raise click.exceptions.Exit(INTERRUPTED) from None
        raise


def main(argv: list[str] | None = None) -> int:
    """Run `rllm` and return its exit code; usage errors exit (status 2) as argparse's did."""
    try:
        result = cli.main(args=argv, prog_name="rllm", standalone_mode=False)
    except click.UsageError as exc:
        exc.show()
        raise SystemExit(BAD_INPUT) from None
    except CliError as exc:
        exc.show()
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt):
        console.print("[yellow]interrupted[/yellow]")
        return INTERRUPTED
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
