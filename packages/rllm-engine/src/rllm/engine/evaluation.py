"""Evaluate a flow on a dataset: per-task results as JSONL, a summary, and resumable re-runs.

``evaluate`` starts a gateway in front of ``endpoint`` (an OpenAI-compatible model server) or
attaches to ``gateway_url``, runs ``attempts`` rollouts per task through the RolloutEngine, and
appends one JSON line per finished task to ``<output_dir>/results.jsonl`` as soon as the task's
attempts are done (with ``episodes.jsonl`` holding the full episodes when ``save_episodes``).
The folder is under the run-folder contract (rllm.engine.training.run_folder): it records the
evaluation's settings (``settings``: the cookbook, split, endpoint, model, sampling, ...), an
earlier evaluation there is refused unless ``resume`` or ``overwrite`` (which removes its files
first), and ``resume`` with other settings is refused naming them, so results of another model,
endpoint or cookbook are never mixed in, nor shown as new. ``resume`` skips tasks that already
have a line with enough attempts, so an interrupted evaluation goes on where it stopped; a task
with an attempt that failed for infrastructure reasons (a dead endpoint, missing credentials) is
not a result and is run again. ``summary.json`` is rewritten at the end from every line in
results.jsonl.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from rllm.engine.pass_at_k import mean_pass_at_k
from rllm.engine.rollout.failures import FAILED
from rllm.engine.rollout.remote_executor import RemoteSettings
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine, as_tasks
from rllm.engine.training.run_folder import RunFolder, object_name
from rllm.sdk.answer import final_answer
from rllm.types import Episode, SamplingParams, SchemaError, Task, to_json
from rllm.types.errors import InputError
from rllm.types.images import pack_episode_images


class AttemptResult(msgspec.Struct, omit_defaults=True):
    rollout_index: int
    reward: float
    is_correct: bool
    termination_reason: str
    answer: str = ""
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    # The evaluator's signals (EvalOutput.signals), e.g. rllm.sdk.v1's "v1/winner_correct".
    signals: dict[str, float] = msgspec.field(default_factory=dict)


class TaskResult(msgspec.Struct, omit_defaults=True):
    """One line of results.jsonl: a task and all its attempts."""

    task_id: str
    attempts: list[AttemptResult]
    num_correct: int
    mean_reward: float


class EvalSummary(msgspec.Struct):
    """What summary.json holds. ``accuracy`` is the fraction of correct attempts (= pass@1)."""

    num_tasks: int
    attempts: int
    num_rollouts: int
    accuracy: float
    pass_at_k: dict[str, float]
    mean_reward: float
    tokens: dict[str, float]
    latency_s: dict[str, float]
    termination: dict[str, int]
    resumed_tasks: int = 0
    wall_s: float = 0.0
    # Mean of each evaluator signal over the attempts that reported it.
    signals: dict[str, float] = msgspec.field(default_factory=dict)
    # Attempts that failed for infrastructure reasons (termination "infra_error").
    infra_errors: int = 0
    # The first distinct error texts of failed attempts (infrastructure ones first), for the user.
    errors: list[str] = msgspec.field(default_factory=list)


INFRA_ERROR = "infra_error"
MAX_ERRORS_SHOWN = 3


def is_finished(row: TaskResult, attempts: int) -> bool:
    """A task is done when it has its attempts and none failed for infrastructure reasons (those
    say nothing about the model: a resumed evaluation runs the task again)."""
    return len(row.attempts) >= attempts and not any(
        a.termination_reason == INFRA_ERROR for a in row.attempts
    )


def first_errors(attempts: Iterable[AttemptResult], limit: int = MAX_ERRORS_SHOWN) -> list[str]:
    failed = sorted((a for a in attempts if a.error), key=lambda a: a.termination_reason != INFRA_ERROR)
    return list(dict.fromkeys(f"{a.termination_reason}: {a.error}" for a in failed))[:limit]


def attempt_result(episode: Episode) -> AttemptResult:
    """Flatten an episode into the eval record. An unset ``is_correct`` counts as correct only with
    full reward (>= 1), so a bare-float evaluator still yields an accuracy."""
    reward = float(episode.metrics.get("reward", 0.0))
    correct = episode.is_correct if episode.is_correct is not None else reward >= 1.0
    if episode.termination_reason in FAILED:
        correct = False
    return AttemptResult(
        rollout_index=episode.rollout_index,
        reward=reward,
        is_correct=bool(correct),
        termination_reason=str(episode.termination_reason),
        answer=final_answer(episode)[-2000:],
        error=None if episode.error is None else f"{episode.error.type}: {episode.error.message}"[:2000],
        prompt_tokens=int(episode.metrics.get("prompt_tokens", 0)),
        completion_tokens=int(episode.metrics.get("completion_tokens", 0)),
        latency_s=float(episode.metrics.get("rollout_s", 0.0)),
        signals={k[7:]: float(v) for k, v in episode.metrics.items() if k.startswith("signal/")},
    )


def task_result(task_id: str, episodes: list[Episode]) -> TaskResult:
    attempts = sorted((attempt_result(ep) for ep in episodes), key=lambda a: a.rollout_index)
    return TaskResult(
        task_id=task_id,
        attempts=attempts,
        num_correct=sum(a.is_correct for a in attempts),
        mean_reward=math.fsum(a.reward for a in attempts) / len(attempts) if attempts else 0.0,
    )


def read_results(path: Path) -> dict[str, TaskResult]:
    """Existing results by task id (the last line for a task wins). A torn last line, left by a
    killed run, is ignored; a malformed line elsewhere raises SchemaError naming the line."""
    out: dict[str, TaskResult] = {}
    if not path.exists():
        return out
    lines = path.read_bytes().splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = msgspec.json.decode(line, type=TaskResult)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if number == len(lines):
                break
            raise SchemaError(f"{path}:{number}: not a task result: {exc}") from None
        out[row.task_id] = row
    return out


def summarize(
    results: Iterable[TaskResult], attempts: int, resumed: int = 0, wall_s: float = 0.0
) -> EvalSummary:
    """Accuracy, pass@k for every k <= attempts, mean reward, tokens, latency, termination counts."""
    rows = list(results)
    flat = [a for r in rows for a in r.attempts]
    per_task = [(len(r.attempts), r.num_correct) for r in rows]
    latencies = sorted(a.latency_s for a in flat)
    termination: dict[str, int] = {}
    for a in flat:
        termination[a.termination_reason] = termination.get(a.termination_reason, 0) + 1
    prompt = sum(a.prompt_tokens for a in flat)
    completion = sum(a.completion_tokens for a in flat)
    n = len(flat)
    return EvalSummary(
        num_tasks=len(rows),
        attempts=attempts,
        num_rollouts=n,
        accuracy=sum(a.is_correct for a in flat) / n if n else 0.0,
        pass_at_k={f"pass@{k}": mean_pass_at_k(per_task, k) for k in range(1, attempts + 1)},
        mean_reward=math.fsum(a.reward for a in flat) / n if n else 0.0,
        tokens={
            "prompt": float(prompt),
            "completion": float(completion),
            "total": float(prompt + completion),
            "completion_per_rollout": completion / n if n else 0.0,
        },
        latency_s={
            "mean": math.fsum(latencies) / n if n else 0.0,
            "p50": _quantile(latencies, 0.5),
            "p95": _quantile(latencies, 0.95),
            "max": latencies[-1] if latencies else 0.0,
        },
        termination=termination,
        resumed_tasks=resumed,
        wall_s=wall_s,
        signals=_signal_means(flat),
        infra_errors=termination.get(INFRA_ERROR, 0),
        errors=first_errors(flat),
    )


def _signal_means(attempts: list[AttemptResult]) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for attempt in attempts:
        for name, value in attempt.signals.items():
            values.setdefault(name, []).append(value)
    return {name: math.fsum(v) / len(v) for name, v in sorted(values.items())}


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def load_dataset(dataset: str | Path | Iterable[Task | dict[str, Any]]) -> list[Task]:
    """Tasks from a JSONL/JSON file or an iterable; duplicate ids are refused (results are keyed by id)."""
    if isinstance(dataset, str | Path):
        path = Path(dataset)
        text = path.read_text()
        if path.suffix == ".jsonl":
            rows = []
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise SchemaError(f"{path}:{number}: invalid JSON: {exc}") from None
        else:
            rows = json.loads(text)
        tasks = as_tasks(rows)
    else:
        tasks = as_tasks(dataset)
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise SchemaError(f"duplicate task id {task.id!r} in the dataset", "id")
        seen.add(task.id)
    return tasks


async def evaluate(
    dataset: str | Path | Iterable[Task | dict[str, Any]],
    flow: Any,
    evaluator: Any,
    endpoint: str | None = None,
    attempts: int = 1,
    *,
    output_dir: str | Path,
    gateway_url: str | None = None,
    admin_key: str | None = None,
    model: str = "default",
    concurrency: int = 32,
    workers: int = 1,
    deadline_s: float | None = 600.0,
    max_retries: int = 2,
    sampling: SamplingParams | None = None,
    save_episodes: bool = True,
    progress: bool = True,
    remote_urls: list[str] | None = None,
    settings: dict[str, Any] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    allow_changes: Iterable[str] = (),
) -> EvalSummary:
    """Run ``attempts`` rollouts of ``flow`` per task, grade them, write results and a summary.

    ``concurrency`` rollouts run at once, in ``workers`` processes (``RolloutConfig.workers``:
    for more agent traffic than one core carries; the flow must then be importable).
    ``remote_urls``: agent services run the rollouts instead of ``flow``
    (``rollout.executor = "remote"``, :mod:`rllm.engine.rollout.remote_executor`).
    ``settings`` is what the folder records and ``resume`` compares (default:
    :func:`eval_settings` of these arguments); ``allow_changes``: keys that may differ."""
    if attempts < 1:
        raise InputError(f"attempts must be >= 1, got {attempts}")
    if (endpoint is None) == (gateway_url is None):
        raise InputError("evaluate needs exactly one of endpoint (a model server's /v1 URL) or gateway_url")
    started = time.monotonic()
    tasks = load_dataset(dataset)
    if settings is None:
        settings = eval_settings(flow, evaluator, endpoint, model, attempts, sampling)
    out = Path(output_dir)
    RunFolder(out, "eval", settings).begin(resume=resume, overwrite=overwrite, allow_changes=allow_changes)
    results_path = out / "results.jsonl"
    previous = read_results(results_path)
    done_ids = {tid for tid, row in previous.items() if is_finished(row, attempts)}
    todo = [t for t in tasks if t.id not in done_ids]
    _drop_torn_tail(results_path)

    config = RolloutConfig(
        n=attempts,
        concurrency=concurrency,
        workers=workers,
        deadline_s=deadline_s,
        max_retries=max_retries,
        model=model,
        sampling=sampling or SamplingParams(),
        progress=progress,
        executor="remote" if remote_urls else None,
        remote=RemoteSettings(urls=list(remote_urls or [])),
    )
    engine = RolloutEngine(
        flow,
        evaluator,
        config,
        gateway_url=gateway_url,
        admin_key=admin_key,
        upstreams=None if endpoint is None else [endpoint],
    )
    fresh: dict[str, TaskResult] = {}
    if todo:
        async with engine:
            with (
                results_path.open("ab") as results_file,
                _maybe_open(out / "episodes.jsonl", save_episodes) as eps,
            ):
                async for episodes in engine.stream(todo, n=attempts, is_validation=True):
                    row = task_result(episodes[0].task_id, episodes)
                    fresh[row.task_id] = row
                    if eps is not None:
                        for ep in episodes:
                            eps.write(to_json(pack_episode_images(ep)) + b"\n")
                        eps.flush()
                    # The results line is written last: a task counts as done only once it is there.
                    results_file.write(msgspec.json.encode(row) + b"\n")
                    results_file.flush()
    wanted = {t.id for t in tasks}
    merged = {tid: row for tid, row in {**previous, **fresh}.items() if tid in wanted}
    summary = summarize(
        merged.values(), attempts, resumed=len(done_ids & wanted), wall_s=time.monotonic() - started
    )
    (out / "summary.json").write_bytes(msgspec.json.format(msgspec.json.encode(summary), indent=2) + b"\n")
    return summary


def eval_settings(
    flow: Any,
    evaluator: Any,
    endpoint: str | None,
    model: str,
    attempts: int,
    sampling: SamplingParams | None,
) -> dict[str, Any]:
    """What an evaluation run from code records (the CLI records its own flags instead); a
    gateway's address is not recorded (a hosted model's gateway is started anew each run)."""
    return {
        "agent": object_name(flow),
        "evaluator": object_name(evaluator),
        "base_url": endpoint,
        "model": model,
        "attempts": attempts,
        "sampling": msgspec.to_builtins(sampling or SamplingParams()),
    }


def _drop_torn_tail(path: Path) -> None:
    """Cut a partial last line (no trailing newline) so new lines do not get glued onto it."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


class _maybe_open:
    def __init__(self, path: Path, enabled: bool) -> None:
        self.path, self.enabled, self.file = path, enabled, None

    def __enter__(self) -> Any:
        if self.enabled:
            self.file = self.path.open("ab")
        return self.file

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()
