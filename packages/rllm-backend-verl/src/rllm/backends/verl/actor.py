"""One rLLM train step on verl's training workers: log-probs, reference log-probs, update.

The same calls drive an in-process ``TrainingWorker`` (tests, CPU) and a Ray worker group
(``RayWorkerGroup`` exposes the worker's methods and returns futures); ``_resolve`` waits for
either. The batch goes through verl's own padding → no-padding conversion, as verl's trainer does.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from rllm.backends.verl.loss import OLD_LOG_PROBS, REF_LOG_PROBS, RllmPolicyLoss
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding


def _resolve(result: Any) -> TensorDict:
    return result if isinstance(result, TensorDict) else result.get()


def _padded_view(data: DataProto) -> TensorDict:
    td = left_right_2_no_padding(data.to_tensordict())
    # Log-probs of the unscaled logits: rllm.algos' ratios and TIS compare against the policy
    # itself, as on every backend, not against a temperature-scaled sampling distribution.
    tu.assign_non_tensor(td, temperature=1.0)
    return td


def compute_log_probs(worker: Any, data: DataProto, *, entropy: bool = False) -> dict[str, torch.Tensor]:
    """Per-response-token log-probs (and entropy) of the worker's current weights, [B, R]."""
    td = _padded_view(data)
    tu.assign_non_tensor(td, calculate_entropy=entropy, compute_loss=False)
    output = _resolve(worker.infer_batch(td))
    out = {"log_probs": no_padding_2_padding(tu.get(output, "log_probs"), td).float()}
    if entropy:
        out["entropy"] = no_padding_2_padding(tu.get(output, "entropy"), td).float()
    return out


def update_policy(
    actor: Any,
    data: DataProto,
    loss: RllmPolicyLoss,
    *,
    ref: Any = None,
    mini_batches: int = 1,
    epochs: int = 1,
    shuffle: bool = False,
    seed: int = 0,
) -> dict[str, float]:
    """Old (and reference) log-probs, then ``epochs`` passes of ``mini_batches`` optimizer steps.

    Returns the mean of each metric over micro-batches (loss terms from rllm.algos).
    """
    if loss.needs_old_log_probs:
        data.batch[OLD_LOG_PROBS] = compute_log_probs(actor, data)["log_probs"]
    if loss.algo.kl_coef > 0:
        if ref is None:
            raise ValueError("kl_coef > 0 needs a reference policy worker")
        data.batch[REF_LOG_PROBS] = compute_log_probs(ref, data)["log_probs"]
    td = prepare_update(data, loss, mini_batches=mini_batches, epochs=epochs, shuffle=shuffle, seed=seed)
    output = _resolve(actor.train_mini_batch(td))
    return _flatten_metrics(tu.get(output, "metrics"))


def prepare_update(
    data: DataProto,
    loss: RllmPolicyLoss,
    *,
    mini_batches: int = 1,
    epochs: int = 1,
    shuffle: bool = False,
    seed: int = 0,
) -> TensorDict:
    """The TensorDict ``train_mini_batch`` takes: verl's no-padding layout plus the update's shape."""
    size = len(data)
    if size % mini_batches:
        raise ValueError(f"batch of {size} sequences does not split into {mini_batches} equal mini-batches")
    td = _padded_view(data)
    tu.assign_non_tensor(
        td,
        calculate_entropy=loss.needs_entropy,
        # seq-mean denominators: the sequences of one mini-batch (every TrainSequence the engine
        # builds has sampled tokens, so all of them count, as in rllm.algos).
        global_batch_size=size // mini_batches,
        mini_batch_size=size // mini_batches,
        epochs=epochs,
        seed=seed,
        dataloader_kwargs={"shuffle": shuffle},
        compute_loss=True,
    )
    return td


def _flatten_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        numbers = [float(getattr(v, "value", v)) for v in values]
        if numbers:
            out[name] = sum(numbers) / len(numbers)
    return out
