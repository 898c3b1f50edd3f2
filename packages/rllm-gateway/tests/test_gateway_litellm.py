"""The real litellm client against the gateway, and the gateway's hosted mode through LiteLLM."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
import openai

from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer


async def test_litellm_client_through_gateway(client, model_name):
    s = await client.create_session("llm")
    r = await litellm.acompletion(
        model=f"openai/{model_name}",
        api_base=s.base_url,
        api_key=s.token,
        messages=[{"role": "user", "content": "from litellm"}],
        max_tokens=8,
    )
    (t,) = await client.get_traces("llm")
    assert t.response.content == r.choices[0].message.content
    assert t.completion_ids is not None and len(t.completion_logprobs) == len(t.completion_ids)
    stream = await litellm.acompletion(
        model=f"openai/{model_name}",
        api_base=s.base_url,
        api_key=s.token,
        messages=[{"role": "user", "content": "stream"}],
        max_tokens=8,
        stream=True,
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream])
    traces = await client.get_traces("llm")
    assert len(traces) == 2 and traces[1].response.content == text


async def test_hosted_mode_records_text_and_usage(mock):
    cfg = GatewayConfig(
        hosted_model="openai/mock-model",
        hosted_api_base=mock.url,
        hosted_api_key="sk-test",
        health_interval_s=0,
    )
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
        oc = openai.AsyncOpenAI(base_url=c.session_url("h"), api_key="x")
        r = await oc.chat.completions.create(
            model="anything", messages=[{"role": "user", "content": "api model"}]
        )
        assert r.choices[0].message.content == "echo: api model"
        chunks = [
            ch
            async for ch in await oc.chat.completions.create(
                model="anything", messages=[{"role": "user", "content": "s"}], stream=True
            )
        ]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: s"
        t1, _ = await c.get_traces("h")
    assert t1.response.content == "echo: api model"
    assert t1.usage.completion_tokens == len("echo: api model") and t1.usage.prompt_tokens > 0
    assert t1.completion_ids is None and t1.prompt_ids is None
    assert mock.stats.last_request.get("return_token_ids") is None
