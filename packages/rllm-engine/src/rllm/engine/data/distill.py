"""On-policy distillation: a teacher scores the student's own tokens; the advantage is the
negative reverse KL per token, ``teacher logprob - student logprob``, less a per-group baseline
(``baseline``), optionally plus the task's (scaled) advantage.

Peers (checked 2026-12, facts only): tinker-cookbook's ``distillation/train_on_policy.py``
(``incorporate_kl_penalty``) adds ``-kl_penalty_coef * (student - teacher logprob)`` per token to
the task reward's advantage, with an optional discounted future sum (default off) and no
baseline; TRL's GKD trainer takes no advantage at all, it backpropagates a generalized
Jensen-Shannon divergence over the full teacher and student distributions. rLLM's default adds a
leave-one-out baseline per group and completion position (see ``group_baseline``): the sampled
estimate of the per-token reverse KL is unchanged in expectation (the baseline never depends on
the token it is subtracted from) and far less noisy from a student far from the teacher, where
nearly every sampled token carries a large negative raw advantage.

The teacher is any OpenAI-compatible ``/v1/completions`` endpoint that returns vLLM's
``prompt_logprobs`` for a prompt of token ids (vLLM, the tinker backend's local sampler server,
``rllm serve``): the student's exact sequence is sent as the prompt, so the teacher judges the
very tokens the student sampled, never a re-tokenization. An endpoint that answers without
``prompt_logprobs`` is an error naming it, never a zero advantage. The teacher must share the
student's tokenizer (token ids mean nothing across vocabularies): ``check_same_tokenizer`` compares
the two before anything starts.

``loss = "topk"`` asks the teacher for its ``topk`` most likely tokens at every position as well
(vLLM's ``prompt_logprobs: k``, parsed strictly by ``rllm.engine.data.distill_topk``) and puts them on
each sequence's ``teacher_topk``: the backend then trains the exact KL over them (plus a tail
bucket) at every trained position (``rllm.algos.losses.distill``), where the sampled estimate
carries one token's worth of the teacher per position.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from rllm.engine.data.distill_topk import parse_prompt_logprobs
from rllm.types import ConfigError, TrainSequence
from rllm.types.arrays import FloatArray
from rllm.types.config_file import base_url_problem
from rllm.types.errors import InputError, RLLMError
from rllm.types.sequence import TeacherTopK

if TYPE_CHECKING:
    from rllm.algos.config import AlgorithmConfig

# Texts whose tokenization must agree between teacher and student (specials included).
TOKENIZER_PROBES = ("Hello, world! 12 + 30 = 42.", "<|im_start|>user\nhi<|im_end|>", "  tabs\tand\nnewlines ")
# Most prompt tokens sent to the teacher in one request: a step's sequences go in as few requests
# as this allows (one, for most steps), each a batch the server scores in one pass.
REQUEST_TOKENS = 32768


class DistillSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """TrainerConfig's ``distill``: on-policy distillation from ``teacher`` (a ``.../v1`` URL)."""

    teacher: str
    teacher_model: str = "teacher"
    reward_coef: float = 0.0  # how much of the task reward's advantage is added to the teacher's
    # "group": subtract a leave-one-out mean of the group's other rollouts at the same completion
    # position (see group_baseline); "none": the raw per-token negative reverse KL (tinker-cookbook's).
    baseline: Literal["group", "none"] = "group"
    timeout_s: float = 120.0
    # "sampled": the policy loss on the per-token advantages above (a one-sample reverse-KL
    # estimate; every backend). "topk": a dense KL over the teacher's ``topk`` most likely tokens
    # at each position (vLLM's ``prompt_logprobs: topk``), ``kl`` = forward KL(teacher || student)
    # or reverse; trained with loss ``topk_{kl}_kl`` (rllm.algos.losses.distill; the local backend).
    loss: Literal["sampled", "topk"] = "sampled"
    topk: int = 8
    kl: Literal["forward", "reverse"] = "forward"

    def __post_init__(self) -> None:
        if (problem := base_url_problem(self.teacher)) is not None:
            raise ConfigError.for_key("distill.teacher", problem)
        if self.topk < 1:
            raise ConfigError.for_key("distill.topk", f"distill.topk must be >= 1, got {self.topk}")


# AlgorithmConfig's default loss: the one `distill.loss = "topk"` may replace (any other is a
# user's explicit choice, and a conflict).
DEFAULT_LOSS = "ppo_clip"


