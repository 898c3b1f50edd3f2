"""Segments end to end: a cumulative-mode gateway (real tokenizer, trained locally) bridges turns
that extend the history; a compacted history starts a new segment. The episode keeps both, per role."""

from __future__ import annotations

import openai
import pytest

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.gateway import GatewayConfig, GatewayServer
from rllm.sdk import AgentConfig, Task, role_url, rollout
from rllm.testing import MockUpstream, build_tiny_chat_tokenizer
from rllm.types import TerminationReason


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    pytest.importorskip("transformers")  # the gateway's `tokenizer` extra
    return build_tiny_chat_tokenizer(str(tmp_path_factory.mktemp("tok")))


@rollout
async def compacting_agent(task: Task, config: AgentConfig) -> None:
    """Three turns that extend the chat, then a 'compacted' restart, plus one critic call."""
    async with openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as client:
        messages = [{"role": "user", "content": "hello world"}]
        for i in range(3):
            reply = await client.chat.completions.create(model=config.model, messages=messages)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"the answer is {i}"},
            ]
        summary = [{"role": "user", "content": "summary: the answer is 2"}]
        await client.chat.completions.create(model=config.model, messages=summary)
    critic_url = role_url(config, "critic")
    async with openai.AsyncOpenAI(base_url=critic_url, api_key=config.api_key, max_retries=0) as critic:
        await critic.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": "ok?"}]
        )


async def test_compacted_history_becomes_a_second_segment(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    async with MockUpstream(tokenizer=tok) as upstream:
        cfg = GatewayConfig(
            upstreams=[upstream.url],
            tokenizer_path=tokenizer_dir,
            tokenizer_mode="cumulative",
            health_interval_s=0,
            auto_create_sessions=False,
        )
        async with GatewayServer(cfg) as gateway:
            config = RolloutConfig(n=2, progress=False)
            async with RolloutEngine(compacting_agent, None, config, gateway_url=gateway.url) as engine:
                episodes = await engine.run([Task(id="seg", instruction="")])
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        main, critic = ep.trajectory("default"), ep.trajectory("critic")
        assert [s.metadata["segment"] for s in main.steps] == [0, 0, 0, 1]
        assert main.metadata["segments"] == 2 and critic.metadata["segments"] == 1
        # Within a segment each prompt starts with the previous prompt + sampled completion tokens.
        for prev, cur in zip(main.steps[:2], main.steps[1:3], strict=True):
            prefix = list(prev.prompt_ids) + list(prev.completion_ids)
            assert list(cur.prompt_ids[: len(prefix)]) == prefix
        for step in (*main.steps, *critic.steps):
            assert len(step.completion_logprobs) == len(step.completion_ids) > 0
