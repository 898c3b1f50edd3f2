"""Guess the number: a small OpenEnv environment (openenv-core's ``Environment``, served by its
own ``create_app``) for the adapter's example, tests and CI training run.

``reset(seed)`` picks a secret from 1 to 8 (the seed decides it); each ``step(GuessAction)`` answers
"higher" or "lower" with reward 0, or "correct" with reward 1 and ``done``; after four wrong
guesses the episode is done with reward 0. ``app`` is the FastAPI app (HTTP + the ``/ws``
sessions ``EnvClient`` speaks); serve it with ``python -m rllm_adapter_openenv.serving
rllm_adapter_openenv.examples.guess:app``.
"""

from __future__ import annotations

import random
from typing import Any
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

LOW, HIGH, MAX_GUESSES = 1, 8, 4


class GuessAction(Action):
    guess: int = Field(..., description=f"a whole number from {LOW} to {HIGH}")


class GuessObservation(Observation):
    message: str = Field(default="", description="what the environment says")


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    """One game per session; its state is the secret and the guesses so far."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._secret = LOW

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> GuessObservation:
        self._secret = random.Random(seed).randint(LOW, HIGH)
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return GuessObservation(
            message=f"guess the number from {LOW} to {HIGH}: reply with the number only",
            done=False,
            reward=0.0,
        )

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:  # type: ignore[override]
        self._state.step_count += 1
        if action.guess == self._secret:
            return GuessObservation(message="correct", done=True, reward=1.0)
        hint = "higher" if action.guess < self._secret else "lower"
        if self._state.step_count >= MAX_GUESSES:
            return GuessObservation(message=f"{hint}; no guesses left", done=True, reward=0.0)
        return GuessObservation(message=hint, done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=256)
