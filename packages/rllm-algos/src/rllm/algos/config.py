"""AlgorithmConfig: every RL algorithm option, validated once, honoured or refused by backends."""

from __future__ import annotations

from typing import Literal

import msgspec

Aggregation = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


class AlgorithmConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Advantage estimation, filtering and policy-loss options.

    (Owned by rllm-algos; the Trainer validates it and every backend either honours each option
    or refuses it in ``Backend.validate``.)
    """

    # advantages
    estimator: str = "grpo"  # grpo | drgrpo | rloo | reinforce | reinforce_pp_baseline | batch_norm | turn
    estimator_by_role: dict[str, str] = msgspec.field(default_factory=dict)
    step_credit: Literal["broadcast", "turn"] = "broadcast"
    gamma: float = 1.0
    # filters
    filter_zero_variance: bool = True
    min_group_size: int = 1
    mask_terminations: list[str] = msgspec.field(default_factory=list)
    # policy loss
    loss: str = "ppo_clip"  # ppo_clip | dual_clip | gspo | cispo | importance_sampling | cross_entropy
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip_c: float = 3.0
    aggregation: Aggregation = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    tis: Literal["none", "token", "sequence"] = "none"
    tis_cap: float = 2.0
