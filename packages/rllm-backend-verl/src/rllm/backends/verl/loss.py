"""rllm.algos' policy loss as the loss function of verl's training engine.

verl's workers take their loss as a callable (``TrainingWorker.set_loss_fn`` /
``ActorRolloutRefWorker.set_loss_fn``) that the engine calls per micro-batch with the model's
output and the micro-batch. Ours hands everything to ``rllm.algos.losses.compute_policy_loss``,
so the policy term, TIS, KL and entropy are the same code as on every other backend.

Denominators: verl normalises each micro-batch by the whole mini-batch (``batch_num_tokens``,
``global_batch_size``, summed over data-parallel ranks) and the ranks' gradients are averaged,
so each rank's share is the global count divided by ``dp_size``.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec
import torch
from tensordict import TensorDict

from rllm.algos.config import AlgorithmConfig
from rllm.algos.losses import compute_policy_loss
from rllm.algos.registry import get_loss
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import no_padding_2_padding

# Per-token fields of the batch the loss reads, besides the model's own log-probs.
OLD_LOG_PROBS = "old_log_probs"
REF_LOG_PROBS = "ref_log_prob"
ROLLOUT_LOG_PROBS = "rollout_log_probs"


class RllmPolicyLoss:
    """A picklable verl loss function (it travels to Ray workers) bound to one AlgorithmConfig."""

    def __init__(self, algo: AlgorithmConfig) -> None:
        self.algo = algo  # validated when it was built
        self.supervised = get_loss(algo.loss).supervised
        # seq-mean-token-sum-norm without a loss_scale_factor: one config per token width, built
        # once (building a config validates it, which must not happen per micro-batch)
        self._scaled: dict[float, AlgorithmConfig] = {}

    @property
    def needs_entropy(self) -> bool:
        return self.algo.entropy_coef != 0

    @property
    def needs_old_log_probs(self) -> bool:
        return not self.supervised or self.algo.tis != "none"

    def __call__(
        self, model_output: dict[str, Any], data: TensorDict, dp_group: Any = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        log_probs = no_padding_2_padding(model_output["log_probs"], data)
        entropy = model_output.get("entropy")
        if entropy is not None:
            entropy = no_padding_2_padding(entropy, data)
        present = [
            k
            for k in ("response_mask", "advantages", OLD_LOG_PROBS, REF_LOG_PROBS, ROLLOUT_LOG_PROBS)
            if k in data
        ]
        fields = data.select(*present).to_padded_tensor()
        dp_size = float(data["dp_size"])
        num_sequences = tu.get_non_tensor_data(data=data, key="global_batch_size", default=None)
        config = self.algo
        if config.aggregation == "seq-mean-token-sum-norm" and config.loss_scale_factor is None:
            # The batch's token width, as rllm.algos uses on one unsplit batch; a micro-batch alone
            # would be narrower and scale its share differently.
            width = tu.get_non_tensor_data(data=data, key="max_response_len", default=log_probs.shape[-1])
            scale = float(cast(float, width))
            if scale not in self._scaled:
                self._scaled[scale] = msgspec.structs.replace(config, loss_scale_factor=scale)
            config = self._scaled[scale]
        loss, metrics = compute_policy_loss(
            log_probs,
            fields.get(OLD_LOG_PROBS) if self.needs_old_log_probs else None,
            fields["advantages"] if not self.supervised else None,
            fields["response_mask"].to(torch.bool),
            config,
            sampler_logprobs=fields.get(ROLLOUT_LOG_PROBS) if config.tis != "none" else None,
            ref_logprobs=fields.get(REF_LOG_PROBS) if config.kl_coef > 0 else None,
            entropy=entropy if self.needs_entropy else None,
            # verl stores these counts as non-tensor data; they are plain numbers.
            num_tokens=float(cast(float, data["batch_num_tokens"])) / dp_size,
            num_sequences=None if num_sequences is None else float(cast(float, num_sequences)) / dp_size,
        )
        return loss, {f"actor/{name}": value for name, value in metrics.items()}
