"""The computing half of the FAKE Fireworks service: one tiny torch model per training run.

Each model is a bigram language model (a [vocab, vocab] logit table, seeded from the run's
seed) trained with torch's AdamW. ``forward`` answers per-token logprobs of the targets;
``forward_backward`` with ``cross_entropy`` accumulates the gradient of
``-sum(weights * logprobs)``, which is what the SDK's ``forward_backward_custom`` sends (the
client-side loss linearised as per-token weights). So gradients, optimizer steps and
checkpoints are real numbers the tests compare with rllm.algos on the same datums.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from fireworks.types.shared import NewLogProbs, RawOutput
from fireworks.types.shared.new_log_probs_content import NewLogProbsContent

from rllm.testing.bigram import BigramModel
from rllm.testing.service import ContractError


@dataclass
class FireworksModel(BigramModel):
    """A training run of one trainer job; ``grads_since_step`` keeps each step's gradient."""

    job_id: str = ""
    run_id: str = ""
    grads_since_step: list[torch.Tensor] = field(default_factory=list)


def _rows(datums: list[dict], vocab: int) -> list[tuple[torch.Tensor, torch.Tensor, dict[str, np.ndarray]]]:
    """(inputs, targets, other loss inputs) per datum, checked against the wire contract."""
    rows = []
    for i, datum in enumerate(datums):
        tokens = [t for chunk in datum["model_input"]["chunks"] for t in chunk.get("tokens", [])]
        inputs = datum["loss_fn_inputs"]
        if "target_tokens" not in inputs:
            raise ContractError(f"datum {i}: loss_fn_inputs has no target_tokens")
        arrays = {}
        for name, tensor in inputs.items():
            dtype = {"int64": np.int64, "float32": np.float32}.get(tensor.get("dtype"))
            if dtype is None:
                raise ContractError(f"datum {i}: {name} has dtype {tensor.get('dtype')!r}")
            values = np.asarray(tensor["data"], dtype=dtype).reshape(-1)
            if len(values) != len(tokens):
                raise ContractError(f"datum {i}: {name} has {len(values)} values for {len(tokens)} inputs")
            arrays[name] = values
        if max(tokens + arrays["target_tokens"].tolist()) >= vocab:
            raise ContractError(f"datum {i}: token ids outside the vocabulary [0, {vocab})")
        targets = torch.from_numpy(arrays.pop("target_tokens"))
        rows.append((torch.tensor(tokens), targets, arrays))
    return rows


def _tensor(values: torch.Tensor) -> dict:
    flat = values.detach().float().reshape(-1)
    return {"data": flat.tolist(), "dtype": "float32", "shape": [int(flat.numel())]}


def forward(model: FireworksModel, datums: list[dict], loss_fn: str, vocab: int) -> dict:
    if loss_fn != "cross_entropy":
        raise ContractError(f"forward supports loss_fn 'cross_entropy' here, got {loss_fn!r}")
    outputs = []
    with torch.no_grad():
        for inputs, targets, _ in _rows(datums, vocab):
            outputs.append({"logprobs": _tensor(model.token_logprobs(inputs, targets))})
    return {"loss_fn_output_type": "ArrayRecord", "loss_fn_outputs": outputs, "metrics": {}}


def forward_backward(model: FireworksModel, datums: list[dict], loss_fn: str, vocab: int) -> dict:
    """cross_entropy: loss = -sum(weights * logprobs); gradients accumulate until optim_step."""
    if loss_fn != "cross_entropy":
        raise ContractError(f"this fake trains loss_fn 'cross_entropy' only, got {loss_fn!r}")
    outputs, total, response_tokens = [], torch.zeros(()), 0.0
    for inputs, targets, arrays in _rows(datums, vocab):
        if set(arrays) != {"weights"}:
            raise ContractError(f"cross_entropy takes target_tokens and weights, got {sorted(arrays)}")
        weights = torch.from_numpy(arrays["weights"])
        logprobs = model.token_logprobs(inputs, targets)
        total = total - (weights * logprobs).sum()
        response_tokens += float((weights != 0).sum())
        outputs.append({"logprobs": _tensor(logprobs), "elementwise_loss": _tensor(-weights * logprobs)})
    total.backward()
    total = total.detach()
    return {
        "loss_fn_output_type": "ArrayRecord",
        "loss_fn_outputs": outputs,
        "metrics": {"loss:sum": float(total), "weighted_tokens:sum": response_tokens},
    }


