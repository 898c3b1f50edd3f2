"""`rllm eval NAME`: a cookbook (or a registered dataset with an agent) against a model endpoint."""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from rllm.cli.adapters import adapter_cookbook
from rllm.cli.errors import FAILED, CliError
from rllm.cli.registry import DatasetRegistry
from rllm.engine.plugins import COOKBOOKS_GROUP, PluginNotFoundError, available, load_cookbook
from rllm.runtime.event_loop import run
from rllm.sdk.cookbook import Cookbook
from rllm.types import ConfigError, SamplingParams, Task
from rllm.types.config_file import apply_overrides, base_url_problem
from rllm.types.errors import InputError

if TYPE_CHECKING:
    from rllm.engine.evaluation import EvalSummary


@click.command("eval")
@click.argument("name")
@click.option("--base-url", default=None, help="OpenAI-compatible base URL ending in /v1")
@click.option(
    "--model",
    default="default",
    show_default=True,
    help="model name; without --base-url a LiteLLM provider/model, e.g. openai/gpt-4o-mini",
)
@click.option("--api-base", default=None, help="hosted models: the provider's base URL (LiteLLM api_base)")
@click.option("--split", default="test", show_default=True)
@click.option("--attempts", type=int, default=1, show_default=True, help="rollouts per task (pass@k)")
@click.option("--concurrency", type=int, default=32, show_default=True, help="rollouts running at once")
@click.option("--workers", type=int, default=1, show_default=True, help="processes running the flows")
@click.option("--max-examples", type=int, default=None, help="evaluate only the first N tasks")
@click.option("--temperature", type=float, help="sampling temperature (default: the flow's)")
@click.option("--max-tokens", type=int, help="completion token limit (default: the flow's)")
@click.option("--agent", default=None, help="cookbook name or module:attr whose flow runs (datasets)")
@click.option("--evaluator", default=None, help="cookbook name or module:attr that grades (datasets)")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="results directory (default runs/eval-NAME); one that holds results needs --resume or --overwrite",
)
@click.option(
    "--resume", is_flag=True, help="finish the evaluation in --out (the same settings): its missing tasks"
)
@click.option("--overwrite", is_flag=True, help="replace the evaluation in --out")
@click.option(
    "--allow-changes",
    "allow_changes",
    multiple=True,
    metavar="KEY[,KEY]",
    help="with --resume: let these settings differ from the evaluation's record (attempts, "
    "max_examples, concurrency, workers, max_infra_errors, base_url, api_base, remote)",
)
@click.option(
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="a cookbook option (its Cookbook.configure), e.g. --option judge_model=NAME; repeatable",
)
@click.option(
    "--max-infra-errors",
    type=click.FloatRange(0.0, 1.0),
    default=0.5,
    show_default=True,
    help="fail (exit 1) when more than this fraction of rollouts failed for infrastructure reasons",
)
@click.option(
    "--remote",
    "remote_urls",
    multiple=True,
    metavar="URL",
    help="agent services that run the rollouts (rollout.executor=remote; `rllm agent serve`); repeatable",
)
@click.option("--progress/--no-progress", default=True, help="show a progress bar")
def eval_command(
    name: str,
    base_url: str | None,
    model: str,
    api_base: str | None,
    split: str,
    attempts: int,
    concurrency: int,
    workers: int,
    max_examples: int | None,
    temperature: float | None,
    max_tokens: int | None,
    agent: str | None,
    evaluator: str | None,
    out: Path | None,
    resume: bool,
    overwrite: bool,
    allow_changes: tuple[str, ...],
    options: tuple[str, ...],
    max_infra_errors: float,
    remote_urls: tuple[str, ...],
    progress: bool,
) -> int:
    """Evaluate cookbook NAME (or registered dataset NAME with --agent) and print a summary.

    Writes OUT/results.jsonl (one line per task), episodes.jsonl and summary.json. An --out that
    holds an evaluation is refused unless --resume (the same settings: it skips finished tasks
    and retries those that failed for infrastructure reasons) or --overwrite (replaces it); a
    resume with another endpoint, model, sampling or cookbook is refused naming what differs.
    The first errors are printed; more than --max-infra-errors of the rollouts failing for
    infrastructure reasons (dead endpoint, missing credentials) exits 1.

    \b
    Example:
      rllm eval say --base-url http://127.0.0.1:8000/v1 --attempts 4
      rllm eval gsm8k --agent my_agent:flow --evaluator math --model openai/gpt-4o-mini
      rllm eval say --base-url http://127.0.0.1:8000/v1 --remote http://10.0.0.5:8700
    """
    from rllm.engine.training.run_folder import RunFolder

    sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens)
    if max_examples is not None and max_examples < 1:
        raise CliError(f"--max-examples must be >= 1, got {max_examples}")
    if base_url is not None and (problem := base_url_problem(base_url)) is not None:
        raise CliError(f"--base-url {problem}")
    out_dir = out or Path("runs") / f"eval-{name}"
    settings = {
        "name": name,
        "split": split,
        "base_url": base_url,
        "model": model,
        "api_base": api_base,
        "attempts": attempts,
        "max_examples": max_examples,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "agent": agent,
        "evaluator": evaluator,
        "options": parse_options(options),
        "remote": list(remote_urls),
        "concurrency": concurrency,
        "workers": workers,
        "max_infra_errors": max_infra_errors,
    }
    # Before the tasks are loaded or an endpoint is started: the folder fits, or nothing happens.
    RunFolder(out_dir, "eval", settings).check(
        resume=resume, overwrite=overwrite, allow_changes=allow_changes
    )
    tasks, flow, grader = resolve_eval_target(name, split, agent, evaluator, parse_options(options))
    if max_examples is not None:
        tasks = tasks[:max_examples]
    if base_url is None and "/" not in model:
        raise CliError(
            "no model endpoint: pass --base-url URL/v1, or --model provider/name for a hosted model",
            hint="e.g. `rllm serve MODEL_PATH` prints a base URL to use",
        )

    # Loaded here, not at the top: it pulls in the rollout engine and the gateway, which every
    # other `rllm` command would pay for at start-up.
    from rllm.engine.evaluation import evaluate

    async def go() -> EvalSummary:
        async with _endpoint(base_url, model, api_base) as (endpoint, gateway_url, admin_key):
            return await evaluate(
                tasks,
                flow,
                grader,
                endpoint=endpoint,
                gateway_url=gateway_url,
                admin_key=admin_key,
                attempts=attempts,
                output_dir=out_dir,
                model=model,
                concurrency=concurrency,
                workers=workers,
                sampling=sampling,
                progress=progress,
                remote_urls=list(remote_urls),
                settings=settings,
                resume=resume,
                overwrite=overwrite,
                allow_changes=allow_changes,
            )

    summary = run(go(), uvloop_default=False)
    Console().print(summary_table(summary, title=f"{name} ({split}) -> {out_dir}"))
    report_errors(summary, max_infra_errors)
    return 0


