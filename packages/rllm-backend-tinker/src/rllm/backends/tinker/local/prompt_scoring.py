"""Scoring given tokens with the sampler's model (vLLM's ``prompt_logprobs``): what a distillation
teacher gives a student's sequences. One teacher-forced forward pass per chunk of prompts, under
the sampler's weights lock (so no weight swap lands mid-pass), no KV cache.

Prompts are right-padded into passes of at most ``max_tokens`` padded tokens (one pass for a
distillation step's short sequences). Right padding under a causal mask leaves every real
position's logits as they are alone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import torch


def prompt_logprobs_batch(
    model: torch.nn.Module,
    device: torch.device,
    lock: threading.Lock,
    prompts: list[list[int]],
    max_tokens: int,
) -> list[list[float | None]]:
    """Per prompt, the model's logprob of each token given the ones before it (None for the
    first)."""
    out: list[list[float | None]] = []
    for chunk, width in padded_chunks(prompts, max_tokens):
        with lock, torch.no_grad():
            ids, logprobs = _prompt_log_softmax(model, device, chunk, width)
            rows = logprobs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).tolist()
        out.extend([None, *(float(x) for x in rows[r][: len(p) - 1])] for r, p in enumerate(chunk))
    return out


def prompt_topk_batch(
    model: torch.nn.Module,
    device: torch.device,
    lock: threading.Lock,
    prompts: list[list[int]],
    k: int,
    max_tokens: int,
) -> list[list[dict[int, tuple[float, int]] | None]]:
    """Per prompt position (None for the first) the ``k`` most likely tokens and the prompt's own
    token, each ``token -> (logprob, rank)`` (rank 1 = most likely)."""
    out: list[list[dict[int, tuple[float, int]] | None]] = []
    for chunk, width in padded_chunks(prompts, max_tokens):
        with lock, torch.no_grad():
            ids, logprobs = _prompt_log_softmax(model, device, chunk, width)
            actual = logprobs.gather(-1, ids[:, 1:].unsqueeze(-1))
            ranks = (logprobs > actual).sum(-1) + 1  # vLLM's rank of the prompt's own token
            top_values, top_ids = logprobs.topk(k, dim=-1)
            rows = (actual.squeeze(-1).tolist(), ranks.tolist(), top_values.tolist(), top_ids.tolist())
        for r, p in enumerate(chunk):
            scored: list[dict[int, tuple[float, int]] | None] = [None]
            for j in range(len(p) - 1):
                entry = {
                    int(t): (float(v), n + 1)
                    for n, (t, v) in enumerate(zip(rows[3][r][j], rows[2][r][j], strict=True))
                }
                entry.setdefault(p[j + 1], (float(rows[0][r][j]), int(rows[1][r][j])))
                scored.append(entry)
            out.append(scored)
    return out


def _prompt_log_softmax(
    model: torch.nn.Module, device: torch.device, prompts: list[list[int]], width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, width] and the log-softmax predicting each next token [B, width-1, V]
    (call under the weights lock and no_grad)."""
    ids = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for row, p in enumerate(prompts):
        ids[row, : len(p)] = torch.tensor(p, dtype=torch.long)
        mask[row, : len(p)] = 1
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float()
    return ids, torch.log_softmax(logits, dim=-1)


def padded_chunks(prompts: list[list[int]], max_tokens: int) -> Iterator[tuple[list[list[int]], int]]:
    """Consecutive prompts grouped so each group's padded size (rows x longest) stays within
    ``max_tokens`` (a longer prompt goes alone); each with its width."""
    start = 0
    while start < len(prompts):
        end, width = start, 0
        while end < len(prompts) and (
            end == start or max(width, len(prompts[end])) * (end - start + 1) <= max_tokens
        ):
            width = max(width, len(prompts[end]))
            end += 1
        yield prompts[start:end], width
        start = end
