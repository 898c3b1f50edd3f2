"""Rubric judges: a pointwise judge (each episode alone) and a group judge (RULER-style: every
trajectory of a group in one prompt, scored relative to each other).

Both ask a :class:`~rllm.sdk.rewards.judge_client.JudgeEndpoint` (concurrency limit, cache,
token and cost accounting) and parse strictly (:mod:`rllm.sdk.rewards.judge_parse`). An episode
whose judge failed — an unparseable reply, an endpoint down — is never scored 0 as if the agent
had earned it: it is marked ``infra_error`` with the judge's reply (``episode.error``,
``metadata["eval"]["judge_error"]``), which the trainer masks under
``algorithm.mask_terminations = ["infra_error"]`` and counts as ``termination/infra_error``.
Each episode reports its share of the judge's work as ``judge/*`` signals (calls, cache hits,
prompt and completion tokens, cost), which the trainer logs as ``signal/judge/*`` means.
"""

from __future__ import annotations

from collections.abc import Sequence

from rllm.sdk.answer import final_answer
from rllm.sdk.rewards.judge_client import CallUsage, JudgeEndpoint, JudgeReplyError
from rllm.sdk.rewards.judge_parse import parse_group_scores, parse_rubric_score
from rllm.types import Episode, ErrorInfo, EvalOutput, Signal, Task, TerminationReason
from rllm.types.errors import InputError

POINTWISE_PROMPT = """Grade a reply against a rubric.

Rubric:
{rubric}

Task:
{instruction}

Reference answer: {reference}

Reply to grade:
{answer}

Give a short reason, then the grade on a line of its own: SCORE: s, where s is a whole number
from 0 (fails the rubric) to {scale} (meets it fully)."""

GROUP_PROMPT = """Compare {n} replies to the same task against a rubric and score each relative to
the others: a better reply gets a higher score.

Rubric:
{rubric}

Task:
{instruction}

Reference answer: {reference}

{replies}

For each reply give a short reason, then its grade on a line of its own: SCORE i: s, where i is
the reply's number (1 to {n}) and s a whole number from 0 to {scale}. Score every reply exactly once."""

REPLY_BLOCK = "Reply {i}:\n{text}\n"


def transcript(episode: Episode, role: str | None = None, max_chars: int = 4000) -> str:
    """What a judge reads of one episode: its final answer, after the conversation that led to it
    when the answer came from a multi-turn exchange (the last ``max_chars`` characters)."""
    answer = final_answer(episode, role)
    trajectories = [t for t in episode.trajectories if role is None or t.role == role]
    steps = trajectories[0].steps if trajectories else []
    if len(steps) <= 1:
        return answer[-max_chars:]
    lines = [f"{m.role}: {m.text}" for m in steps[-1].input if m.role != "system"]
    lines.append(f"assistant: {answer}")
    return "\n".join(lines)[-max_chars:]


def _reference(task: Task) -> str:
    return "(none given)" if task.ground_truth is None else str(task.ground_truth)


def _instruction(task: Task) -> str:
    return task.instruction if isinstance(task.instruction, str) else str(task.instruction)


def mark_judge_failure(episode: Episode, exc: Exception, usage: CallUsage | None = None) -> EvalOutput:
    """The verdict on an episode whose judge failed: ``infra_error`` with the reason and the
    judge's reply, recorded on the episode (the engine masks or counts it; nothing is scored)."""
    episode.termination_reason = TerminationReason.INFRA_ERROR
    episode.error = ErrorInfo(type=type(exc).__name__, message=str(exc))
    details: dict[str, object] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, JudgeReplyError):
        details["reply"] = exc.reply
    signals = [Signal(name="judge/failed", value=1.0), *(usage or CallUsage()).signals()]
    return EvalOutput(reward=0.0, is_correct=None, signals=signals, metadata={"judge_error": details})


def _check_judge(kind: str, scale: int, prompt_template: str, placeholder: str) -> None:
    """InputError unless ``scale`` is a scale and the template has the place for what is judged."""
    if scale < 1:
        raise InputError(f"a {kind}'s scale must be >= 1, got {scale}")
    if placeholder not in prompt_template:
        raise InputError(f"a {kind}'s prompt_template must contain {placeholder}")


