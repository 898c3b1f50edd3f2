"""Training health: name the failure that makes a run look alive while it is not learning.

Every step of a training run (the synchronous and the asynchronous loop alike, both through
``rllm.engine.training.train_step`` and the Trainer's loop) is judged by the checks of
``rllm.engine.training.health_checks`` from what the step already has: its metrics row, plus a few
figures the step measures from its episodes (``health_measure``) and, for ``weights_stale``, the
sampler's logprobs of a fixed probe set after each update (``weight_probe``: one small
``prompt_logprobs`` request a step, the only extra model work).

Each check logs ``health/NAME`` (1 while its condition holds, else 0; absent where the row has
nothing to judge). The first time one fires, the run prints one line, ``health: NAME at step S:
EVIDENCE. Likely cause: CAUSE`` (also in the row as ``warning/health/NAME``, which ``rllm view``
shows), and the end of the run repeats it in a summary. A check named in ``health.stop_on``
stops the run there with that line (``HealthStop``; ``rllm train`` exits 3), after the step's row
is written. ``rllm doctor run RUN_DIR`` replays the same checks over a run folder's rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

import msgspec

from rllm.engine.training.health_checks import CHECK_TYPES, Check
from rllm.engine.training.health_config import CHECKS, HealthSection
from rllm.types.errors import StateError

HEALTH_STOP_EXIT = 3  # `rllm train`'s exit status when health.stop_on stopped the run

assert tuple(c.name for c in CHECK_TYPES) == tuple(CHECKS), "health_config.CHECKS and CHECK_TYPES differ"


class HealthStop(StateError):
    """A check named in ``health.stop_on`` fired: the run stops with its line."""

    exit_code = HEALTH_STOP_EXIT


class Firing(msgspec.Struct, kw_only=True):
    """What one check saw: the step it first fired, the evidence then, and how often it held."""

    name: str
    first_step: int
    evidence: str
    cause: str
    last_step: int = 0
    steps: int = 0  # steps its condition held, from the first on

    @property
    def line(self) -> str:
        return f"health: {self.name} at step {self.first_step}: {self.evidence}. Likely cause: {self.cause}"

    def summary(self) -> str:
        again = f" (held at {self.steps} steps, the last {self.last_step})" if self.steps > 1 else ""
        return f"health: {self.name} fired at step {self.first_step}{again}: {self.evidence}. Likely cause: {self.cause}"


class HealthMonitor:
    """Runs the enabled checks over each step's row (``observe``), in step order."""

    def __init__(self, section: HealthSection | None = None, *, max_mismatch: float | None = None) -> None:
        self.section = section or HealthSection()
        self.checks: list[Check] = [
            cls(self.section, max_mismatch) for cls in CHECK_TYPES if self.section.runs(cls.name)
        ]
        self.fired: dict[str, Firing] = {}
        self.judged: set[str] = set()  # checks some row gave something to judge
        self.notes: list[str] = []  # checks that could not run (e.g. no probe), for the summary
        self._unsaid: list[str] = []  # of those, the ones the run has not printed yet

    def observe(self, step: int, row: MutableMapping[str, Any]) -> list[Firing]:
        """Judge ``row`` (step ``step``): writes each judged check's ``health/NAME`` into it and
        returns the checks that fired for the first time (their ``warning/health/NAME`` written too)."""
        new: list[Firing] = []
        for check in self.checks:
            verdict = check.observe(step, row)
            if verdict is None:
                continue
            self.judged.add(check.name)
            row[f"health/{check.name}"] = 1.0 if verdict.firing else 0.0
            if not verdict.firing:
                continue
            firing = self.fired.get(check.name)
            if firing is None:
                firing = Firing(
                    name=check.name, first_step=step, evidence=verdict.evidence, cause=check.cause
                )
                self.fired[check.name] = firing
                row[f"warning/health/{check.name}"] = firing.line
                new.append(firing)
            firing.steps += 1
            firing.last_step = step
        return new

    def stop_for(self, firings: Iterable[Firing]) -> HealthStop | None:
        """The error that stops the run when one of ``firings`` is named in ``health.stop_on``."""
        for firing in firings:
            if firing.name in self.section.stop_on:
                return HealthStop(f"{firing.line} (stopped: health.stop_on names {firing.name})")
        return None

    def turn_off(self, name: str, why: str) -> str:
        """Stop running check ``name`` (it cannot run here): the line saying so."""
        self.checks = [c for c in self.checks if c.name != name]
        note = f"health: {name} is off for this run: {why}"
        self.notes.append(note)
        self._unsaid.append(note)
        return note

    def take_notes(self) -> list[str]:
        """The notes not printed yet (the Trainer prints them at the step they arose)."""
        unsaid, self._unsaid = self._unsaid, []
        return unsaid

    def summary(self) -> list[str]:
        """The end-of-run lines: each check that fired, in the checks' order."""
        return [*self.notes, *(self.fired[name].summary() for name in CHECKS if name in self.fired)]


def replay(rows: Iterable[Mapping[str, Any]], section: HealthSection | None = None) -> HealthMonitor:
    """A monitor that has judged ``rows`` (a run's metrics, in order): ``rllm doctor run``."""
    monitor = HealthMonitor(section)
    for row in rows:
        monitor.observe(int(row.get("step", 0)), dict(row))
    return monitor
