"""The capability matrix: what each backend honours, asked of the code itself.

Nothing here is written by hand per backend: each row is a probe that runs the very check a run
would run before it starts (``Backend.validate`` on an algorithm config, ``validate_async``,
``validate_partial``, the SFT check, the executors the engine has), on a backend built from its options without
starting it. ``rllm capabilities`` prints the table; docs/capabilities.md holds a copy that a test
compares with a fresh one, so a change to a backend's validation fails CI until the doc is
regenerated (``rllm capabilities --write docs/capabilities.md``).

Modalities: text is what every backend trains on; images where the backend's own
``validate_images`` passes (``rllm.engine.modality``, which also refuses a batch with images on
any other backend before it trains).

Execution flows (regular, sandboxed, command) and the executors built into the engine (remote,
ray: :mod:`rllm.engine.rollout.executors`, read from its registry) run in front of the gateway,
so every backend that trains on the gateway's traces honours them; an executor this build does
not have registered reads "no" everywhere.

Task selection (``rollout.curriculum``, its ``promote``, ``algorithm.dynamic_sampling``) is the
training loop's, before any backend sees a batch: a backend honours it wherever it runs RL, which
the row asks of its ``validate`` (with ``dynamic_sampling`` on, for the algorithm option).
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

from rllm.algos.config import AlgorithmConfig, DynamicSampling
from rllm.algos.registry import BUILTIN_LOSSES, available_estimators, get_estimator
from rllm.engine.modality import trains_on_images
from rllm.engine.plugins import BACKENDS_GROUP, available, backend_class
from rllm.engine.rollout.executors import BUILTIN_EXECUTORS, available_executors, resolve_executor
from rllm.engine.training.staleness import check_backend

# How to build each backend variant without starting it: the options its constructor parses.
# (The only hand-written part: which variants exist. Whether they honour an option is asked.)
VARIANTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "tinker": [
        ("tinker local", {"service": "local", "model": "tiny"}),
        ("tinker remote", {"service": "remote", "model": "probe", "lora": {"rank": 8}}),
    ],
}
DEFAULT_OPTIONS: dict[str, Any] = {"model": "probe"}

# Flows the engine runs whatever the backend (rllm.engine.rollout.rollout_engine, sandbox, sdk.command).
ENGINE_FLOWS = ("regular", "sandboxed", "command")

Probe = Callable[[Any], bool]


def _validates(**options: Any) -> Probe:
    def probe(backend: Any) -> bool:
        try:
            backend.validate(AlgorithmConfig(**options))
        except (ValueError, TypeError):
            return False
        return True

    return probe


def _async_ok(backend: Any) -> bool:
    check = getattr(backend, "validate_async", None)
    if check is None:
        return False
    try:
        check(1)
    except ValueError:
        return False
    return True


def _partial_ok(backend: Any) -> bool:
    try:
        check_backend(backend, 1, partial=True)
    except ValueError:
        return False
    return True


def _sft_ok(backend: Any) -> bool:
    from rllm.engine.data.sft import SFT_ALGORITHM

    try:
        backend.validate(SFT_ALGORITHM)
    except ValueError:
        return False
    return True


def _sft_extras_ok(backend: Any) -> bool:
    """`rllm sft` with a held-out loss, warmup and an LR schedule passes its check (rllm.engine.data.sft)."""
    from rllm.engine.data.sft import SFTConfig, check_backend

    wanted = SFTConfig(dataset="-", val_dataset="-", val_every=1, warmup_steps=1, lr_schedule="cosine")
    try:
        check_backend(wanted, backend)
    except ValueError:
        return False
    return True


def _flow(name: str) -> Probe:
    honoured = name in ENGINE_FLOWS or name in available_executors()
    return lambda backend: honoured


def executor_rows() -> list[str]:
    """The built-in executors that are rows of their own (the registry's, not plugins': the table
    is the product's): all but the ones an unset ``rollout.executor`` means, ``local`` and
    ``processes``, which run the regular flows above."""
    defaults = {resolve_executor(None, 1), resolve_executor(None, 2)}
    return [name for name in BUILTIN_EXECUTORS if name not in defaults]


def builtin_estimators() -> list[str]:
    """rllm.algos' own estimators (not plugins or test registrations: the table is the product's)."""
    names = [n for n in available_estimators() if get_estimator(n).fn.__module__ == "rllm.algos.estimators"]
    return sorted(names)


def probes() -> list[tuple[str, str, Probe]]:
    """(section, row, probe) for every row of the table, in order."""
    aggregations = typing.get_args(typing.get_type_hints(AlgorithmConfig)["aggregation"])
    rows: list[tuple[str, str, Probe]] = []
    rows += [("algorithm", f"loss = {name}", _validates(loss=name)) for name in BUILTIN_LOSSES]
    rows += [("algorithm", f"estimator = {n}", _validates(estimator=n)) for n in builtin_estimators()]
    rows += [("algorithm", f"aggregation = {a}", _validates(aggregation=a)) for a in aggregations]
    rows += [
        ("algorithm", "step_credit = turn", _validates(step_credit="turn", estimator="turn")),
        ("algorithm", "kl_coef > 0", _validates(kl_coef=0.1)),
        ("algorithm", "entropy_coef > 0", _validates(entropy_coef=0.01)),
        ("algorithm", "tis = token", _validates(tis="token")),
        ("algorithm", "tis = sequence", _validates(tis="sequence")),
        ("algorithm", "tis = trust_region", _validates(tis="trust_region")),
        ("algorithm", "max_mismatch", _validates(max_mismatch=0.05)),
    ]
    rows += [
        ("task selection", "rollout.curriculum (tasks drawn by pass rate)", _validates()),
        ("task selection", "rollout.curriculum.promote (difficulty levels)", _validates()),
        (
            "task selection",
            "algorithm.dynamic_sampling (groups with signal)",
            _validates(dynamic_sampling=DynamicSampling(enabled=True)),
        ),
    ]
    rows += [("execution flow", name, _flow(name)) for name in (*ENGINE_FLOWS, *executor_rows())]
    rows += [("modality", "text", _validates()), ("modality", "images", trains_on_images)]
    rows += [
        ("training mode", "RL, synchronous", _validates()),
        ("training mode", "RL, asynchronous (max_staleness > 0)", _async_ok),
        ("training mode", "RL, asynchronous, partial rollouts (rollout.partial)", _partial_ok),
        ("training mode", "SFT", _sft_ok),
        (
            "training mode",
            "SFT, held-out loss and LR schedule (val_every, warmup_steps, lr_schedule)",
            _sft_extras_ok,
        ),
    ]
    return rows


def backend_variants() -> list[tuple[str, Any]]:
    """(column name, backend instance, not started) for every installed backend's variants."""
    out: list[tuple[str, Any]] = []
    for name in available(BACKENDS_GROUP):
        cls = backend_class(name)
        for label, options in VARIANTS.get(name, [(name, DEFAULT_OPTIONS)]):
            out.append((label, cls(dict(options))))
    return out


def capability_matrix() -> tuple[list[str], list[tuple[str, str, list[bool]]]]:
    """(column names, rows of (section, row, honoured per column))."""
    variants = backend_variants()
    rows = [(section, row, [probe(b) for _, b in variants]) for section, row, probe in probes()]
    return [label for label, _ in variants], rows


def render_markdown() -> str:
    """The table as docs/capabilities.md holds it."""
    columns, rows = capability_matrix()
    lines = [
        "# Capability matrix",
        "",
        "Generated by `rllm capabilities --write docs/capabilities.md` from the backends' own checks",
        "(`rllm.engine.capabilities`); `tests/test_capabilities.py` fails when it differs from the code.",
        "yes: the backend honours it; no: a run asking for it is refused before it starts.",
        "",
        "| | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    section = ""
    for sec, row, marks in rows:
        if sec != section:
            section = sec
            lines.append(f"| **{sec}** |" + " |" * len(columns))
        lines.append(f"| {row} | " + " | ".join("yes" if m else "no" for m in marks) + " |")
    return "\n".join(lines) + "\n"
