"""The `rllm` command.

rllm train NAME [--backend tinker|verl] [--config FILE] [--resume] [key.sub=value ...]
rllm eval NAME --base-url URL [--model M] [--split test] [--attempts K] [--out DIR]
          [--concurrency C] [--workers W] [--temperature T] [--max-tokens N]
rllm model init-tiny PATH [--cookbook NAME] [--backend tinker]
rllm view RUN_DIR
rllm cookbooks | rllm backends
rllm gateway serve [...]          (the rllm-gateway server)
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rllm.engine.event_loop import run
from rllm.engine.metrics_log import read_metrics
from rllm.engine.plugins import BACKENDS_GROUP, COOKBOOKS_GROUP, PluginNotFoundError, available, load_cookbook
from rllm.engine.trainer_config import ConfigError

console = Console(stderr=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "gateway":
        from rllm.gateway.cli import main as gateway_main

        return gateway_main(extra) or 0
    if extra and args.command != "train":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING)
    try:
        return args.handler(args, extra)
    except (ConfigError, PluginNotFoundError, ValueError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rllm", description="Train and evaluate language agents with RL.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="train a cookbook's agent",
        description="Extra `key.sub=value` arguments override the config.",
    )
    train.add_argument("name", help="cookbook name (see `rllm cookbooks`)")
    train.add_argument("--backend", default=None, help="training backend (default: tinker)")
    train.add_argument("--config", type=Path, default=None, help="TOML or YAML TrainerConfig file")
    train.add_argument("--out", default=None, help="run directory (default runs/NAME)")
    train.add_argument(
        "--resume", action="store_true", help="continue from the run directory's latest checkpoint"
    )
    train.add_argument("-v", "--verbose", action="store_true")
    train.set_defaults(handler=_train)

    ev = sub.add_parser("eval", help="evaluate a cookbook's agent against an OpenAI-compatible endpoint")
    ev.add_argument("name")
    ev.add_argument("--base-url", required=True, help="upstream base URL ending in /v1")
    ev.add_argument("--model", default="default")
    ev.add_argument("--split", default="test")
    ev.add_argument("--attempts", type=int, default=1)
    ev.add_argument("--concurrency", type=int, default=32, help="rollouts running at once")
    ev.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes running the flows (more agent traffic than one core carries)",
    )
    ev.add_argument("--temperature", type=float, help="sampling temperature (default: the flow's)")
    ev.add_argument("--max-tokens", type=int, help="completion token limit (default: the flow's)")
    ev.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results directory (default runs/eval-NAME); re-running resumes",
    )
    ev.set_defaults(handler=_eval)

    model = sub.add_parser("model", help="model utilities")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    tiny = model_sub.add_parser("init-tiny", help="build a tiny random model + locally trained tokenizer")
    tiny.add_argument("path", type=Path)
    tiny.add_argument("--cookbook", default="say", help="whose task texts train the tokenizer")
    tiny.add_argument("--backend", default="tinker")
    tiny.set_defaults(handler=_init_tiny)

    view = sub.add_parser("view", help="summarise a run directory's metrics")
    view.add_argument("run_dir", type=Path)
    view.set_defaults(handler=_view)

    sub.add_parser("cookbooks", help="list installed cookbooks").set_defaults(
        handler=lambda a, e: _list(COOKBOOKS_GROUP)
    )
    sub.add_parser("backends", help="list installed backends").set_defaults(
        handler=lambda a, e: _list(BACKENDS_GROUP)
    )
    sub.add_parser("gateway", help="run the rLLM gateway (rllm-gateway ...)", add_help=False)
    return parser


def _train(args: argparse.Namespace, overrides: list[str]) -> int:
    from rllm.engine.launch import build_trainer

    trainer = build_trainer(
        args.name, config_path=args.config, overrides=overrides, backend=args.backend, out_dir=args.out
    )
    result = run(trainer.fit(resume=args.resume), uvloop_default=False)
    console.print(
        f"[bold green]done[/bold green]: {result.steps} steps in {result.wall_s:.0f} s; "
        f"reward {result.first_reward:.3f} -> {result.final_reward:.3f}; run dir {result.out_dir}"
        + (f"; plot {result.plot}" if result.plot else "")
    )
    return 0


def _eval(args: argparse.Namespace, _: list[str]) -> int:
    from rllm.engine.evaluation import evaluate
    from rllm.types import SamplingParams

    sampling = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    cookbook = load_cookbook(args.name)
    out = args.out or Path("runs") / f"eval-{args.name}"
    summary = run(
        evaluate(
            cookbook.load_tasks(args.split),
            cookbook.flow,
            cookbook.evaluator,
            endpoint=args.base_url,
            attempts=args.attempts,
            output_dir=out,
            model=args.model,
            concurrency=args.concurrency,
            workers=args.workers,
            sampling=sampling,
        ),
        uvloop_default=False,
    )
    console.print(summary)
    return 0


def _init_tiny(args: argparse.Namespace, _: list[str]) -> int:
    from rllm.engine.launch import init_tiny_model

    path = init_tiny_model(args.path, cookbook=load_cookbook(args.cookbook), backend=args.backend)
    console.print(f"tiny model written to {path}")
    return 0


def _view(args: argparse.Namespace, _: list[str]) -> int:
    rows = read_metrics(args.run_dir / "metrics.jsonl")
    if not rows:
        raise FileNotFoundError(f"no metrics.jsonl with rows in {args.run_dir}")
    table = Table(title=str(args.run_dir))
    columns = {
        "step": "step",
        "reward/mean": "reward",
        "val/reward/mean": "val reward",
        "train/loss": "loss",
        "time/rollout_s": "rollout s",
        "time/train_s": "train s",
    }
    keys = [k for k in columns if any(k in r for r in rows)]
    for key in keys:
        table.add_column(columns[key], justify="right")
    stride = max(1, len(rows) // 20)
    for row in rows[::stride] + ([rows[-1]] if (len(rows) - 1) % stride else []):
        table.add_row(*(_fmt(row.get(k)) for k in keys))
    Console().print(table)
    return 0


def _list(group: str) -> int:
    for name in available(group):
        print(name)
    return 0


def _fmt(value: object) -> str:
    if value is None:
        return ""
    return f"{value:.3f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