def report_errors(summary: EvalSummary, max_infra_errors: float) -> None:
    """Print the first failed attempts' errors; a CliError (exit 1) when too many rollouts failed
    for infrastructure reasons, since their accuracy says nothing about the model."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    n = summary.num_rollouts
    failing = bool(n and summary.infra_errors / n > max_infra_errors)
    first_infra = next((e for e in summary.errors if e.startswith("infra_error: ")), "")
    for text in summary.errors:
        if not (failing and text == first_infra):  # that one is the error line below
            reason, _, message = text.partition(": ")
            err.print(f"[yellow]failed attempt ({reason}):[/yellow] {root_cause(message)[:500]}")
    if failing:
        raise CliError(
            f"{summary.infra_errors} of {n} rollouts failed for infrastructure reasons "
            f"(more than --max-infra-errors {max_infra_errors:g}): "
            f"{root_cause(first_infra.removeprefix('infra_error: '))[:500]}",
            hint="fix the endpoint or credentials; the same command with --resume retries only those",
            exit_code=FAILED,
        )


# Where the wrapped messages of the gateway and its clients quote the error that caused them.
_CAUSE_MARKERS = ("last error: ", "hosted provider failed: ")
_WRAPPER_PREFIX = re.compile(r"^(?:(?:[\w.]+(?:Error|Exception)|Error code: \d+)(?::| -) )+")


def root_cause(text: str) -> str:
    """The innermost cause of an attempt's error text: what the gateway quotes as its last error,
    without the client and provider exception names wrapped around it
    ("Missing credentials ... OPENAI_API_KEY", not "hosted provider failed: InternalServerError")."""
    for marker in _CAUSE_MARKERS:
        if marker in text:
            text = text.rsplit(marker, 1)[1]
    return _WRAPPER_PREFIX.sub("", text) or text


def parse_options(items: tuple[str, ...]) -> dict[str, Any]:
    """``--option KEY=VALUE`` pairs (dotted keys nest); each value is read as YAML."""
    try:
        return apply_overrides({}, items)
    except ConfigError as exc:
        raise CliError(f"--option: {exc}") from None


def resolve_eval_target(
    name: str, split: str, agent: str | None, evaluator: str | None, options: dict[str, Any] | None = None
) -> tuple[list[Task], Any, Any]:
    """Tasks, flow and evaluator for NAME: a cookbook's own (set up with ``options``), an
    environment adapter's (``PREFIX:NAME``, rllm.cli.adapters), or a registered dataset's tasks
    with the flow and evaluator that --agent / --evaluator name."""
    adapted = adapter_cookbook(name)
    if adapted is not None or name in available(COOKBOOKS_GROUP):
        try:
            cookbook = (adapted or load_cookbook(name)).with_options(options or {})
        except ValueError as exc:
            raise CliError(f"--option: {exc}") from None
        flow = load_object(agent, "flow") if agent else cookbook.flow
        grader = load_object(evaluator, "evaluator") if evaluator else cookbook.evaluator
        return cookbook.load_tasks(split), flow, grader
    registry = DatasetRegistry()
    if registry.has(name):
        if not agent:
            raise CliError(f"dataset {name!r} needs --agent (a cookbook name or module:attr flow)")
        try:
            flow, grader = agent_flow_and_grader(agent, evaluator, options or {})
        except ValueError as exc:
            raise CliError(f"--option: {exc}") from None
        return registry.load_tasks(name, split), flow, grader
    raise PluginNotFoundError(
        f"no cookbook or registered dataset named {name!r} "
        f"(cookbooks: {', '.join(available(COOKBOOKS_GROUP)) or 'none'}; "
        f"datasets: {', '.join(registry.names()) or 'none'})"
    )


def train_cookbook(name: str, agent: str | None, evaluator: str | None) -> Cookbook:
    """What `rllm train NAME` trains: cookbook NAME or an environment adapter's ``PREFIX:NAME``
    (its flow or evaluator replaced by --agent / --evaluator when given), or registered dataset
    NAME with --agent's flow and training defaults and --evaluator's (default: --agent's) grader,
    the same rule as `rllm eval`."""
    adapted = adapter_cookbook(name)
    if adapted is not None or name in available(COOKBOOKS_GROUP):
        cookbook = adapted or load_cookbook(name)
        if not agent and not evaluator:
            return cookbook
        flow = load_object(agent, "flow") if agent else cookbook.flow
        grader = load_object(evaluator, "evaluator") if evaluator else cookbook.evaluator
        return dataclasses.replace(cookbook, flow=flow, evaluator=grader)
    registry = DatasetRegistry()
    if not registry.has(name):
        raise PluginNotFoundError(
            f"no cookbook or registered dataset named {name!r} "
            f"(cookbooks: {', '.join(available(COOKBOOKS_GROUP)) or 'none'}; "
            f"datasets: {', '.join(registry.names()) or 'none'})"
        )
    if not agent:
        raise CliError(
            f"dataset {name!r} needs --agent (a cookbook name or module:attr flow)",
            hint=f"e.g. rllm train {name} --agent math",
        )
    splits = tuple(registry.info(name).splits)
    defaults = dict(load_cookbook(agent).train_defaults) if ":" not in agent else {}
    if defaults.get("val_split") not in splits:  # the agent's cookbook validates on its own split
        defaults = {k: v for k, v in defaults.items() if k not in ("val_split", "val_every", "val_tasks")}
    flow, grader = agent_flow_and_grader(agent, evaluator, {})
    dataset = Cookbook(
        name=name,
        flow=flow,
        evaluator=grader,
        load_tasks=lambda split: registry.load_tasks(name, split),
        description=f"registered dataset {name} with the {agent} agent",
        splits=splits,
        train_defaults=defaults,
    )

    def configure(options: dict[str, Any]) -> Cookbook:  # cookbook_options set up --agent's cookbook
        flow, grader = agent_flow_and_grader(agent, evaluator, options)
        return dataclasses.replace(dataset, flow=flow, evaluator=grader)

    return dataclasses.replace(dataset, configure=configure)


def agent_flow_and_grader(agent: str, evaluator: str | None, options: dict[str, Any]) -> tuple[Any, Any]:
    """--agent's flow and grader (--evaluator's when given) for a registered dataset, --agent's
    cookbook set up with ``options`` (``cookbook_options``, ``rllm eval --option``) first: the
    options of the cookbook whose parts run, never dropped. A ``module:attr`` agent takes none."""
    if ":" in agent:
        if options:
            raise InputError(
                f"options {sorted(options)} are a cookbook's; --agent {agent!r} is a flow, which takes none"
            )
        return load_object(agent, "flow"), load_object(evaluator or agent, "evaluator")
    cookbook = load_cookbook(agent).with_options(options)
    return cookbook.flow, load_object(evaluator, "evaluator") if evaluator else cookbook.evaluator


def load_object(ref: str, part: str) -> Any:
    """``module:attr`` imported, or a cookbook name whose ``part`` (flow / evaluator) is taken."""
    if ":" not in ref:
        return getattr(load_cookbook(ref), part)
    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise CliError(f"cannot load {part} {ref!r}: {exc}") from None


@asynccontextmanager
async def _endpoint(
    base_url: str | None, model: str, api_base: str | None
) -> AsyncIterator[tuple[str | None, str | None, str | None]]:
    """(endpoint, None, None) for a model server (the engine starts its own gateway); (None,
    gateway, its admin key) for a hosted model through LiteLLM.

    The provider's key comes from RLLM_GATEWAY_HOSTED_API_KEY, else from the provider's own
    variable (OPENAI_API_KEY, ...) that LiteLLM reads. The gateway's admin key is fresh and
    goes only to the engine, as for a gateway the engine starts itself."""
    if base_url is not None:
        yield base_url, None, None
        return
    from rllm.gateway import GatewayConfig, GatewayServer

    admin_key = secrets.token_urlsafe(32)
    server = GatewayServer(
        GatewayConfig(
            admin_key=admin_key,
            hosted_model=model,
            hosted_api_base=api_base,
            hosted_api_key=os.environ.get("RLLM_GATEWAY_HOSTED_API_KEY"),
            tokenizer_mode="plain",
            health_interval_s=0,
        )
    )
    await server.start()
    try:
        yield None, server.url, admin_key
    finally:
        await server.stop()


def summary_table(summary: EvalSummary, title: str = "") -> Table:
    """Accuracy, pass@k, reward, tokens, latency quantiles and termination reasons, one per row."""
    table = Table(title=title or None, show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row(
        "tasks",
        f"{summary.num_tasks}" + (f" ({summary.resumed_tasks} resumed)" if summary.resumed_tasks else ""),
    )
    table.add_row("rollouts", str(summary.num_rollouts))
    table.add_row("accuracy", f"{summary.accuracy:.3f}")
    for key, value in summary.pass_at_k.items():
        table.add_row(key, f"{value:.3f}")
    table.add_row("mean reward", f"{summary.mean_reward:.3f}")
    table.add_row(
        "tokens (prompt / completion)", f"{summary.tokens['prompt']:.0f} / {summary.tokens['completion']:.0f}"
    )
    table.add_row("completion tokens / rollout", f"{summary.tokens['completion_per_rollout']:.1f}")
    lat = summary.latency_s
    table.add_row("latency s (p50 / p95 / max)", f"{lat['p50']:.2f} / {lat['p95']:.2f} / {lat['max']:.2f}")
    for reason, count in sorted(summary.termination.items()):
        table.add_row(f"termination: {reason}", str(count))
    table.add_row("wall s", f"{summary.wall_s:.1f}")
    return table
