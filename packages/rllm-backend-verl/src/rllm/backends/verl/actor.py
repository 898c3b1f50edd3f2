"""One rLLM train step on verl's training workers: log-probs, reference log-probs, update.

The same calls drive an in-process ``TrainingWorker`` (tests, CPU) and a Ray worker group
(``RayWorkerGroup`` exposes the worker's methods and returns futures); ``_resolve`` waits for
either. The batch goes through verl's own padding → no-padding conversion, as verl's trainer does.

verl splits a batch evenly over data-parallel ranks and then into micro-batches of a fixed size,
and asserts that the sizes divide. The Trainer's batches have any size (filters drop groups,
multi-turn trajectories give several rows), so rows are padded up to the multiple verl needs
(``Batching``) with copies of a real row that train nothing (response mask 0). Padding rows add
no token to a loss and no sequence to its denominators, which come from the real rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from rllm.backends.verl.loss import OLD_LOG_PROBS, REF_LOG_PROBS, RllmPolicyLoss
from rllm.types.errors import InputError
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding


@dataclass(frozen=True)
class Batching:
    """The row multiples verl's workers need: data-parallel ranks × micro-batch size (token-budget
    micro-batches, ``dynamic``, only need the rank split)."""

    dp_size: int = 1
    micro_batch_size: int = 1
    log_prob_micro_batch_size: int = 1
    dynamic: bool = False

    @property
    def train_multiple(self) -> int:
        return self.dp_size * (1 if self.dynamic else self.micro_batch_size)

    @property
    def infer_multiple(self) -> int:
        return self.dp_size * (1 if self.dynamic else self.log_prob_micro_batch_size)


def _resolve(result: Any) -> TensorDict:
    return result if isinstance(result, TensorDict) else result.get()


def _padded_view(data: DataProto) -> TensorDict:
    td = left_right_2_no_padding(data.to_tensordict())
    # Log-probs of the unscaled logits: rllm.algos' ratios and TIS compare against the policy
    # itself, as on every backend, not against a temperature-scaled sampling distribution.
    tu.assign_non_tensor(td, temperature=1.0)
    return td


def _with_rows(data: DataProto, layout: list[int | None]) -> DataProto:
    """The rows of ``data`` in ``layout`` order; None is a padding row (row 0, nothing trained)."""
    if layout == list(range(len(data))):
        return data
    out = data.select_idxs(torch.tensor([0 if row is None else row for row in layout]))
    padding = torch.tensor([row is None for row in layout])
    for key in ("response_mask", "advantages"):
        out.batch[key][padding] = 0
    return out


def _round_up(count: int, multiple: int) -> int:
    return math.ceil(count / multiple) * multiple


def compute_log_probs(
    worker: Any, data: DataProto, *, entropy: bool = False, batching: Batching | None = None
) -> dict[str, torch.Tensor]:
    """Per-response-token log-probs (and entropy) of the worker's current weights, [B, R]."""
    size = len(data)
    multiple = (batching or Batching()).infer_multiple
    padded = _with_rows(data, [*range(size), *[None] * (_round_up(size, multiple) - size)])
    td = _padded_view(padded)
    tu.assign_non_tensor(td, calculate_entropy=entropy, compute_loss=False)
    output = _resolve(worker.infer_batch(td))
    out = {"log_probs": no_padding_2_padding(tu.get(output, "log_probs"), td).float()[:size]}
    if entropy:
        out["entropy"] = no_padding_2_padding(tu.get(output, "entropy"), td).float()[:size]
    return out


def held_out_loss(worker: Any, data: DataProto, *, batching: Batching | None = None) -> dict[str, float]:
    """Mean negative log-likelihood of the response-mask tokens under the worker's current weights
    (a forward-only pass, no update): ``rllm sft``'s held-out loss, as the local backend's
    ``eval_loss`` computes it."""
    mask = data.batch["response_mask"].float()
    count = float(mask.sum())
    if count == 0:
        raise InputError("eval_loss got a batch without a trained token (every loss_mask is 0)")
    log_probs = compute_log_probs(worker, data, batching=batching)["log_probs"]
    return {"loss": float(-(log_probs * mask).sum()) / count, "num_tokens": count}


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
    batching: Batching | None = None,
    record_log_probs: bool = True,
) -> dict[str, float]:
    """Old (and reference) log-probs, then ``epochs`` passes of ``mini_batches`` optimizer steps.

    The old log-probs (the weights the sampler sampled with) stay in ``data.batch["old_log_probs"]``
    for the caller; ``record_log_probs`` computes them even for a loss that needs none (a
    supervised loss without TIS), so the train/sampler mismatch is measured on every step.
    Returns the mean of each metric over micro-batches (loss terms from rllm.algos).
    """
    if loss.needs_old_log_probs or record_log_probs:
        data.batch[OLD_LOG_PROBS] = compute_log_probs(actor, data, batching=batching)["log_probs"]
    if loss.algo.kl_coef > 0:
        if ref is None:
            raise InputError("kl_coef > 0 needs a reference policy worker")
        data.batch[REF_LOG_PROBS] = compute_log_probs(ref, data, batching=batching)["log_probs"]
    td = prepare_update(
        data, loss, mini_batches=mini_batches, epochs=epochs, shuffle=shuffle, seed=seed, batching=batching
    )
    output = _resolve(actor.train_mini_batch(td))
    return _flatten_metrics(tu.get(output, "metrics"))


def mini_batch_layout(size: int, mini_batches: int, multiple: int) -> list[int | None]:
    """Row order for ``mini_batches`` consecutive mini-batches of equal, ``multiple``-aligned
    length: the real rows split as evenly as they go, each part padded (None) to that length."""
    if size < 1 or mini_batches < 1 or multiple < 1:
        raise InputError(
            f"cannot lay out {size} rows in {mini_batches} mini-batches of multiples of {multiple}"
        )
    parts = min(mini_batches, size)  # a mini-batch of padding alone would be an empty optimizer step
    length = _round_up(math.ceil(size / parts), multiple)
    layout: list[int | None] = []
    start = 0
    for part in range(parts):
        count = size // parts + (1 if part < size % parts else 0)
        layout += [*range(start, start + count), *[None] * (length - count)]
        start += count
    return layout


def prepare_update(
    data: DataProto,
    loss: RllmPolicyLoss,
    *,
    mini_batches: int = 1,
    epochs: int = 1,
    shuffle: bool = False,
    seed: int = 0,
    batching: Batching | None = None,
) -> TensorDict:
    """The TensorDict ``train_mini_batch`` takes: verl's no-padding layout plus the update's shape."""
    size = len(data)
    layout = mini_batch_layout(size, mini_batches, (batching or Batching()).train_multiple)
    parts = min(mini_batches, size)
    td = _padded_view(_with_rows(data, layout))
    tu.assign_non_tensor(
        td,
        calculate_entropy=loss.needs_entropy,
        # seq-mean denominators: the real sequences of one mini-batch (every TrainSequence the
        # engine builds has sampled tokens, so all of them count, as in rllm.algos).
        global_batch_size=size / parts,
        mini_batch_size=len(layout) // parts,
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