def optim_step(model: FireworksModel, params: dict) -> dict:
    group = model.optimizer.param_groups[0]
    group["lr"] = params["learning_rate"]
    group["betas"] = (params["beta1"], params["beta2"])
    group["eps"] = params["eps"]
    group["weight_decay"] = params["weight_decay"]
    grad = model.logits.grad if model.logits.grad is not None else torch.zeros_like(model.logits)
    grad_norm = float(grad.norm())
    if params["grad_clip_norm"] > 0:
        torch.nn.utils.clip_grad_norm_([model.logits], params["grad_clip_norm"])
    model.grads_since_step.append(grad.detach().clone())
    model.optimizer.step()
    model.optimizer.zero_grad()
    model.optimizer_steps += 1
    return {"metrics": {"grad_norm": grad_norm, "step": float(model.optimizer_steps)}}


def snapshot(model: FireworksModel, with_optimizer: bool) -> dict:
    state: dict = {"logits": model.logits.detach().clone(), "steps": model.optimizer_steps}
    if with_optimizer:
        state["optimizer"] = {
            k: v.clone() if torch.is_tensor(v) else v
            for k, v in model.optimizer.state_dict()["state"].get(0, {}).items()
        }
    return state


def restore(model: FireworksModel, state: dict, with_optimizer: bool) -> None:
    with torch.no_grad():
        model.logits.copy_(state["logits"])
    model.optimizer_steps = int(state["steps"])
    if with_optimizer and state.get("optimizer"):
        opt_state = model.optimizer.state_dict()
        opt_state["state"] = {
            0: {k: v.clone() if torch.is_tensor(v) else v for k, v in state["optimizer"].items()}
        }
        model.optimizer.load_state_dict(opt_state)


def sample(
    logits: torch.Tensor, prompt: list[int], max_tokens: int, temperature: float, seed: int | None
) -> tuple[list[int], list[float], list[float]]:
    """Sample from the bigram table: ids, the model's raw logprobs, and the logprobs of the
    distribution each token was drawn from (softmax(logits / T))."""
    generator = torch.Generator().manual_seed(int(seed or 0))
    ids, raw, sampled, prev = [], [], [], prompt[-1]
    for _ in range(max_tokens):
        row = logits[prev]
        dist = torch.log_softmax(row / max(temperature, 1e-6), dim=-1)
        token = int(torch.multinomial(dist.exp(), 1, generator=generator))
        ids.append(token)
        raw.append(float(torch.log_softmax(row, dim=-1)[token]))
        sampled.append(float(dist[token]))
        prev = token
    return ids, raw, sampled


def completion(body: dict[str, Any], logits: torch.Tensor, vocab: int) -> dict[str, Any]:
    """The deployment's answer (choices and usage), built with the fireworks-ai inference SDK's own
    types: token ids in ``raw_output`` (``RawOutput``) when asked, ``sampling_logprob`` beside
    ``logprob`` (``NewLogProbsContent``). Chat text is tokenized one
    character per token (ord % vocab); completions take token-id prompts."""
    chat = "messages" in body
    if chat:
        prompt = [ord(c) % vocab for c in "".join(str(m.get("content", "")) for m in body["messages"])]
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise ContractError("this fake deployment takes prompts as token id lists")
    max_tokens, temperature = int(body.get("max_tokens") or 8), float(body.get("temperature", 1.0))
    ids, raw_lps, sampled_lps = sample(logits, prompt, max_tokens, temperature, body.get("seed"))
    text = " ".join(str(t) for t in ids)
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    if body.get("logprobs"):
        entries = zip(ids, raw_lps, sampled_lps, strict=True)
        content = [
            NewLogProbsContent(
                token=str(t),
                bytes=list(str(t).encode()),
                logprob=r,
                sampling_logprob=p,
                text_offset=0,
                token_id=t,
            )
            for t, r, p in entries
        ]
        choice["logprobs"] = NewLogProbs(content=content).model_dump(exclude_none=True)
    if body.get("raw_output"):
        fragments: list[str | int] = list(prompt)
        raw = RawOutput(
            completion=text, prompt_fragments=fragments, prompt_token_ids=prompt, completion_token_ids=ids
        )
        choice["raw_output"] = raw.model_dump(exclude_none=True)
    return {"choices": [choice], "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}}