def check_distill_loss(section: DistillSection | None, algo: AlgorithmConfig) -> None:
    """Pick the loss ``section.loss`` asks for: ``"topk"`` trains with ``topk_{kl}_kl`` (set on
    ``algo`` when its loss is still the default), ``"sampled"`` with the policy loss on the
    teacher's advantages. ConfigError naming the key for a combination that cannot work."""
    from rllm.algos.registry import get_loss

    topk_loss = get_loss(algo.loss).teacher_topk
    if section is None or section.loss == "sampled":
        if topk_loss:
            raise ConfigError.for_key(
                "algorithm.loss",
                f"{algo.loss!r} trains toward a distillation teacher's top-k: run `rllm distill` with "
                "distill.loss=topk",
            )
        return
    if section.reward_coef != 0:
        raise ConfigError.for_key(
            "distill.reward_coef",
            "the top-k loss takes no advantages, so the task reward cannot be mixed in; set "
            "distill.reward_coef=0 or distill.loss=sampled",
        )
    wanted = f"topk_{section.kl}_kl"
    if algo.loss not in (wanted, DEFAULT_LOSS):
        raise ConfigError.for_key(
            "algorithm.loss",
            f"distill.loss=topk trains with loss {wanted!r} (distill.kl={section.kl}), not {algo.loss!r}; "
            "leave algorithm.loss unset",
        )
    algo.loss = wanted
    algo.validate()


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
        return self.score_batch_sync([input_ids])[0]

    def score_batch_sync(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        """``score_sync`` for many sequences in one request (a list of token-id prompts, which
        vLLM and the local sampler score together)."""
        return [own for own, _ in self.score_topk_sync(batch, 0)]

    def score_topk_sync(
        self, batch: Sequence[Sequence[int]], k: int
    ) -> list[tuple[list[float], TeacherTopK | None]]:
        """Each sequence's teacher logprobs and, with ``k`` > 0, the teacher's top-k per position
        (vLLM's ``prompt_logprobs: k``), in one request; parsed strictly (distill_topk)."""
        prompts = [list(ids) for ids in batch]
        body = {"model": self.model, "prompt": prompts, "max_tokens": 1, "prompt_logprobs": k}
        choices = self._post(body).get("choices") or []
        by_index = {c.get("index"): c for c in choices if isinstance(c, dict)}
        out = []
        for i, ids in enumerate(prompts):
            scores = by_index.get(i, {}).get("prompt_logprobs")
            if not isinstance(scores, list):
                raise InputError(
                    f"teacher {self.url} returned no prompt_logprobs for the student's tokens "
                    "(it must be an OpenAI-compatible server that supports vLLM's `prompt_logprobs`: "
                    "vLLM, rllm serve, the tinker local sampler)"
                )
            out.append(
                parse_prompt_logprobs(scores, ids, k, f"teacher {self.url}: choices[{i}].prompt_logprobs")
            )
        return out

    async def score(self, sequences: Sequence[TrainSequence]) -> list[list[float]]:
        """Every sequence's teacher logprobs (``score_topk`` without the top-k)."""
        return [own for own, _ in await self.score_topk(sequences, 0)]

    async def score_topk(
        self, sequences: Sequence[TrainSequence], k: int
    ) -> list[tuple[list[float], TeacherTopK | None]]:
        """Every sequence's teacher logprobs (and top-k, ``k`` > 0), in as few requests as
        ``REQUEST_TOKENS`` allows (they run concurrently): one HTTP round trip and one batched
        forward pass per request, where one request per sequence cost a step 3.2 s on the
        benchmark's 128 short sequences."""
        chunks: list[list[list[int]]] = [[]]
        tokens = 0
        for s in sequences:
            ids = [int(t) for t in s.input_ids]
            if chunks[-1] and tokens + len(ids) > REQUEST_TOKENS:
                chunks.append([])
                tokens = 0
            chunks[-1].append(ids)
            tokens += len(ids)
        scored = await asyncio.gather(*(asyncio.to_thread(self.score_topk_sync, c, k) for c in chunks if c))
        return [row for chunk in scored for row in chunk]

    def check_tokenizer(self, student: Any) -> None:
        """Refuse a teacher whose server tokenizes the probe texts differently from ``student``
        (it must return ``prompt_token_ids`` with ``return_token_ids``, as vLLM and rllm do)."""
        for text in [*TOKENIZER_PROBES, vocabulary_probe(student)]:
            body = {"model": self.model, "prompt": text, "max_tokens": 1, "return_token_ids": True}
            answer = self._post(body)
            theirs = answer.get("prompt_token_ids") or (answer.get("choices") or [{}])[0].get(
                "prompt_token_ids"
            )
            if not isinstance(theirs, list):
                raise ConfigError.for_key(
                    "distill.teacher",
                    f"teacher {self.url} returns no prompt_token_ids, so its tokenizer cannot be checked",
                )
            if theirs != list(student.encode(text, add_special_tokens=False)):
                raise ConfigError.for_key(
                    "distill.teacher",
                    f"teacher {self.url} tokenizes {text!r} differently from the student: "
                    "distillation needs one tokenizer",
                )


def vocabulary_probe(tokenizer: Any, samples: int = 64) -> str:
    """A text of tokens spread over the student's whole vocabulary, its newest ids included (the
    ones a fine-tuned or extended tokenizer adds): another vocabulary tokenizes it differently."""
    size = len(tokenizer)
    ids = sorted({*range(0, size, max(1, size // samples)), *range(max(0, size - samples), size)})
    return str(tokenizer.decode(ids, skip_special_tokens=True))


class Distiller:
    """The Trainer's distillation hook: scores each step's sequences and rewrites their advantages."""

    def __init__(self, section: DistillSection, student_tokenizer: Any) -> None:
        self.section = section
        self.teacher = TeacherClient(section.teacher, section.teacher_model, section.timeout_s)
        self.teacher.check_tokenizer(student_tokenizer)

    async def apply(self, sequences: Sequence[TrainSequence]) -> dict[str, float]:
        """Score the step's sequences with the teacher and write what the loss trains on: the
        advantages (always: with ``loss = "topk"`` they are only reported) and, for ``"topk"``,
        each sequence's ``teacher_topk``."""
        started = time.perf_counter()
        k = self.section.topk if self.section.loss == "topk" else 0
        scored = await self.teacher.score_topk(sequences, k)
        for sequence, (_, topk) in zip(sequences, scored, strict=True):
            sequence.teacher_topk = topk
        metrics = distill_advantages(
            sequences,
            [own for own, _ in scored],
            self.section.reward_coef,
            baseline=self.section.baseline == "group",
        )
        return {**metrics, "time/teacher_s": time.perf_counter() - started}


def distill_advantages(
    sequences: Sequence[TrainSequence],
    teacher_logprobs: Sequence[Sequence[float]],
    reward_coef: float = 0.0,
    *,
    baseline: bool = False,
) -> dict[str, float]:
    """Write each trained token's advantage: teacher - student (sampler) logprob, less the
    group's baseline when ``baseline`` (``group_baseline``), plus ``reward_coef`` times the
    advantage already there (the task reward's); returns metrics.

    The metrics describe the advantages written here, the ones trained: the step's
    ``advantage/*`` metrics are the task reward's, computed before this rewrite (with
    ``reward_coef = 0`` none of them reaches the loss). ``distill/reverse_kl`` is the raw
    estimate, before any baseline."""
    total, count = 0.0, 0
    raw: list[list[float]] = []
    for sequence, teacher in zip(sequences, teacher_logprobs, strict=True):
        if len(teacher) != len(sequence.input_ids):
            raise InputError("teacher logprobs and the sequence differ in length")
        row = []
        for i, trained in enumerate(sequence.loss_mask):
            if trained:
                row.append(teacher[i] - sequence.sampler_logprobs[i])
                total -= row[-1]
                count += 1
        raw.append(row)
    shifts = group_baseline(sequences, raw) if baseline else [[0.0] * len(r) for r in raw]
    written: list[float] = []
    for sequence, row, shift in zip(sequences, raw, shifts, strict=True):
        values = [0.0] * len(sequence.loss_mask)
        k = 0
        for i, trained in enumerate(sequence.loss_mask):
            if trained:
                values[i] = row[k] - shift[k] + reward_coef * sequence.advantages[i]
                written.append(values[i])
                k += 1
        sequence.advantages = FloatArray(values)
    return {
        "distill/reverse_kl": total / count if count else 0.0,
        "distill/tokens": float(count),
        "distill/advantage_mean": sum(written) / count if count else 0.0,
        "distill/advantage_min": min(written, default=0.0),
        "distill/advantage_max": max(written, default=0.0),
    }


def group_baseline(sequences: Sequence[TrainSequence], raw: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per sequence and trained token k (its k-th completion token): the mean raw advantage at
    position k of the OTHER sequences of its group (same ``group_id``: the rollouts of one task),
    0 where no other sequence reaches position k.

    Leave-one-out, so a token's baseline never depends on the token itself and the estimate
    stays unbiased; position-wise, because the rollouts share the prompt, so position 0 is the
    same state for all of them (later positions are only approximately so) and the expected
    reverse KL differs a lot by position (an end-of-answer token costs little, a content word
    a lot). A constant added to the teacher's logprobs across a group cancels; a teacher equal
    to the student still gives exactly 0."""
    sums: dict[tuple[str, int], tuple[float, int]] = {}
    for sequence, row in zip(sequences, raw, strict=True):
        for k, value in enumerate(row):
            total, n = sums.get((sequence.group_id, k), (0.0, 0))
            sums[(sequence.group_id, k)] = (total + value, n + 1)
    out = []
    for sequence, row in zip(sequences, raw, strict=True):
        shift = []
        for k, value in enumerate(row):
            total, n = sums[(sequence.group_id, k)]
            shift.append((total - value) / (n - 1) if n > 1 else 0.0)
        out.append(shift)
    return out


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


__all__ = [
    "TOKENIZER_PROBES",
    "DistillSection",
    "Distiller",
    "TeacherClient",
    "TeacherError",
    "check_same_tokenizer",
    "distill_advantages",
    "group_baseline",
]
