"""On-policy distillation: a teacher scores the student's own tokens; the advantage is the
negative reverse KL per token, ``teacher logprob - student logprob``, optionally plus the task's
(scaled) advantage.

The teacher is any OpenAI-compatible ``/v1/completions`` endpoint that returns vLLM's
``prompt_logprobs`` for a prompt of token ids (vLLM, the tinker backend's local sampler server,
``rllm serve``): the student's exact sequence is sent as the prompt, so the teacher judges the
very tokens the student sampled, never a re-tokenization. An endpoint that answers without
``prompt_logprobs`` is an error naming it, never a zero advantage. The teacher must share the
student's tokenizer (token ids mean nothing across vocabularies): ``check_same_tokenizer`` compares
the two before anything starts.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from rllm.types import ConfigError, TrainSequence
from rllm.types.arrays import FloatArray
from rllm.types.errors import InputError, RLLMError

# Texts whose tokenization must agree between teacher and student (specials included).
TOKENIZER_PROBES = ("Hello, world! 12 + 30 = 42.", "<|im_start|>user\nhi<|im_end|>", "  tabs\tand\nnewlines ")


class TeacherError(RLLMError, ConnectionError):
    """The teacher endpoint failed or is unreachable."""


class TeacherClient:
    """Scores token sequences with a teacher's ``prompt_logprobs`` over OpenAI-compatible HTTP."""

    def __init__(self, base_url: str, model: str = "teacher", timeout_s: float = 120.0) -> None:
        self.url = base_url.rstrip("/") + "/completions"
        self.model = model
        self.timeout_s = timeout_s

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise TeacherError(f"teacher {self.url} answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise TeacherError(f"teacher {self.url} is unreachable: {exc}") from None

    def score_sync(self, input_ids: Sequence[int]) -> list[float]:
        """The teacher's logprob of each token of ``input_ids`` given the ones before (0.0 first)."""
        body = {"model": self.model, "prompt": list(input_ids), "max_tokens": 1, "prompt_logprobs": 0}
        answer = self._post(body)
        choices = answer.get("choices") or [{}]
        scores = choices[0].get("prompt_logprobs")
        if not isinstance(scores, list) or len(scores) != len(input_ids):
            raise InputError(
                f"teacher {self.url} returned no prompt_logprobs for the student's tokens "
                "(it must be an OpenAI-compatible server that supports vLLM's `prompt_logprobs`: "
                "vLLM, rllm serve, the tinker local sampler)"
            )
        out: list[float] = [0.0]
        for position, (token, entry) in enumerate(zip(input_ids[1:], scores[1:], strict=True), start=1):
            value = entry.get(str(token)) if isinstance(entry, dict) else None
            if not isinstance(value, dict) or not isinstance(value.get("logprob"), int | float):
                raise InputError(
                    f"teacher {self.url}: prompt_logprobs[{position}] has no logprob for token {token}"
                )
            out.append(float(value["logprob"]))
        return out

    async def score(self, sequences: Sequence[TrainSequence]) -> list[list[float]]:
        return await asyncio.gather(
            *(asyncio.to_thread(self.score_sync, list(s.input_ids)) for s in sequences)
        )


def distill_advantages(
    sequences: Sequence[TrainSequence], teacher_logprobs: Sequence[Sequence[float]], reward_coef: float = 0.0
) -> dict[str, float]:
    """Write each trained token's advantage: teacher - student (sampler) logprob, plus
    ``reward_coef`` times the advantage already there (the task reward's); returns metrics."""
    total, count = 0.0, 0
    for sequence, teacher in zip(sequences, teacher_logprobs, strict=True):
        if len(teacher) != len(sequence.input_ids):
            raise InputError("teacher logprobs and the sequence differ in length")
        values = []
        for i, trained in enumerate(sequence.loss_mask):
            if not trained:
                values.append(0.0)
                continue
            reverse_kl = sequence.sampler_logprobs[i] - teacher[i]
            total += reverse_kl
            count += 1
            values.append(-reverse_kl + reward_coef * sequence.advantages[i])
        sequence.advantages = FloatArray(values)
    return {"distill/reverse_kl": total / count if count else 0.0, "distill/tokens": float(count)}


def check_same_tokenizer(student: Any, teacher: Any) -> None:
    """Refuse a teacher whose tokenizer differs from the student's (before anything starts)."""
    if student.get_vocab() != teacher.get_vocab():
        raise ConfigError.for_key(
            "distill.teacher", "the teacher's tokenizer differs from the student's vocabulary"
        )
    for text in TOKENIZER_PROBES:
        if student.encode(text, add_special_tokens=False) != teacher.encode(text, add_special_tokens=False):
            raise ConfigError.for_key(
                "distill.teacher", f"the teacher tokenizes {text!r} differently from the student"
            )


__all__ = ["TOKENIZER_PROBES", "TeacherClient", "TeacherError", "check_same_tokenizer", "distill_advantages"]
