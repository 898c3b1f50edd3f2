"""How rollouts run: RolloutSettings (concurrency, deadlines, retries, sampling, processes,
sandboxes), and RolloutConfig, which adds what the one running the engine decides itself.

A training config's ``rollout`` section is a RolloutSettings; the Trainer completes it into the
RolloutConfig of its engine (``n`` from ``group_size``, the backend's model name, its own
progress display), so each setting is defined here once.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import msgspec

from rllm.engine.rollout.executors import RaySettings, available_executors, get_executor
from rllm.engine.rollout.remote_executor import RemoteSettings
from rllm.types import InvariantError, SamplingParams, Task
from rllm.types.errors import InputError, LookupFailed


class RolloutSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the rollouts of a :class:`~rllm.engine.rollout.rollout_engine.RolloutEngine` run.

    ``deadline_s`` bounds the time one attempt of one rollout is stalled (None: no deadline): its
    own code's time and the time a model call waits while the sampler answers nobody, not time
    queued behind other rollouts' calls that the sampler is answering
    (:mod:`rllm.engine.rollout.flow_runner`). ``max_retries`` counts
    extra attempts after an infrastructure failure (gateway/upstream), each on a fresh session;
    agent errors and timeouts are never retried, since running the same failing agent again
    would only waste compute. Retry ``k`` waits ``retry_backoff_s * 2**(k-1)``: long enough for
    the gateway's health check to bring a recovered upstream back. ``flow_threads`` sizes the
    thread pool for *sync* flows (default: ``concurrency``). ``val_sampling`` replaces
    ``sampling`` for validation runs. ``workers`` > 1 runs the flows in that many processes, each with its own embedded gateway
    (or attached to the same one), for more agent traffic than one core carries; flows must then
    be importable (see :mod:`rllm.engine.rollout.flow_processes`); each runs its share of ``concurrency`` and
    holds ``worker_prefetch`` more jobs queued (default: half its share), so its slots stay busy
    while this process is briefly stalled (e.g. collecting garbage). ``gc_gen0_threshold``
    raises CPython's young-generation GC threshold while the engine runs (see
    :mod:`rllm.runtime.gc_threshold`); None leaves the collector alone. A flow marked
    ``@needs_sandbox`` gets a sandbox per rollout from ``sandbox_backend`` (``bubblewrap``,
    ``docker`` or ``e2b``), with ``sandbox_warm`` of them prepared ahead (see :mod:`rllm.engine.sandbox`).
    ``executor`` says where flows run (:mod:`rllm.engine.rollout.executors`): ``local`` (this process),
    ``processes`` (``workers`` local processes), ``ray`` (Ray actors, ``ray``: a
    :class:`~rllm.engine.rollout.executors.RaySettings`), ``remote`` (agent services at ``remote.urls``)
    or any other registered executor (a plugin's); None: ``processes`` when ``workers`` > 1, else
    ``local``. A name the registry does not know is refused, listing the ones it knows.
    """

    concurrency: int = 64
    deadline_s: float | None = 600.0
    max_retries: int = 2
    retry_backoff_s: float = 1.0
    eval_timeout_s: float | None = 300.0
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    val_sampling: SamplingParams | None = None
    flow_threads: int | None = None
    keep_sessions: bool = False
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    gc_gen0_threshold: int | None = 50_000
    workers: int = 1
    worker_prefetch: int | None = None
    sandbox_backend: str = "bubblewrap"
    sandbox_warm: int = 0
    executor: str | None = None
    ray: RaySettings = msgspec.field(default_factory=RaySettings)
    remote: RemoteSettings = msgspec.field(default_factory=RemoteSettings)

    def __post_init__(self) -> None:
        if self.executor is not None:
            self._check_executor(self.executor)
        if self.concurrency < 1:
            raise InvariantError(f"concurrency must be >= 1, got {self.concurrency}", "concurrency")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise InvariantError(f"deadline_s must be > 0 or None, got {self.deadline_s}", "deadline_s")
        if self.max_retries < 0:
            raise InvariantError(f"max_retries must be >= 0, got {self.max_retries}", "max_retries")
        if self.retry_backoff_s < 0:
            raise InvariantError(
                f"retry_backoff_s must be >= 0, got {self.retry_backoff_s}", "retry_backoff_s"
            )
        if self.eval_timeout_s is not None and self.eval_timeout_s <= 0:
            raise InvariantError(
                f"eval_timeout_s must be > 0 or None, got {self.eval_timeout_s}", "eval_timeout_s"
            )
        if self.workers < 1:
            raise InvariantError(f"workers must be >= 1, got {self.workers}", "workers")
        if self.worker_prefetch is not None and self.worker_prefetch < 0:
            raise InvariantError(
                f"worker_prefetch must be >= 0 or None, got {self.worker_prefetch}", "worker_prefetch"
            )
        if self.gc_gen0_threshold is not None and self.gc_gen0_threshold < 1:
            raise InvariantError(
                f"gc_gen0_threshold must be >= 1 or None, got {self.gc_gen0_threshold}", "gc_gen0_threshold"
            )
        if self.sandbox_warm < 0:
            raise InvariantError(f"sandbox_warm must be >= 0, got {self.sandbox_warm}", "sandbox_warm")
        if self.sandbox_backend not in ("bubblewrap", "docker", "e2b"):
            raise InvariantError(
                f"sandbox_backend must be 'bubblewrap', 'docker' or 'e2b', got {self.sandbox_backend!r}",
                "sandbox_backend",
            )
        if self.flow_threads is not None and self.flow_threads < 1:
            raise InvariantError(f"flow_threads must be >= 1, got {self.flow_threads}", "flow_threads")

    def _check_executor(self, name: str) -> None:
        """``executor`` names a registered executor that can run with these settings."""
        try:
            spec = get_executor(name)
        except LookupFailed:
            known = ", ".join(map(repr, sorted(available_executors())))
            raise InvariantError(f"executor must be one of {known}, got {name!r}", "executor") from None
        # The executor's own needs first: a remote run without its URLs is refused for the URLs
        # (what the user must add), not for `workers`, which a cookbook may have set.
        if spec.check is not None:
            spec.check(self)
        if spec.in_process and self.workers > 1:
            raise InvariantError(
                f"executor {name!r} runs rollouts from this process: workers must be 1, got "
                f"{self.workers} (add rollout.workers=1, or use executor 'processes' or 'ray')",
                "workers",
            )

    def sampling_for(self, is_validation: bool) -> SamplingParams:
        return self.val_sampling if is_validation and self.val_sampling is not None else self.sampling


