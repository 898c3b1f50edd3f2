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
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import no_padding_2_padding

# Per-token fields of the batch the loss reads, besides the model's own log-probs.
OLD_LOG_PROBS = "old_log_probs"
REF_LOG_PROBS = "ref_log_prob"
ROLLOUT_LOG_PROBS = "rollout_log_probs"


class RllmPolicyLoss:
    """A picklable verl loss function (it travels to Ray workers) bound to one AlgorithmConfig."""

    def __init__(self, algo: AlgorithmConfig) -> None:
        self.algo = algo.validate()

    @property
    def needs_entropy(self) -> bool:
        return self.algo.entropy_coef != 0

    @property
    def needs_old_log_probs(self) -> bool:
        return self.algo.loss != "cross_entropy" or self.algo.tis != "none"

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
            config = msgspec.structs.replace(config, loss_scale_factor=float(cast(float, width)))
        loss, metrics = compute_policy_loss(
            log_probs,
            fields.get(OLD_LOG_PROBS) if self.needs_old_log_probs else None,
            fields["advantages"] if config.loss != "cross_entropy" else None,
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
