"""Several policies behind one gateway (rllm.gateway.policy_routes): each call goes upstream with
its policy's model name, chosen by the model the agent asks for or by its role, and its trace
records the policy. A real gateway, a real openai client, a loopback upstream."""

from __future__ import annotations

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer
from rllm.gateway.admin_api import GatewayAPIError
from rllm.gateway.policy_routes import route_policy
from rllm.testing import MockUpstream
from rllm.types import InvariantError

POLICIES = {"default": "base-model", "judge": "judge"}
ROLES = {"judge": "judge"}


async def test_each_call_goes_to_its_roles_policy_or_the_one_it_names() -> None:
    sent: list[str] = []

    def respond(body: dict) -> str:
        sent.append(body["model"])
        return "ok"

    async with MockUpstream(responder=respond) as upstream:
        config = GatewayConfig(upstreams=[upstream.url], health_interval_s=0, policies=POLICIES, roles=ROLES)
        async with GatewayServer(config) as gateway, GatewayClient(gateway.url) as admin:
            await admin.create_session("s")
            calls = [("judge", "base-model"), ("solver_0", "base-model"), ("solver_0", "judge")]
            for role, model in calls:
                client = openai.AsyncOpenAI(base_url=f"{gateway.url}/sessions/s/roles/{role}/v1", api_key="x")
                await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hi"}]
                )
                await client.close()
            traces = sorted(await admin.get_traces("s"), key=lambda t: t.seq)
    # The judge role's call and the call naming model "judge" went to the judge's adapter.
    assert sent == ["judge", "base-model", "judge"]
    assert [(t.role, t.policy) for t in traces] == [
        ("judge", "judge"),
        ("solver_0", "default"),
        ("solver_0", "judge"),
    ]
    assert all(t.weight_version == 0 for t in traces)


async def test_a_gateway_without_policies_records_none() -> None:
    # As before policies: the upstream's own model name replaces one it does not serve.
    sent: list[str] = []
    upstream = MockUpstream(responder=lambda body: sent.append(body["model"]) or "ok")
    async with (
        upstream,
        GatewayServer(GatewayConfig(upstreams=[upstream.url], health_interval_s=0)) as gateway,
    ):
        client = openai.AsyncOpenAI(base_url=f"{gateway.url}/sessions/s/roles/judge/v1", api_key="x")
        await client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "hi"}])
        await client.close()
        (trace,) = await gateway.local_client().get_traces("s")
    assert sent == ["mock-model"] and trace.policy is None


def test_a_role_mapped_to_an_unknown_policy_is_refused() -> None:
    with pytest.raises(InvariantError, match="role 'judge' maps to unknown policy 'jduge'"):
        GatewayConfig(upstreams=["http://127.0.0.1:1/v1"], policies=POLICIES, roles={"judge": "jduge"})
    with pytest.raises(InvariantError, match="default policy"):
        GatewayConfig(upstreams=["http://127.0.0.1:1/v1"], policies={"judge": "judge"}, roles=ROLES)


@settings(deadline=None)  # a loaded machine's pauses are no failure of routing
@given(
    role=st.text(max_size=8),
    model=st.one_of(st.none(), st.text(max_size=8), st.sampled_from(["judge", "default"])),
)
def test_route_policy_always_sends_a_served_name(role: str, model: str | None) -> None:
    body = {} if model is None else {"model": model}
    policy = route_policy(POLICIES, ROLES, role, body)
    assert policy in POLICIES and body["model"] == POLICIES[policy]
    expected = model if model in POLICIES else ROLES.get(role, "default")
    assert policy == expected


async def test_renamed_policy_models_route_later_calls_and_another_set_is_refused() -> None:
    """A backend that serves each synced checkpoint under a new name (remote Tinker) renames its
    policies after a sync; calls from then on go upstream under the new names."""
    sent: list[str] = []
    async with MockUpstream(responder=lambda body: sent.append(body["model"]) or "ok") as upstream:
        config = GatewayConfig(upstreams=[upstream.url], health_interval_s=0, policies=POLICIES, roles=ROLES)
        async with GatewayServer(config) as gateway, GatewayClient(gateway.url) as admin:
            await admin.create_session("s")
            renamed = {"default": "base-v1", "judge": "judge-v1"}
            await admin.set_policy_models(renamed)
            for role in ("judge", "solver_0"):
                client = openai.AsyncOpenAI(base_url=f"{gateway.url}/sessions/s/roles/{role}/v1", api_key="x")
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
                await client.close()
            with pytest.raises(GatewayAPIError, match="this gateway routes default, judge"):
                await admin.set_policy_models({"default": "base-v2"})
            with pytest.raises(GatewayAPIError, match="must map each policy"):
                await gateway.local_client().set_policy_models({"default": "", "judge": "j"})
    assert sent == ["judge-v1", "base-v1"]
