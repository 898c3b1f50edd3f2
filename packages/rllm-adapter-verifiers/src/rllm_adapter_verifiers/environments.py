"""verifiers environments: loading one by name (with its arguments), its datasets as rLLM tasks,
and the version check.

An environment is a module with ``load_environment(**args)`` (an installed environment package,
``vf-gsm8k`` -> ``vf_gsm8k``, or any importable module path), loaded with verifiers' own
``vf.load_environment``. Each process loads it once per (name, arguments). A task carries the
environment's rollout input (prompt messages, answer, info, example id) and the environment's
address, so a flow in any process runs it without the dataset.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from importlib.metadata import version
from typing import Any

from rllm.types import Task
from rllm.types.errors import InputError, LookupFailed, MissingExtraError

# The verifiers API this adapter is written against: vf.load_environment, Environment.get_dataset
# / get_eval_dataset / run_rollout (generation and the rubric's scoring of one rollout), and
# vf.OpenAIChatCompletionsClient. 0.4 changed it (and needs openai < 3).
SUPPORTED = ("0.3.1", "0.4")  # [first, next-unsupported)
INPUT_KEYS = ("prompt", "answer", "info", "task", "example_id")

_loaded: dict[tuple[str, str], Any] = {}
_lock = threading.Lock()


class UnsupportedVersion(InputError):
    """The installed verifiers is outside the range this adapter supports."""


def _key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


def library() -> Any:
    """The verifiers module, after checking its version."""
    try:
        installed = version("verifiers")
    except Exception as exc:
        raise MissingExtraError("verifiers is not installed: pip install rllm-adapter-verifiers") from exc
    if not _key(SUPPORTED[0]) <= _key(installed) < _key(SUPPORTED[1]):
        raise UnsupportedVersion(
            f"verifiers {installed} is not supported (rllm-adapter-verifiers supports "
            f">={SUPPORTED[0]},<{SUPPORTED[1]})"
        )
    import verifiers

    return verifiers


def module_name(env_id: str) -> str:
    """The module verifiers imports for ``env_id`` (its own rule: '-' -> '_', the last '/' part)."""
    return env_id.replace("-", "_").split("/")[-1]


def load(env_id: str, args_json: str = "{}") -> Any:
    """Environment ``env_id`` built with its arguments (JSON), once per process."""
    key = (env_id, args_json)
    with _lock:
        env = _loaded.get(key)
    if env is not None:
        return env
    vf = library()
    name = module_name(env_id)
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is not there
        found = False
    if not found:
        raise LookupFailed(
            f"no verifiers environment {env_id!r}: module {name!r} is not installed "
            "(install the environment's package, or name an importable module with load_environment)"
        )
    try:
        env = vf.load_environment(env_id, **json.loads(args_json))
    except (TypeError, ValueError, RuntimeError) as exc:
        cause = exc.__cause__ or exc
        raise InputError(f"verifiers environment {env_id!r} did not load: {cause}") from None
    if not isinstance(env, vf.Environment):
        raise InputError(
            f"{name}.load_environment returned {type(env).__name__}, not a verifiers Environment"
        )
    with _lock:
        return _loaded.setdefault(key, env)


def tasks(env_id: str, args_json: str, split: str) -> list[Task]:
    """The environment's train (``get_dataset``) or test (``get_eval_dataset``) rows as tasks."""
    env = load(env_id, args_json)
    dataset = env.get_dataset() if split == "train" else env.get_eval_dataset()
    out = []
    for index, row in enumerate(dataset):
        rollout_input = {k: row[k] for k in INPUT_KEYS if k in row and row[k] is not None}
        rollout_input.setdefault("example_id", index)
        out.append(
            Task(
                id=f"{env_id}-{split}-{rollout_input['example_id']}",
                instruction=_last_user_text(rollout_input.get("prompt")),
                ground_truth=rollout_input.get("answer"),
                metadata={"verifiers": {"env": env_id, "args": args_json, "input": rollout_input}},
            )
        )
    return out


def has_eval_dataset(env: Any) -> bool:
    return getattr(env, "eval_dataset", None) is not None


def _last_user_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    for message in reversed(prompt or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content, default=str)
    return ""
