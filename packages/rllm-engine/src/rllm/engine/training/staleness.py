"""One staleness bound for asynchronous training: its settings, its check, and who may honour it.

``rollout.max_staleness = K`` means one thing on every backend: the update computed from weight
version ``v`` may use a sample only if every model call of it was answered by version ``>= v - K``.
``K = 0`` (the default) is the synchronous loop, unchanged. A backend honours ``K > 0`` only if
it says so (``validate_async``); any other backend is refused by name before anything starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from rllm.algos.registry import get_loss
from rllm.engine.rollout.rollout_config import RolloutSettings
from rllm.engine.training.curriculum import CurriculumSettings
from rllm.types import Episode, Step
from rllm.types.errors import ConfigError, InvariantError


class TrainRolloutSettings(RolloutSettings, kw_only=True, forbid_unknown_fields=True):
    """A training run's ``rollout`` section: the engine's settings plus the asynchronous knobs.

    ``max_staleness`` (K): how many weight versions a sample may lag the update that uses it; 0
    keeps today's synchronous loop. ``stale_policy``: what happens to a group that would exceed K
    (its oldest call older than ``v - K``): ``requeue`` runs its task again on newer weights,
    ``drop`` discards it; either is counted per step, never silent. ``uncorrected_staleness``:
    the explicit opt-out of off-policy correction (``algorithm.tis``) when K > 0.
    ``sync_timeout_s``: the watchdog on one weight sync (gateway drain + backend sync); a sync
    that takes longer stops the run with an error instead of hanging it. ``partial``: at a weight
    sync, abort the calls in flight and re-send them from their token history on the new weights
    instead of draining them (the default); only a backend that says it can abort a call and
    continue it token for token (``validate_partial``) takes it, any other refuses it by name
    (the gateway then aborts at each pause: ``rllm.gateway.partial``). ``prefetch`` (K = 0):
    start step N+1's rollouts while step N trains; their calls wait at the gateway's door and
    are sampled on step N's new weights (``rllm.engine.training.trainer``; no effect when K > 0).
    ``curriculum``: which tasks are drawn (``rllm.engine.training.curriculum``), in both loops.
    """

    max_staleness: int = 0
    stale_policy: Literal["drop", "requeue"] = "requeue"
    uncorrected_staleness: bool = False
    sync_timeout_s: float = 600.0
    partial: bool = False
    prefetch: bool = False
    curriculum: CurriculumSettings = msgspec.field(default_factory=CurriculumSettings)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_staleness < 0:
            raise InvariantError(
                f"max_staleness must be >= 0 (0: synchronous), got {self.max_staleness}", "max_staleness"
            )
        if not self.sync_timeout_s > 0:
            raise InvariantError(f"sync_timeout_s must be > 0, got {self.sync_timeout_s}", "sync_timeout_s")
        # A call continued after a sync gets what is left of its budget: without one the
        # gateway would refuse every call that omits max_tokens (400) mid-run.
        if self.partial and self.sampling.max_tokens is None:
            raise InvariantError(
                "partial=true continues a call aborted at a weight sync with what is left of "
                "its max_tokens: set sampling.max_tokens",
                "sampling.max_tokens",
            )
        # Validation calls are continued too: one whose val_sampling has no budget of its own
        # gets the training budget, rather than a 400 per call mid-run (the default val_sampling
        # only sets the temperature).
        if self.partial and self.val_sampling is not None and self.val_sampling.max_tokens is None:
            self.val_sampling = msgspec.structs.replace(
                self.val_sampling, max_tokens=self.sampling.max_tokens
            )


# Keys of TrainRolloutSettings that the RolloutEngine does not take (the trainer's own).
ASYNC_KEYS: tuple[str, ...] = (
    "max_staleness",
    "stale_policy",
    "uncorrected_staleness",
    "sync_timeout_s",
    "partial",
    "prefetch",
    "curriculum",
)


def engine_settings(settings: RolloutSettings) -> dict[str, Any]:
    """The settings as RolloutEngine keyword arguments (the trainer's own keys left out)."""
    import msgspec

    return {k: v for k, v in msgspec.structs.asdict(settings).items() if k not in ASYNC_KEYS}


def default_correction(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with off-policy correction turned on when it asks for K > 0 and does not name
    ``algorithm.tis`` itself: correction is the default, not an option.

    A clipped loss (the default PPO-clip) gets ``tis = "trust_region"``: its clip is taken around
    the policy that sampled the tokens, as Tinker's and prime-rl's one-step-off losses take it.
    Token TIS alone leaves a one-update step unclipped (the ratio to the current policy is 1),
    and its weight pi_now / pi_sampler, up to the cap, pushes again on the tokens the last
    update already moved: on the two-turn benchmark (seed 2, K = 1) a task's second turn
    collapsed onto a wrong word, its groups turned all-equal and were filtered, and the run
    ended at 0.86 against sync's 1.0; with the trust region it ended at 1.0
    (benchmarks/history/issue-30.md, "#30 round 7"). Any other loss gets token TIS, and a
    supervised one none. Which loss clips is its own declaration (``LossSpec.clips_ratio``),
    plugins' included.
    """
    rollout, algorithm = doc.get("rollout"), doc.get("algorithm", {})
    if not isinstance(rollout, dict) or not isinstance(algorithm, dict):
        return doc
    try:
        k = int(rollout.get("max_staleness", 0))
    except (TypeError, ValueError):
        return doc  # the typed decode names the bad value
    if k <= 0 or "tis" in algorithm:
        return doc
    try:
        spec = get_loss(algorithm.get("loss", "ppo_clip"))
    except (KeyError, TypeError):
        return doc  # an unknown or malformed loss name: the typed decode names it
    if spec.supervised:
        return doc
    tis = "trust_region" if spec.clips_ratio else "token"
    return {**doc, "algorithm": {**algorithm, "tis": tis}}


def check_correction(rollout: TrainRolloutSettings, tis: str, supervised: bool) -> None:
    """Refuse K > 0 with no off-policy correction unless the config opts out explicitly."""
    if rollout.max_staleness > 0 and tis == "none" and not supervised and not rollout.uncorrected_staleness:
        raise ConfigError.for_key(
            "algorithm.tis",
            f"rollout.max_staleness={rollout.max_staleness} trains on samples from older weights; "
            "correct for it (algorithm.tis='trust_region', 'token' or 'sequence') or opt out "
            "explicitly with rollout.uncorrected_staleness=true",
        )


def check_backend(backend: Any, max_staleness: int, partial: bool = False) -> None:
    """Refuse K > 0 on a backend that does not declare it honours the bound (``validate_async``),
    and partial rollouts (``rollout.partial``) on one that cannot abort and continue a call."""
    name = getattr(backend, "name", type(backend).__name__)
    if partial:
        check_partial(backend, name, max_staleness)
    if max_staleness == 0:
        return
    validate_async = getattr(backend, "validate_async", None)
    if validate_async is None:
        raise ConfigError.for_key(
            "rollout.max_staleness",
            f"backend {name!r} does not support asynchronous training (it cannot keep sampling "
            "while it trains); set rollout.max_staleness=0",
        )
    try:
        validate_async(max_staleness)
    except ValueError as exc:
        raise ConfigError.for_key("rollout.max_staleness", f"backend {name!r}: {exc}") from None


def check_partial(backend: Any, name: str, max_staleness: int) -> None:
    """``rollout.partial = true`` only where a sync can have calls in flight (K > 0) and the backend
    declares it can abort a call and re-send it from its token history (``validate_partial``)."""
    if max_staleness == 0:
        raise ConfigError.for_key(
            "rollout.partial",
            "rollout.partial=true aborts the calls in flight at a weight sync, but with "
            "rollout.max_staleness=0 every rollout has finished before the sync; set "
            "rollout.max_staleness >= 1 or rollout.partial=false",
        )
    validate_partial = getattr(backend, "validate_partial", None)
    if validate_partial is None:
        raise ConfigError.for_key(
            "rollout.partial",
            f"backend {name!r} cannot abort a call in flight and continue it token for token on "
            "the new weights; set rollout.partial=false (calls in flight are drained at each sync)",
        )
    try:
        validate_partial()
    except ValueError as exc:
        raise ConfigError.for_key("rollout.partial", f"backend {name!r}: {exc}") from None


def step_versions(step: Step) -> list[int]:
    """The weight versions that sampled the step's tokens: its call's version, and with partial
    rollouts (a call aborted at a sync and continued) each of its ``version_spans``."""
    versions = [] if step.weight_version is None else [step.weight_version]
    spans = step.metadata.get("version_spans")
    if isinstance(spans, list):
        versions += [int(v) for v, _ in spans]
    return versions


def episode_versions(episode: Episode) -> tuple[int, int] | None:
    """(oldest, newest) weight version of the episode's model calls' tokens; None if it made none."""
    versions = [v for t in episode.trajectories for s in t.steps for v in step_versions(s)]
    return (min(versions), max(versions)) if versions else None


def continued_calls(episodes: Iterable[Episode]) -> int:
    """Calls sampled by more than one weight version (partial rollouts continued them)."""
    return sum(
        len(s.metadata.get("version_spans") or ()) > 1
        for e in episodes
        for t in e.trajectories
        for s in t.steps
    )


def oldest_version(episodes: Iterable[Episode]) -> int | None:
    """The oldest weight version of any call of the group (None: no call carries one)."""
    oldest = [v[0] for e in episodes if (v := episode_versions(e)) is not None]
    return min(oldest) if oldest else None


def is_stale(episodes: Iterable[Episode], current_version: int, max_staleness: int) -> bool:
    """True when using the group for the update from ``current_version`` would exceed K."""
    oldest = oldest_version(episodes)
    return oldest is not None and oldest < current_version - max_staleness
