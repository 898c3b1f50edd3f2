"""What the viewer shows, read from a run directory: metrics rows, per-step episode samples
(``rllm.engine.training.metrics_log``) and, where a tokenizer is found, the text of every token.

An evaluation folder (``rllm eval``'s ``episodes.jsonl``) is shown the same way, as one "step"
(0) holding every rollout once (its retries are its history: ``viewer.eval_folder``); nothing in
it was trained or filtered, so nothing is struck out, and its summary stands in for curves. The
folder's record (``rllm-run.json``) says which command wrote it (an SFT run has a loss, no
samples) and may name a local model whose tokenizer gives the token texts.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

from rllm.cli.viewer.eval_folder import (
    EVAL_EPISODES,
    in_run_retries,
    latest_rollouts,
    read_eval_episodes,
    read_summary,
)
from rllm.engine.training.metrics_log import read_episode_sample, read_metrics, sample_path, sample_steps
from rllm.engine.training.run_folder import flatten, read_record
from rllm.types import Episode, Step, Trajectory, to_builtins
from rllm.types.errors import LookupFailed, RLLMError

EVAL_STEP = 0
NO_TOKENIZER = (
    "token texts need the model's tokenizer.json: none in this folder or named by its record, "
    "so tokens show as #id (`rllm view DIR --tokenizer FILE` names one); the messages are the stored text"
)
Rollout = tuple[Episode, list[dict[str, Any]]]  # an episode and its retry history
# Config keys (the last part of a flattened key) that may name the run's model or tokenizer.
MODEL_KEYS = frozenset({"model", "model_path", "base_model", "tokenizer", "tokenizer_path"})


class RunNotFoundError(RLLMError, FileNotFoundError):
    """The directory holds neither metrics nor episode samples."""


class TokenText:
    """Token id -> text through a ``tokenizer.json`` (the ``tokenizers`` library), else ``#id``."""

    def __init__(self, tokenizer_file: Path | None) -> None:
        self.path = tokenizer_file
        self._tok: Any = None
        if tokenizer_file is not None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(str(tokenizer_file))

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one instance per server, ids repeat a lot
    def __call__(self, token_id: int) -> str:
        if self._tok is None:
            return f"#{token_id}"
        return (
            self._tok.decode([token_id], skip_special_tokens=False) or self._tok.id_to_token(token_id) or ""
        )


def find_tokenizer(run_dir: Path) -> Path | None:
    """``tokenizer.json`` of the run's model when it lives in the run directory (tiny models do)."""
    for candidate in (run_dir / "tiny-model" / "tokenizer.json", run_dir / "tokenizer.json"):
        if candidate.is_file():
            return candidate
    return next(iter(sorted(run_dir.glob("*/tokenizer.json"))), None)


def recorded_tokenizer(run_dir: Path) -> Path | None:
    """``tokenizer.json`` of a model the folder's record names by a local path (an eval of a
    model folder, a run of a local model), relative paths read from the folder and from here."""
    record = read_record(run_dir)
    if record is None:
        return None
    for key, value in flatten(record.config).items():
        if key.rsplit(".", 1)[-1] not in MODEL_KEYS or not isinstance(value, str) or not value:
            continue
        for base in (Path.cwd(), run_dir):
            path = base / Path(value).expanduser()
            for candidate in (path / "tokenizer.json", path):
                if candidate.name == "tokenizer.json" and candidate.is_file():
                    return candidate
    return None