class RolloutConfig(RolloutSettings, kw_only=True, forbid_unknown_fields=True):
    """RolloutSettings plus what the caller decides for its engine: ``n`` rollouts per task (a
    run may ask for another), the ``model`` name agents send, and whether to draw a progress bar.
    ``sandbox_allow_task_network`` is the operator's consent to tasks whose own data asks for the
    network (a task directory's ``network = true``); without it such a run is refused. (In a
    training config: ``sandbox.allow_task_network``, a section of its own, not ``rollout``.)"""

    n: int = 1
    model: str = "default"
    progress: bool = True
    sandbox_allow_task_network: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n < 1:
            raise InvariantError(f"n (rollouts per task) must be >= 1, got {self.n}", "n")


def rollout_sampling(sampling: SamplingParams, task_id: str, rollout_index: int) -> SamplingParams:
    """The sampling parameters of one rollout's session.

    A configured ``seed`` becomes one seed per (task, rollout): the same for every run and retry of
    that rollout, different between the rollouts of a group. One seed for all of them would make a
    seeded sampler give every rollout of a group the same text, and GRPO's advantages would all be
    zero. (The gateway then gives each call of the session its own seed in turn.)
    """
    if sampling.seed is None:
        return sampling
    offset = zlib.crc32(f"{task_id}\0{rollout_index}".encode())  # stable across processes
    return msgspec.structs.replace(sampling, seed=(sampling.seed + offset) % 2**31)


def drawing_sampling(sampling: SamplingParams, drawing: int) -> SamplingParams:
    """The sampling of a task's ``drawing``-th drawing in one batch (a training step that draws a
    task more than once: ``tasks_per_step`` above the split's size, the curriculum, dynamic
    sampling's extra groups): drawing 0 keeps ``sampling``, each later one a seed of its own.
    ``rollout_sampling`` makes one seed per (task, rollout index), and each drawing's rollouts
    are numbered 0..n-1, so without this every drawing of a task in a step would repeat the
    first one's text, rollout for rollout: copies that add no signal."""
    if drawing == 0 or sampling.seed is None:
        return sampling
    offset = zlib.crc32(f"drawing\0{drawing}".encode())
    return msgspec.structs.replace(sampling, seed=(sampling.seed + offset) % 2**31)


def task_drawings(tasks: Sequence[Task], earlier: Sequence[Task] = ()) -> list[int]:
    """Each task's drawing number: how many times its id came before it, in ``earlier`` (a step's
    earlier rounds) and then in ``tasks``."""
    seen: dict[str, int] = {}
    for task in earlier:
        seen[task.id] = seen.get(task.id, 0) + 1
    out: list[int] = []
    for task in tasks:
        out.append(seen.get(task.id, 0))
        seen[task.id] = out[-1] + 1
    return out


def drawings_sampling(
    tasks: Sequence[Task],
    sampling: SamplingParams | None,
    configured: SamplingParams,
    drawings: Sequence[int] | None = None,
) -> list[SamplingParams | None]:
    """Each task's sampling in one batch: ``sampling`` (None: the ``configured`` one) for a first
    drawing, ``drawing_sampling`` of it for a later one. ``drawings``: each task's drawing number
    (a later round of a step continues the count); default: how often its id came before it."""
    numbers = task_drawings(tasks) if drawings is None else list(drawings)
    if len(numbers) != len(tasks):
        raise InputError(f"drawings: {len(numbers)} numbers for {len(tasks)} tasks")
    base = sampling if sampling is not None else configured
    return [drawing_sampling(base, k) if k else sampling for k in numbers]
