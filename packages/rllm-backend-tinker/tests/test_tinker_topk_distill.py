"""Dense distillation over the teacher's top-k on the local backend: the sampler serves vLLM's
``prompt_logprobs: k``, the Distiller puts it on the sequences, the local trainer runs the
``topk_*_kl`` losses (padded or packed), and the remote services refuse them."""

from __future__ import annotations

import asyncio
import copy
import json
import urllib.request
from pathlib import Path

import numpy as np
import openai
import pytest
import torch
from tinker_helpers import WORDS, reply_sequence, started_backend

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.local.trainer import LocalTrainer
from rllm.engine.data.distill import Distiller, DistillSection, TeacherClient
from rllm.tinker_api.losses import unsupported_algo_options
from rllm.types import FloatArray, TokenArray, TrainSequence
from rllm.types.errors import InputError
from rllm.types.sequence import TeacherTopK, check_teacher_topk


def sampled_sequence(backend: TinkerBackend, word: str, seed: int) -> TrainSequence:
    """The student's own sample: prompt + completion ids with the sampler's logprobs."""
    client = openai.OpenAI(base_url=backend.inference_urls()[0], api_key="x", max_retries=0)
    body = client.completions.create(
        model="any",
        prompt=f"<|user|> say : {word} <|end|> <|assistant|>",
        max_tokens=5,
        temperature=1.0,
        logprobs=0,
        seed=seed,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    ).model_dump()
    prompt, ids = body["prompt_token_ids"], body["choices"][0]["token_ids"]
    logprobs = body["choices"][0]["logprobs"]["token_logprobs"]
    return TrainSequence(
        input_ids=TokenArray(prompt + ids),
        loss_mask=FloatArray([0.0] * len(prompt) + [1.0] * len(ids)),
        advantages=FloatArray([0.0] * (len(prompt) + len(ids))),
        sampler_logprobs=FloatArray([0.0] * len(prompt) + logprobs),
        group_id=word,
    )


def forward_backward(
    backend: TinkerBackend, batch: list[TrainSequence], loss: str, **options: int
) -> tuple[dict[str, float], torch.Tensor]:
    """One forward_backward on a copy of the backend's (untrained) model; metrics and gradients."""
    model = copy.deepcopy(backend.service.trainer.model)
    trainer = LocalTrainer(model, TinkerBackendConfig(model="unused", **options), backend.service.device, 0)
    metrics = trainer.forward_backward(
        copy.deepcopy(batch), list(range(len(batch))), AlgorithmConfig(loss=loss), None
    )
    return metrics, torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None]).cpu()