class RubricJudge:
    """A pointwise rubric judge: an evaluator that scores each episode alone, reward ``s / scale``.

    ``correct_at`` (a reward) sets ``is_correct``; None leaves it unset (partial credit).
    ``prompt_template`` may use ``{rubric}``, ``{instruction}``, ``{reference}``, ``{answer}`` and
    ``{scale}`` and must keep the reply format of :data:`POINTWISE_PROMPT`."""

    def __init__(
        self,
        endpoint: JudgeEndpoint,
        rubric: str,
        *,
        scale: int = 10,
        prompt_template: str = POINTWISE_PROMPT,
        answer_role: str | None = None,
        correct_at: float | None = None,
    ) -> None:
        _check_judge("rubric judge", scale, prompt_template, "{answer}")
        self.endpoint, self.rubric, self.scale = endpoint, rubric, scale
        self.prompt_template, self.answer_role, self.correct_at = prompt_template, answer_role, correct_at

    def messages(self, task: Task, episode: Episode) -> list[dict[str, str]]:
        prompt = self.prompt_template.format(
            rubric=self.rubric,
            instruction=_instruction(task),
            reference=_reference(task),
            answer=transcript(episode, self.answer_role),
            scale=self.scale,
        )
        return [{"role": "user", "content": prompt}]

    async def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        scale = self.scale
        try:
            answer = await self.endpoint.ask(
                self.messages(task, episode), lambda reply: parse_rubric_score(reply, scale)
            )
        except Exception as exc:
            return mark_judge_failure(episode, exc)
        reward = answer.value / scale
        correct = None if self.correct_at is None else reward >= self.correct_at
        signals = [Signal(name="judge/score", value=reward), *answer.usage.signals()]
        return EvalOutput(
            reward=reward, is_correct=correct, signals=signals, metadata={"judge_reply": answer.reply}
        )


class GroupJudge:
    """A group judge (RULER-style): every episode of one task's group in one prompt, each scored
    ``0..scale`` relative to the others; reward ``s / scale``.

    :meth:`score_group` is the whole judge (one call per group). To use it as the engine's
    per-episode evaluator, wrap it with :class:`rllm.sdk.rewards.GroupGather`, which holds each
    episode until its group is complete."""

    def __init__(
        self,
        endpoint: JudgeEndpoint,
        rubric: str,
        *,
        scale: int = 10,
        prompt_template: str = GROUP_PROMPT,
        answer_role: str | None = None,
        correct_at: float | None = None,
        max_chars_per_reply: int = 2000,
    ) -> None:
        _check_judge("group judge", scale, prompt_template, "{replies}")
        self.endpoint, self.rubric, self.scale = endpoint, rubric, scale
        self.prompt_template, self.answer_role, self.correct_at = prompt_template, answer_role, correct_at
        self.max_chars_per_reply = max_chars_per_reply

    def messages(self, task: Task, episodes: Sequence[Episode]) -> list[dict[str, str]]:
        replies = "\n".join(
            REPLY_BLOCK.format(i=i, text=transcript(e, self.answer_role, self.max_chars_per_reply))
            for i, e in enumerate(episodes, start=1)
        )
        prompt = self.prompt_template.format(
            rubric=self.rubric,
            instruction=_instruction(task),
            reference=_reference(task),
            replies=replies,
            n=len(episodes),
            scale=self.scale,
        )
        return [{"role": "user", "content": prompt}]

    async def score_group(self, task: Task, episodes: Sequence[Episode]) -> list[EvalOutput]:
        """One verdict per episode, in order; every one of them an infra failure if the judge failed."""
        if not episodes:
            return []
        n, scale = len(episodes), self.scale
        try:
            answer = await self.endpoint.ask(
                self.messages(task, episodes), lambda reply: parse_group_scores(reply, n, scale)
            )
        except Exception as exc:
            return [mark_judge_failure(e, exc) for e in episodes]
        share = answer.usage.share(n)
        out = []
        for score in answer.value:
            reward = score / scale
            correct = None if self.correct_at is None else reward >= self.correct_at
            signals = [
                Signal(name="judge/score", value=reward),
                Signal(name="judge/group_size", value=float(n)),
                *share.signals(),
            ]
            out.append(
                EvalOutput(
                    reward=reward, is_correct=correct, signals=signals, metadata={"judge_reply": answer.reply}
                )
            )
        return out