class RunView:
    """Read-only access to one run directory, in the shapes the page's JSON API returns."""

    def __init__(self, run_dir: Path, tokenizer: Path | None = None) -> None:
        self.run_dir = run_dir
        self.is_eval = (run_dir / EVAL_EPISODES).is_file() and not sample_steps(run_dir)
        if not (run_dir / "metrics.jsonl").is_file() and not sample_steps(run_dir) and not self.is_eval:
            raise RunNotFoundError(
                f"no metrics.jsonl, episode samples or {EVAL_EPISODES} in {run_dir} "
                "(neither a `rllm train` nor a `rllm eval` folder)"
            )
        record = read_record(run_dir)
        # The record says which command wrote the folder (an SFT run samples no episodes).
        self.kind = "eval" if self.is_eval else record.kind if record is not None else "train"
        self.tokens = TokenText(tokenizer or find_tokenizer(run_dir) or recorded_tokenizer(run_dir))
        self._eval: list[Rollout] | None = None

    def run(self) -> dict[str, Any]:
        rows = read_metrics(self.run_dir / "metrics.jsonl")
        warnings = [v for r in rows for k, v in r.items() if k.startswith("warning/") and isinstance(v, str)]
        return {
            "name": self.run_dir.resolve().name,
            "kind": self.kind,
            "metrics": [{k: v for k, v in r.items() if isinstance(v, int | float)} for r in rows],
            "steps": [EVAL_STEP] if self.is_eval else sample_steps(self.run_dir),
            "tokenizer": str(self.tokens.path) if self.tokens.path else None,
            "token_hint": None if self.tokens.path else NO_TOKENIZER,
            "summary": read_summary(self.run_dir) if self.is_eval else None,
            "warnings": list(dict.fromkeys(warnings)),
        }

    def _sample(self, step: int) -> tuple[list[Rollout], set[str] | None]:
        """The step's episodes, each with its retry history, and the ids of the trajectories it
        trained on (None: an evaluation, where nothing is trained and nothing filtered)."""
        if self.is_eval:
            if step != EVAL_STEP:
                raise LookupFailed(f"an evaluation has one step ({EVAL_STEP}), not {step}")
            if self._eval is None:
                self._eval = latest_rollouts(read_eval_episodes(self.run_dir / EVAL_EPISODES))
            return self._eval, None
        path = sample_path(self.run_dir, step)
        if not path.is_file():
            raise LookupFailed(f"no episode sample for step {step}")
        sample = read_episode_sample(path)
        # A training step's episodes are each their own rollout (a task may be drawn twice);
        # only the retries within a rollout are its history.
        rollouts = [(e, in_run_retries(e, "this run")) for e in sample.episodes]
        return rollouts, set(sample.trained_trajectory_ids)

    def episodes(self, step: int) -> list[dict[str, Any]]:
        episodes, trained = self._sample(step)
        return [
            {
                "index": i,
                "id": e.id,
                "task_id": e.task_id,
                "rollout_index": e.rollout_index,
                "reward": e.metrics.get("reward"),
                "is_correct": e.is_correct,
                "termination_reason": str(e.termination_reason),
                "trained": None if trained is None else any(t.id in trained for t in e.trajectories),
                "completion_tokens": sum(
                    len(s.completion_ids or ()) for t in e.trajectories for s in t.steps
                ),
                "retries": len(history),
                "policies": policies_of(e),
            }
            for i, (e, history) in enumerate(episodes)
        ]

    def episode(self, step: int, index: int) -> dict[str, Any]:
        episodes, trained = self._sample(step)
        if not 0 <= index < len(episodes):
            raise LookupFailed(f"step {step} has {len(episodes)} sampled episodes, not index {index}")
        e, history = episodes[index]
        return {
            "step": step,
            "index": index,
            "id": e.id,
            "task_id": e.task_id,
            "rollout_index": e.rollout_index,
            "reward": e.metrics.get("reward"),
            "is_correct": e.is_correct,
            "termination_reason": str(e.termination_reason),
            "error": to_builtins(e.error) if e.error else None,
            "retries": history,
            "text_hint": None if any(t.steps for t in e.trajectories) else no_text_reason(e),
            "metrics": e.metrics,
            # Image blocks hold rllm-image:sha256:<hex> references; the page resolves them here,
            # so each image crosses the wire once per episode, not once per step.
            "images": {h: uri for t in e.trajectories for s in t.steps for h, uri in s.images.items() if uri},
            "trajectories": [
                {
                    "id": t.id,
                    "role": t.role,
                    "reward": t.reward,
                    # What each step was credited with: its own Step.reward when the evaluator
                    # gave one (turn credit), else the trajectory's, which is its last step's.
                    "step_rewards": step_rewards(t),
                    "trained": None if trained is None else t.id in trained,
                    "steps": [self._step(s, trained is None or t.id in trained) for s in t.steps],
                }
                for t in e.trajectories
            ],
        }

    def _step(self, step: Step, trained: bool) -> dict[str, Any]:
        ids = list(step.completion_ids or ())
        logprobs = list(step.completion_logprobs or ())
        advantage = step.advantage
        per_token_adv = (
            list(advantage) if advantage is not None and not isinstance(advantage, float | int) else None
        )
        train_logprobs = step.metadata.get("train_logprobs")
        tokens = []
        for i, token_id in enumerate(ids):
            lp = logprobs[i] if i < len(logprobs) else None
            adv = per_token_adv[i] if per_token_adv is not None else advantage
            train_lp = (
                train_logprobs[i] if isinstance(train_logprobs, list) and i < len(train_logprobs) else None
            )
            tokens.append(
                {
                    "id": token_id,
                    "text": self.tokens(token_id),
                    "logprob": _finite(lp),
                    "mask": 1 if trained else 0,
                    "advantage": _finite(adv),
                    "mismatch": _finite(train_lp - lp) if train_lp is not None and lp is not None else None,
                }
            )
        return {
            "id": step.id,
            "input": [to_builtins(m) for m in step.input],
            "output": to_builtins(step.output) if step.output else None,
            "reward": step.reward,
            "advantage": advantage if isinstance(advantage, float | int) else None,
            "finish_reason": step.finish_reason,
            "weight_version": step.weight_version,
            "prompt_tokens": len(step.prompt_ids or ()),
            "tokens": tokens,
            "policy": policy_of(step),
        }


def policy_of(step: Step) -> str | None:
    """The policy that answered the step's call, where a run trains several (the episode
    builder copies TraceRecord.policy into the step's metadata)."""
    policy = step.metadata.get("policy")
    return policy if isinstance(policy, str) else None


def policies_of(episode: Episode) -> list[str]:
    return sorted({p for t in episode.trajectories for s in t.steps if (p := policy_of(s)) is not None})


def no_text_reason(episode: Episode) -> str:
    """One line on why an episode has no messages or tokens to show."""
    if episode.error is not None:
        return f"no model call was recorded: the rollout ended with {episode.error.type}: {episode.error.message}"
    return f"no model call was recorded (ended: {episode.termination_reason})"


def step_rewards(trajectory: Trajectory) -> list[float | None] | None:
    """Per-step rewards when any step carries its own (else None: the trajectory's is the one)."""
    steps = trajectory.steps
    if not any(s.reward is not None for s in steps):
        return None
    last = len(steps) - 1
    return [
        s.reward if s.reward is not None else (trajectory.reward if i == last else None)
        for i, s in enumerate(steps)
    ]


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def to_json_bytes(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()