def test_the_sampler_serves_vllms_top_k_prompt_logprobs(sampler_backend: TinkerBackend) -> None:
    ids = list(sampled_sequence(sampler_backend, "plum", 1).input_ids)
    body = {"model": "m", "prompt": [ids], "max_tokens": 1, "prompt_logprobs": 3}
    request = urllib.request.Request(
        sampler_backend.inference_urls()[0] + "/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        scores = json.loads(response.read())["choices"][0]["prompt_logprobs"]
    model = sampler_backend.service.trainer.model  # never trained: the sampler's weights
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
    assert scores[0] is None and len(scores) == len(ids)
    for position in range(1, len(ids)):
        entry = scores[position]
        want = torch.topk(full[position - 1], 3)
        top = sorted(entry.items(), key=lambda item: item[1]["rank"])[:3]
        assert [int(t) for t, _ in top] == want.indices.tolist()
        assert [v["rank"] for _, v in top] == [1, 2, 3]
        assert [v["logprob"] for _, v in top] == pytest.approx(want.values.tolist(), abs=1e-5)
        own = entry[str(ids[position])]
        assert own["logprob"] == pytest.approx(float(full[position - 1, ids[position]]), abs=1e-5)
        assert own["rank"] == int((full[position - 1] > full[position - 1, ids[position]]).sum()) + 1
        assert len(entry) == 3 + (own["rank"] > 3)


def test_a_teacher_equal_to_the_student_gives_zero_topk_loss_and_gradient(
    sampler_backend: TinkerBackend,
) -> None:
    batch = [sampled_sequence(sampler_backend, w, s) for s, w in enumerate(("plum", "apple", "plum"))]
    scored = TeacherClient(sampler_backend.inference_urls()[0]).score_topk_sync(
        [s.input_ids for s in batch], 4
    )
    for sequence, (_, topk) in zip(batch, scored, strict=True):
        sequence.teacher_topk = topk
    for loss in ("topk_forward_kl", "topk_reverse_kl"):
        metrics, grads = forward_backward(sampler_backend, batch, loss)
        assert abs(metrics["loss"]) < 1e-5 and metrics["num_tokens"] == 15
        assert float(grads.abs().max()) < 1e-4
        assert (
            0
            < metrics["distill/topk_mass_teacher"]
            == pytest.approx(metrics["distill/topk_mass_student"], abs=1e-5)
        )


def test_the_distiller_puts_the_teachers_topk_on_each_sequence(sampler_backend: TinkerBackend) -> None:
    section = DistillSection(teacher=sampler_backend.inference_urls()[0], loss="topk", topk=3)
    distiller = Distiller(section, sampler_backend.service.tokenizer)
    batch = [sampled_sequence(sampler_backend, w, s) for s, w in enumerate(("plum", "apple"))]
    metrics = asyncio.run(distiller.apply(batch))
    assert metrics["distill/tokens"] == 10
    for sequence in batch:
        assert check_teacher_topk(sequence).k == 3 and len(sequence.teacher_topk.ids) == 3 * len(
            sequence.input_ids
        )  # pyright: ignore[reportOptionalMemberAccess]


def test_a_teacher_that_ignores_k_is_a_clear_error(sampler_backend: TinkerBackend) -> None:
    """A server that answers ``prompt_logprobs: 3`` with the prompt's token alone at each position
    (as one honouring only 0 would): an error naming the position, not a top-1 of that token."""

    class IgnoresK(TeacherClient):
        def _post(self, body: dict) -> dict:
            answer = super()._post(body)
            for choice, ids in zip(answer["choices"], body["prompt"], strict=True):
                scores = choice["prompt_logprobs"]
                choice["prompt_logprobs"] = [None] + [
                    {str(t): e[str(t)]} for t, e in zip(ids[1:], scores[1:], strict=True)
                ]
            return answer

    sequence = sampled_sequence(sampler_backend, "plum", 0)
    with pytest.raises(InputError, match=r"prompt_logprobs\[1\] has 1 tokens, expected the top 3"):
        IgnoresK(sampler_backend.inference_urls()[0]).score_topk_sync([sequence.input_ids], 3)


def with_random_teacher(batch: list[TrainSequence], k: int, vocab: int, seed: int) -> list[TrainSequence]:
    """Each sequence with a made-up teacher's top-k (distinct ids, a proper distribution)."""
    rng = np.random.default_rng(seed)
    for sequence in batch:
        n = len(sequence.input_ids)
        ids = np.stack([rng.permutation(vocab)[:k] for _ in range(n)])
        logits = rng.normal(0, 2, (n, vocab))
        logprobs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        top = np.sort(logprobs, -1)[:, ::-1][:, :k]
        sequence.teacher_topk = TeacherTopK(
            k=k, ids=TokenArray(ids.flatten().tolist()), logprobs=FloatArray(top.flatten().tolist())
        )
    return batch


@pytest.fixture(scope="module")
def topk_backend(tiny_model_path: Path) -> TinkerBackend:
    backend = started_backend(tiny_model_path)
    yield backend  # pyright: ignore[reportReturnType]
    asyncio.run(backend.close())


def test_packed_rows_give_the_same_topk_loss_and_gradients(topk_backend: TinkerBackend) -> None:
    replies = [" ".join(WORDS[: k % 8 + 1]) for k in (0, 7, 2, 5, 1, 3)]
    batch = [reply_sequence(topk_backend, WORDS[k], reply, 0.0) for k, reply in enumerate(replies)]
    vocab = topk_backend.service.trainer.vocab_size
    batch = with_random_teacher(batch, 5, vocab, 0)
    lengths = [len(s.input_ids) for s in batch]
    pack = max(lengths) + min(lengths)
    for loss in ("topk_forward_kl", "topk_reverse_kl"):
        base, base_grads = forward_backward(topk_backend, batch, loss)
        assert base["loss"] > 0.1  # a different teacher: something to learn
        for options in (
            {"pack_tokens": pack},
            {"pack_tokens": pack, "micro_batch_tokens": pack},
            {"micro_batch_tokens": 40},
        ):
            metrics, grads = forward_backward(topk_backend, batch, loss, **options)
            assert metrics["loss"] == pytest.approx(base["loss"], abs=1e-5), options
            assert torch.allclose(grads, base_grads, atol=1e-5, rtol=0), (
                options,
                (grads - base_grads).abs().max(),
            )


def test_training_on_the_topk_loss_moves_the_student_toward_the_teacher(topk_backend: TinkerBackend) -> None:
    batch = with_random_teacher(
        [reply_sequence(topk_backend, "plum", "plum", 0.0)], 4, topk_backend.service.trainer.vocab_size, 1
    )
    model = copy.deepcopy(topk_backend.service.trainer.model)
    trainer = LocalTrainer(
        model, TinkerBackendConfig(model="unused", learning_rate=1e-2), topk_backend.service.device, 0
    )
    algo = AlgorithmConfig(loss="topk_forward_kl")
    first = trainer.train_step(copy.deepcopy(batch), algo)["distill/topk_kl"]
    for _ in range(3):
        last = trainer.train_step(copy.deepcopy(batch), algo)["distill/topk_kl"]
    assert last < first


def test_a_batch_without_the_teachers_topk_is_a_clear_error(topk_backend: TinkerBackend) -> None:
    batch = [
        reply_sequence(topk_backend, "plum", "plum", 0.0),
        reply_sequence(topk_backend, "apple", "apple", 0.0),
    ]
    with pytest.raises(InputError, match="without the teacher's top-k"):
        forward_backward(topk_backend, batch, "topk_forward_kl")
    with_random_teacher(batch[:1], 3, topk_backend.service.trainer.vocab_size, 2)
    with pytest.raises(InputError, match=r"batch\[1\]\.teacher_topk: none"):
        forward_backward(topk_backend, batch, "topk_forward_kl")


def test_the_remote_services_refuse_the_topk_losses_by_name() -> None:
    TinkerBackend({"model": "m"}).validate(
        AlgorithmConfig(loss="topk_forward_kl")
    )  # the local service runs it
    remote = TinkerBackend({"service": "remote", "model": "m", "lora": {"rank": 8}})
    with pytest.raises(ValueError, match=r"`loss` = 'topk_reverse_kl'.*distill\.loss=sampled"):
        remote.validate(AlgorithmConfig(loss="topk_reverse_kl"))
    assert any(
        "topk_forward_kl" in p
        for p in unsupported_algo_options(AlgorithmConfig(loss="topk_forward_kl"), "svc")
    )
