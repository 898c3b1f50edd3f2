"""rllm.sdk: what an agent harness installs.

``@rollout`` / ``AgentFlow`` for the agent, ``command_flow`` for an agent that is a program, ``@evaluator`` / ``Evaluator`` for the reward,
``role_url`` for multi-role flows, and reward helpers in ``rllm.sdk.rewards``. Depends only on
``rllm-types`` (optional extras: ``math`` for math-verify grading, ``judge`` and ``openai`` for
the openai client, ``images`` for image messages, ``hub`` for cookbooks' Hugging Face hub loaders).
"""

from rllm.sdk.answer import final_answer
from rllm.sdk.command import CommandError, CommandFlow, command_flow
from rllm.sdk.cookbook import Cookbook
from rllm.sdk.errors import FlowReturnError, InfraError
from rllm.sdk.evaluator import EvalResult, Evaluator, EvaluatorFn, as_evaluator, evaluator, to_eval_output
from rllm.sdk.flow import AgentFlow, FlowResult, RolloutFlow, as_flow, is_async_callable, rollout
from rllm.sdk.session import client_kwargs, role_url, sampling_kwargs, session_id_from_url, validate_role
from rllm.types import AgentConfig, Episode, EvalOutput, SamplingParams, Signal, Step, Task, Trajectory

__all__ = [
    "AgentConfig",
    "AgentFlow",
    "CommandError",
    "CommandFlow",
    "Cookbook",
    "Episode",
    "EvalOutput",
    "EvalResult",
    "Evaluator",
    "EvaluatorFn",
    "FlowResult",
    "FlowReturnError",
    "InfraError",
    "RolloutFlow",
    "SamplingParams",
    "Signal",
    "Step",
    "Task",
    "Trajectory",
    "as_evaluator",
    "as_flow",
    "client_kwargs",
    "command_flow",
    "evaluator",
    "final_answer",
    "is_async_callable",
    "role_url",
    "rollout",
    "sampling_kwargs",
    "session_id_from_url",
    "to_eval_output",
    "validate_role",
]
