"""reasoning-gym's generators as rLLM tasks: which generators exist, their configs, their entries.

A generator is built with ``reasoning_gym.create_dataset(name, seed=, size=, **params)``; its
entry ``i`` is a pure function of (name, params, seed, i), so a task carries only that address
(``Task.metadata["reasoning_gym"]``) and the evaluator builds the entry again where it scores it
(any process), instead of shipping the generator's own metadata, which need not be plain data.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib.metadata import version
from typing import Any

from rllm.types import Task
from rllm.types.errors import InputError, LookupFailed, MissingExtraError

# The reasoning-gym API this adapter is written against: create_dataset, factory.DATASETS
# (name -> (dataset class, config dataclass)), ProceduralDataset.__getitem__ / score_answer.
SUPPORTED = ("0.1.19", "0.2")  # [first, next-unsupported)
SEED_KEYS = ("seed", "size")


class UnsupportedVersion(InputError):
    """The installed reasoning-gym's version is outside the range this adapter supports."""


def library() -> Any:
    """The reasoning_gym module, after checking its version is one this adapter supports."""
    try:
        installed = version("reasoning-gym")
    except Exception as exc:
        raise MissingExtraError(
            "reasoning-gym is not installed: pip install rllm-adapter-reasoning-gym"
        ) from exc
    if not _in_range(installed):
        raise UnsupportedVersion(
            f"reasoning-gym {installed} is not supported (rllm-adapter-reasoning-gym supports "
            f">={SUPPORTED[0]},<{SUPPORTED[1]})"
        )
    import reasoning_gym

    return reasoning_gym


def _in_range(installed: str) -> bool:
    def key(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())

    return key(SUPPORTED[0]) <= key(installed) < key(SUPPORTED[1])


def names() -> list[str]:
    """Every generator reasoning-gym registers."""
    from reasoning_gym.factory import DATASETS

    library()
    return sorted(DATASETS)


def parameters(name: str) -> list[str]:
    """The config fields generator ``name`` takes (its difficulty parameters), seed and size aside."""
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        raise LookupFailed(
            f"reasoning-gym has no generator {name!r} (it has {len(DATASETS)}: {', '.join(names()[:12])}, ...)"
        )
    config_cls = DATASETS[name][1]
    return [f.name for f in dataclasses.fields(config_cls) if f.name not in SEED_KEYS]


def check_params(name: str, params: dict[str, Any]) -> None:
    """Refuse, naming them, parameters generator ``name`` does not take or its config rejects."""
    known = parameters(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise InputError(f"reasoning-gym:{name} takes no option {unknown} (its parameters: {known})")
    try:
        build(name, json.dumps(params, sort_keys=True), seed=0, size=1)
    except (AssertionError, TypeError, ValueError) as exc:
        raise InputError(f"reasoning-gym:{name}: {exc or type(exc).__name__}") from None


@functools.lru_cache(maxsize=64)
def build(name: str, params_json: str, *, seed: int, size: int) -> Any:
    """Generator ``name`` with its parameters (JSON, so the cache key is hashable)."""
    return library().create_dataset(name, seed=seed, size=size, **json.loads(params_json))


def tasks(name: str, params: dict[str, Any], *, seed: int, size: int, split: str) -> list[Task]:
    """``size`` tasks of generator ``name``: the question as the instruction, the oracle answer as
    the ground truth, the entry's address in ``metadata["reasoning_gym"]``."""
    params_json = json.dumps(params, sort_keys=True)
    dataset = build(name, params_json, seed=seed, size=size)
    out = []
    for index in range(size):
        entry = dataset[index]
        address = {"dataset": name, "params": params_json, "seed": seed, "size": size, "index": index}
        out.append(
            Task(
                id=f"{name}-{split}-{index}",
                instruction=str(entry["question"]),
                ground_truth=str(entry["answer"]) if entry.get("answer") is not None else None,
                metadata={"reasoning_gym": address},
            )
        )
    return out


def entry_of(task: Task) -> tuple[Any, dict[str, Any]]:
    """The generator and entry a task was made from, built again from its address."""
    address = task.metadata.get("reasoning_gym")
    if not isinstance(address, dict):
        raise InputError(
            f"task {task.id!r} was not made by the reasoning-gym adapter (no metadata.reasoning_gym)"
        )
    dataset = build(address["dataset"], address["params"], seed=address["seed"], size=address["size"])
    return dataset, dataset[address["index"]]
