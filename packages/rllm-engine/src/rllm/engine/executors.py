"""Where a rollout's flow runs (``rollout.executor``): the dispatch from the setting to the code.

- ``"local"`` (default): the cookbook's flow runs in the engine's process (or its flow
  processes, ``rollout.workers``), as it always has;
- ``"remote"``: agent services over HTTP run it (:mod:`rllm.engine.remote_executor`,
  ``rollout.remote.urls``); the cookbook's own flow is not run, its evaluator and data are used.

Every executor keeps the engine's sessions, deadlines, retries and scoring: an executor only
replaces the flow object the engine calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rllm.engine.remote_executor import RemoteFlow

if TYPE_CHECKING:
    from rllm.engine.rollout_config import RolloutSettings

EXECUTORS = ("local", "remote")


def executor_flow(settings: RolloutSettings, flow: Any) -> Any:
    """The flow object the engine runs for ``settings.executor``."""
    if settings.executor == "remote":
        return RemoteFlow(settings.remote, deadline_s=settings.deadline_s)
    return flow


async def start_executor(flow: Any) -> None:
    """Before any rollout: check the executor can run one (fails loud, naming what is missing)."""
    if isinstance(flow, RemoteFlow):
        await flow.start()


def close_executor(flow: Any) -> None:
    if isinstance(flow, RemoteFlow):
        flow.close()
