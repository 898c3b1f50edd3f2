"""``backend.options.sampler_dtype``: the local sampler's copy of the weights in another dtype than
the trainer's (bf16 sampling beside a float32 trainer), with real torch on the tiny model: the
trainer's weights stay float32 (LoRA's frozen base included), each sync casts the trained weights
into the copy, the sampler serves over HTTP from it, and a config that cannot hold it is refused."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import torch
from tinker_helpers import contrast_batch, prompt_ids, reply_logprob, start_backend

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.backends.tinker.config import parse_config
from rllm.engine.training.policies import PolicySection
from rllm.types import ConfigError


def _dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters() if p.is_floating_point()}


@pytest.mark.parametrize("lora", [{}, {"rank": 4}])
async def test_a_bf16_sampler_beside_a_float32_trainer_is_synced_and_serves(
    tiny_model_path: Path, lora
) -> None:
    backend = await start_backend(
        tiny_model_path, learning_rate=5e-2, dtype="float32", sampler_dtype="bfloat16", lora=lora
    )
    try:
        trainer, sampler = backend.service.trainer.model, backend.service.engine.model
        assert _dtypes(trainer) == {torch.float32} and _dtypes(sampler) == {torch.bfloat16}
        assert not {id(p) for p in trainer.parameters()} & {id(p) for p in sampler.parameters()}
        good = reply_logprob(backend, "apple", "apple", sampler)
        await backend.train_step(contrast_batch(backend), AlgorithmConfig())
        assert await backend.sync_weights() == 1
        sampled = dict(sampler.named_parameters())
        for name, param in trainer.named_parameters():
            assert param.dtype == torch.float32, name  # the trainer's own, LoRA's frozen base too
            assert torch.equal(sampled[name], param.detach().to(torch.bfloat16)), name
        assert reply_logprob(backend, "apple", "apple", sampler) > good
        # bf16's rounding, not another model: the copy's logprob is the trainer's within a few hundredths.
        trained = reply_logprob(backend, "apple", "apple")
        assert reply_logprob(backend, "apple", "apple", sampler) == pytest.approx(trained, abs=0.1)
        client = openai.AsyncOpenAI(base_url=backend.inference_urls()[0], api_key="x", max_retries=0)
        reply = await client.completions.create(
            model=backend.served_model_name(), prompt=prompt_ids(backend, "apple"), max_tokens=3, logprobs=1
        )
        assert (
            reply.choices[0].logprobs is not None and len(reply.choices[0].logprobs.token_logprobs or []) >= 1
        )
        await client.close()
    finally:
        await backend.close()


async def test_each_policy_s_sampler_copy_takes_the_dtype_and_the_trainer_keeps_its_own(
    tiny_model_path: Path,
) -> None:
    backend = TinkerBackend(
        {
            "model": str(tiny_model_path),
            "torch_threads": 2,
            "dtype": "float32",
            "sampler_dtype": "bfloat16",
            "learning_rate": 5e-2,
            "lora": {"rank": 4},
        }
    )
    backend.use_policies({"judge": PolicySection(learning_rate=5e-2)})
    await backend.start()
    try:
        trainer = backend.service.trainer.model
        assert _dtypes(trainer) == {torch.float32}
        for engine in backend.service.engines.values():
            assert _dtypes(engine.model) == {torch.bfloat16}
        await backend.train_policy_step("judge", contrast_batch(backend), AlgorithmConfig())
        await backend.sync_weights()
        assert _dtypes(trainer) == {torch.float32}
    finally:
        await backend.close()


@pytest.mark.parametrize("weights", ["shared", "none"])
def test_a_sampler_dtype_without_a_sampler_copy_is_refused_naming_the_key(weights: str) -> None:
    with pytest.raises(
        ConfigError, match=r"backend\.options\.sampler_dtype: 'bfloat16' needs the sampler's own"
    ):
        parse_config({"model": "m", "sampler_dtype": "bfloat16", "sampler_weights": weights})
    assert parse_config({"model": "m", "sampler_weights": weights}).sampler_dtype == "same"
