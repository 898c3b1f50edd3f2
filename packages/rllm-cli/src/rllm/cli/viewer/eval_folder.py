"""What the viewer reads from an evaluation folder (``rllm eval``'s ``episodes.jsonl`` and
``summary.json``).

``rllm eval --resume`` runs again every task that had an attempt fail for infrastructure reasons
and appends the new episodes, so a rollout (task, rollout index) can be in the file more than
once. The viewer lists each rollout once, as its last run left it; the earlier runs, and the
retries inside a run (``Episode.metadata["retried"]``, which the rollout runner records), are its
retry history.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rllm.types import Episode, SchemaError, from_json

EVAL_EPISODES = "episodes.jsonl"  # what `rllm eval` writes beside results.jsonl and summary.json
EVAL_SUMMARY = "summary.json"


def read_eval_episodes(path: Path) -> list[Episode]:
    """The episodes of an evaluation, in the order they were written; a torn last line (a killed
    run) is skipped."""
    lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    out = []
    for number, line in enumerate(lines, start=1):
        try:
            out.append(from_json(line, Episode))
        except SchemaError:
            if number == len(lines):
                break
            raise
    return out


def _attempt(episode: Episode, when: str) -> dict[str, Any]:
    return {
        "when": when,
        "termination_reason": str(episode.termination_reason),
        "reward": episode.metrics.get("reward"),
        "error": f"{episode.error.type}: {episode.error.message}" if episode.error else None,
    }


def in_run_retries(episode: Episode, run: str) -> list[dict[str, Any]]:
    retried = episode.metadata.get("retried")
    if not isinstance(retried, list):
        return []
    return [
        {
            "when": f"{run}, attempt {int(r.get('attempt', n)) + 1} (retried at once)",
            "termination_reason": "infra_error",
            "reward": None,
            "error": str(r.get("error") or "") or None,
        }
        for n, r in enumerate(retried)
        if isinstance(r, dict)
    ]


def latest_rollouts(episodes: list[Episode]) -> list[tuple[Episode, list[dict[str, Any]]]]:
    """Each rollout once, as its last run left it, with its retry history (oldest first): the
    earlier runs' attempts and every run's immediate retries. First-seen order of the rollouts."""
    runs: dict[tuple[str, int], list[Episode]] = {}
    for episode in episodes:
        runs.setdefault((episode.task_id, episode.rollout_index), []).append(episode)
    out = []
    for tries in runs.values():
        history: list[dict[str, Any]] = []
        for number, episode in enumerate(tries, start=1):
            run = f"run {number}" if len(tries) > 1 else "this run"
            history += in_run_retries(episode, run)
            if number < len(tries):
                history.append(_attempt(episode, f"{run} (run again by --resume)"))
        out.append((tries[-1], history))
    return out


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """``summary.json`` as written (None: the evaluation did not finish; a broken file says so)."""
    path = run_dir / EVAL_SUMMARY
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_bytes())
    except ValueError as exc:
        return {"error": f"{path.name} is not JSON: {exc}"}
    return summary if isinstance(summary, dict) else {"error": f"{path.name} is not an object"}
