"""Scoring a finished rollout: the evaluator's verdict written onto the Episode and its trajectories.

Shared by the engine (each rollout, in this process or a flow worker's) and the flow worker
processes (an episode that cannot be sent back is scored 0 before it is reported).
"""

from __future__ import annotations

from rllm.engine.rollout.eval_dispatch import EvalDispatch
from rllm.engine.rollout.failures import FAILED, classify_exception
from rllm.engine.rollout.flow_runner import call_with_deadline
from rllm.sdk.evaluator import EvaluatorFn, to_eval_output
from rllm.types import Episode, ErrorInfo, EvalOutput, Task, TerminationReason, to_builtins


async def score_episode(
    task: Task,
    episode: Episode,
    evaluator: EvaluatorFn | None,
    deadline_s: float | None,
    dispatch: EvalDispatch | None = None,
) -> None:
    """Apply ``evaluator``. Failed rollouts get reward 0 without evaluation (nothing to grade);
    an evaluator exception (or one past ``deadline_s``) gives reward 0 and is recorded in
    ``metadata["eval_error"]`` — the agent's outcome, e.g. a verifier refused by the sandbox the
    agent broke (``SandboxAgentError``). One the agent cannot have caused (an infrastructure
    error: the verifier's sandbox gone for a host reason, a judge's upstream down; see
    ``rllm.engine.rollout.failures``) turns the episode into an ``infra_error`` instead, which the engine
    retries. Without an evaluator a flow that rewarded its trajectories itself keeps its rewards,
    any other gets 0. ``dispatch`` (the engine's): where a sync evaluator runs (eval_dispatch.py);
    without it every sync call goes to the thread pool."""
    if episode.termination_reason in FAILED:
        apply_eval_output(episode, EvalOutput(reward=0.0, is_correct=False))
        return
    if evaluator is None:
        if any(t.reward is not None for t in episode.trajectories):
            return  # the flow scored itself
        apply_eval_output(episode, EvalOutput(reward=0.0))
        return
    try:
        if dispatch is not None and not evaluator.is_async:
            value = await dispatch.call(evaluator.evaluate, (task, episode), deadline_s=deadline_s)
        else:
            value = await call_with_deadline(
                evaluator.evaluate,
                (task, episode),
                is_async=evaluator.is_async,
                deadline_s=deadline_s,
                executor=None,  # the default pool: hung sync flows must not starve evaluation
            )
        output = to_eval_output(value, source=f"evaluator {evaluator.name!r}")
    except Exception as exc:
        error = ErrorInfo.from_exception(exc)
        episode.metadata["eval_error"] = to_builtins(error)
        output = EvalOutput(reward=0.0, is_correct=False)
        if classify_exception(exc) == TerminationReason.INFRA_ERROR:
            episode.termination_reason, episode.error = TerminationReason.INFRA_ERROR, error
    apply_eval_output(episode, output)


def apply_eval_output(episode: Episode, output: EvalOutput) -> None:
    """Write ``output`` onto ``episode``: correctness, each trajectory's reward (per trajectory id,
    then per role, then the episode's reward), signals, the reward metric and eval metadata."""
    episode.is_correct = output.is_correct
    overrides = output.trajectory_rewards or {}
    for trajectory in episode.trajectories:
        # By trajectory id first: a flow with many calls per role rewards each one on its own.
        trajectory.reward = overrides.get(trajectory.id, overrides.get(trajectory.role, output.reward))
        if output.signals:
            trajectory.signals.extend(output.signals)
    episode.metrics["reward"] = output.reward
    for signal in output.signals:
        episode.metrics[f"signal/{signal.name}"] = signal.value
    if output.metadata:
        episode.metadata["eval"] = output.metadata
