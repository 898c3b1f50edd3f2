"""Which policy answers a call, when a run trains several (rllm.engine.training.policies).

The gateway is told each policy's served model name (``GatewayConfig.policies``) and the policy
each role trains (``GatewayConfig.roles``). A call is routed, with no change to the agent:

- by the model it asks for, when that is a policy's name (``model="judge"``): an agent that
  picks its model per call picks its policy so;
- otherwise by its role (``/sessions/{sid}/roles/{role}/v1`` or the ``X-RLLM-Role`` header, as
  the SDK's per-role base URLs send it): ``roles[role]``, and the default policy for a role
  without a mapping.

The call goes upstream with its policy's model name, and its trace records the policy (beside
the weight version the gateway stamps on every trace).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_POLICY = "default"


def route_policy(
    policies: Mapping[str, str], roles: Mapping[str, str], role: str, body: dict[str, Any]
) -> str | None:
    """The call's policy (None where the gateway routes no policies); sets the body's model to
    the policy's served name."""
    if not policies:
        return None
    asked = body.get("model")
    policy = asked if isinstance(asked, str) and asked in policies else roles.get(role, DEFAULT_POLICY)
    body["model"] = policies[policy]
    return policy


def policy_problems(policies: Mapping[str, str], roles: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(key, message)`` for each way the routes cannot work."""
    problems: list[tuple[str, str]] = []
    if roles and DEFAULT_POLICY not in policies:
        problems.append(("policies", "routing roles to policies needs the default policy's model name"))
    for role, policy in roles.items():
        if policy not in policies:
            problems.append(
                (
                    f"roles.{role}",
                    f"role {role!r} maps to unknown policy {policy!r} (policies: {', '.join(policies)})",
                )
            )
    return problems


__all__ = ["DEFAULT_POLICY", "policy_problems", "route_policy"]
