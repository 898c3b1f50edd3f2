"""Decorated flows and evaluators pickle by reference (worker processes receive them)."""

from __future__ import annotations

import pickle

import pytest

from rllm.sdk import evaluator, rollout
from rllm.sdk.flow import RolloutFlow


@rollout
async def module_flow(task, config):
    return None


@evaluator
def module_evaluator(task, episode):
    return 1.0


def test_module_level_flow_and_evaluator_round_trip_to_the_same_object():
    # pytest imports this file under its own module name; pickle resolves it through sys.modules.
    assert pickle.loads(pickle.dumps(module_flow)) is module_flow
    assert pickle.loads(pickle.dumps(module_evaluator)) is module_evaluator


def test_local_and_lambda_flows_refuse_to_pickle_with_a_clear_error():
    @rollout
    async def local_flow(task, config):
        return None

    with pytest.raises(pickle.PicklingError, match="not defined at module level"):
        pickle.dumps(local_flow)
    with pytest.raises(pickle.PicklingError, match="not defined at module level"):
        pickle.dumps(RolloutFlow(lambda task, config: None))
