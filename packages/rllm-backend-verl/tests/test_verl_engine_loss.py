"""rllm.algos' loss inside verl's training engine equals rllm.algos run directly, values and gradients.

verl's FSDP2 engine (one rank, on the CPU) runs the batch as two micro-batches through
``TrainingWorker.train_mini_batch`` with ``RllmPolicyLoss`` as its loss function; the reference is a
plain transformers forward of the same weights over the whole padded batch and
``compute_policy_loss``. The learning rate is 0 so the weights stay those of the reference.
"""

from __future__ import annotations

import msgspec
import pytest

# Named on its own in the workspace env (no verl there), the file skips; nox -s verl runs it.
pytest.importorskip("verl")

import torch
from verl_helpers import cpu_config, reference_log_probs, sequence

from rllm.algos import AlgorithmConfig
from rllm.algos.config import AGGREGATIONS, LOSSES
from rllm.algos.losses import compute_policy_loss
from rllm.backends.verl.actor import prepare_update
from rllm.backends.verl.convert import to_data_proto
from rllm.backends.verl.loss import OLD_LOG_PROBS, REF_LOG_PROBS, RllmPolicyLoss
from rllm.backends.verl.workers import local_training_worker

pytestmark = pytest.mark.verl

BATCH = [
    sequence([10, 11, 12, 13, 14], [0, 0, 1, 1, 1], 1.0, "a", logprob=-2.0),
    sequence([10, 11, 15, 16], [0, 0, 1, 1], -1.0, "a", logprob=-3.0),
    sequence([10, 12, 13, 17, 18, 19], [0, 1, 1, 0, 1, 1], 0.5, "b", logprob=-2.5),  # an observation inside
    sequence([11, 12, 13], [0, 1, 1], -0.5, "b", logprob=-4.0),
]


@pytest.fixture(scope="module")
def frozen_worker(tiny_model_path):
    config = cpu_config(tiny_model_path)
    # lr 0: the optimizer step leaves the weights as the reference loads them; no clipping of grads.
    config = msgspec.structs.replace(
        config, optim=msgspec.structs.replace(config.optim, learning_rate=0.0, grad_clip=1e9)
    )
    return local_training_worker(config)


@pytest.fixture(scope="module")
def reference_model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        tiny_model_path, attn_implementation="sdpa", dtype=torch.float32
    )


CASES = [AlgorithmConfig(loss=loss, aggregation=agg) for loss in LOSSES for agg in AGGREGATIONS] + [
    AlgorithmConfig(kl_coef=0.1, kl_estimator="k3"),
    AlgorithmConfig(kl_coef=0.05, kl_estimator="k1", aggregation="seq-mean-token-mean"),
    AlgorithmConfig(entropy_coef=0.01),
    AlgorithmConfig(tis="token", tis_cap=1.5),
    AlgorithmConfig(tis="sequence", aggregation="seq-mean-token-sum"),
    AlgorithmConfig(loss="dual_clip", clip_low=0.1, clip_high=0.3),
    AlgorithmConfig(aggregation="seq-mean-token-sum-norm", loss_scale_factor=7.0),
]


@pytest.mark.parametrize(
    "algo", CASES, ids=lambda a: f"{a.loss}-{a.aggregation}-kl{a.kl_coef}-ent{a.entropy_coef}-{a.tis}"
)
def test_engine_loss_and_gradients_equal_rllm_algos(
    algo: AlgorithmConfig, frozen_worker, reference_model
) -> None:
    data = to_data_proto(BATCH, pad_token_id=0)
    rows = data.batch
    with torch.no_grad():
        current, _ = reference_log_probs(reference_model, rows)
    noise = torch.linspace(-0.4, 0.4, current.numel()).reshape(current.shape)
    rows[OLD_LOG_PROBS] = (current + noise).detach()  # ratios away from 1, so clipping is exercised
    rows[REF_LOG_PROBS] = (current - noise.flip(-1)).detach()
    rows["rollout_log_probs"] = (current + 0.3 * noise.flip(0)).detach()

    loss_fn = RllmPolicyLoss(algo)
    frozen_worker.set_loss_fn(loss_fn)
    engine = frozen_worker.engine
    verl_grads: dict[str, torch.Tensor] = {}

    def snapshot(*_: object) -> None:  # the accumulated gradient, as the optimizer is about to see it
        for name, param in engine.module.named_parameters():
            verl_grads[name] = param.grad.full_tensor().clone()

    hook = engine.optimizer.register_step_pre_hook(snapshot)
    try:
        output = frozen_worker.train_mini_batch(prepare_update(data, loss_fn, mini_batches=1))
    finally:
        hook.remove()
    verl_loss = output["metrics"]["loss"]
    verl_loss = sum(verl_loss) if isinstance(verl_loss, list) else verl_loss

    reference_model.zero_grad()
    log_probs, entropy = reference_log_probs(reference_model, rows)
    expected, _ = compute_policy_loss(
        log_probs,
        rows[OLD_LOG_PROBS],
        rows["advantages"],
        rows["response_mask"].bool(),
        algo,
        sampler_logprobs=rows["rollout_log_probs"],
        ref_logprobs=rows[REF_LOG_PROBS],
        entropy=entropy,
    )
    expected.backward()
    assert verl_loss == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    reference_grads = dict(reference_model.named_parameters())
    assert set(verl_grads) == set(reference_grads)
    for name, grad in verl_grads.items():
        expected_grad = reference_grads[name].grad
        # atol scales with the tensor: an embedding gradient is a sum over every position, and
        # FSDP adds in another order than the plain module (on an AVX-512 CPU one entry near 0
        # of a tensor reaching 7 differed by 2.4e-6, a few float32 ulps of the tensor's scale).
        scale = max(1.0, expected_grad.abs().max().item())
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-6 * scale, msg=name)
