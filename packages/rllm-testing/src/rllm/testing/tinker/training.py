"""The computing half of the FAKE Tinker service: one bigram model per training run, the
documented built-in losses, forward_backward and AdamW steps (deterministic, on CPU)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from tinker.proto import tinker_public_pb2 as pb

from rllm.testing.bigram import BigramModel
from rllm.testing.tinker.contract import batched_float32


@dataclass
class RecordedRequest:
    """One request as the fake received it."""

    path: str
    body: Any  # parsed JSON, or a dict summary of a protobuf forward_backward


@dataclass
class FakeFuture:
    """A training call's result, polled by the SDK through retrieve_future."""

    request_id: str
    model_id: str | None
    result: dict[str, Any] | bytes | None = None  # bytes = protobuf ForwardBackwardOutput
    error: str | None = None
    polls: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    created: float = field(default_factory=time.monotonic)


@dataclass
class TinkerModel(BigramModel):
    """A training run as the Tinker service keeps it: requests wait for their seq_id turn."""

    pending: dict[int, tuple[Any, FakeFuture]] = field(default_factory=dict)
    seq_ids: list[int] = field(default_factory=list)
    checkpoint_names: set[tuple[str, str]] = field(default_factory=set)


def loss(name: str, lp: torch.Tensor, inputs: dict[str, torch.Tensor], cfg: dict[str, float]) -> torch.Tensor:
    """A built-in Tinker loss of one datum, summed over its tokens as Tinker documents."""
    if name == "cross_entropy":
        return -(lp * inputs["weights"]).sum()
    adv, old = inputs["advantages"], inputs["logprobs"]
    ratio = torch.exp(lp - old)
    if name == "importance_sampling":
        return -(ratio * adv).sum()
    low, high = cfg["clip_low_threshold"], cfg["clip_high_threshold"]
    if name == "ppo":
        return -torch.minimum(ratio * adv, torch.clamp(ratio, low, high) * adv).sum()
    if name == "cispo":
        return -(torch.clamp(ratio, low, high).detach() * lp * adv).sum()
    # gspo (the fake's reading): one length-normalised ratio per sequence over its trained tokens
    trained = adv != 0
    if not bool(trained.any()):
        return (lp * 0).sum()
    seq_ratio = torch.exp((lp - old)[trained].mean())
    return -torch.minimum(seq_ratio * adv, torch.clamp(seq_ratio, low, high) * adv)[trained].sum()


def run_forward_backward(model: TinkerModel, req: dict[str, Any]) -> bytes:
    """The documented built-in loss summed over every datum; gradients accumulate until
    optim_step. Answers a protobuf ForwardBackwardOutput with each datum's logprobs."""
    total = torch.zeros(())
    logprobs = []
    for datum in req["data"]:
        inputs = {k: torch.tensor(v) for k, v in datum.items() if k != "model_input"}
        lp = model.token_logprobs(torch.tensor(datum["model_input"]), inputs["target_tokens"])
        total = total + loss(req["loss_fn"], lp, inputs, req["loss_fn_config"])
        logprobs.append(lp.detach().numpy())
    if not req["forward_only"]:
        total.backward()  # gradients accumulate until optim_step, as on the service
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    out.metrics["loss:sum"] = float(total.detach())
    record = out.loss_fn_outputs.add()
    record.num_datums = len(logprobs)
    record.fields["logprobs"].CopyFrom(batched_float32(logprobs))
    return out.SerializeToString()


def run_optim_step(model: TinkerModel, params: dict[str, float]) -> dict[str, Any]:
    """One AdamW step with the request's Adam parameters (grad_clip_norm 0: no clipping)."""
    for group in model.optimizer.param_groups:
        group.update(
            lr=params["learning_rate"],
            betas=(params["beta1"], params["beta2"]),
            eps=params["eps"],
            weight_decay=params["weight_decay"],
        )
    clip = params["grad_clip_norm"] if params["grad_clip_norm"] > 0 else float("inf")
    if model.logits.grad is None:
        model.logits.grad = torch.zeros_like(model.logits)
    grad_norm = float(torch.nn.utils.clip_grad_norm_([model.logits], clip))
    model.optimizer.step()
    model.optimizer.zero_grad()
    model.optimizer_steps += 1
    return {"metrics": {"grad_norm": grad_norm}}
