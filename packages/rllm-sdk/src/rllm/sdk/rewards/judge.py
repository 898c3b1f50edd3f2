"""An LLM-as-judge evaluator of one answer against a reference (install ``rllm-sdk[judge]``).

The judge sees the task, the reference answer (if any) and the episode's final answer, and must
end its reply with ``VERDICT: CORRECT`` or ``VERDICT: INCORRECT`` (or ``SCORE: x`` in [0, 1]).
It asks through a :class:`~rllm.sdk.rewards.judge_client.JudgeEndpoint` (concurrency limit,
cache, tokens and cost as ``judge/*`` signals). An unparseable reply or an endpoint that fails is
never a silent 0: the episode is marked ``infra_error`` with the judge's reply
(:func:`~rllm.sdk.rewards.rubric.mark_judge_failure`). Rubric and group judges are in
:mod:`rllm.sdk.rewards.rubric`.
"""

from __future__ import annotations

import re

from rllm.sdk.answer import final_answer
from rllm.sdk.rewards.judge_client import JudgeEndpoint
from rllm.sdk.rewards.judge_parse import JudgeParseError
from rllm.sdk.rewards.rubric import mark_judge_failure
from rllm.types import Episode, EvalOutput, Signal, Task
from rllm.types.errors import InputError

DEFAULT_JUDGE_PROMPT = """You are grading an answer to a task.

Task:
{instruction}

Reference answer:
{reference}

Answer to grade:
{answer}

Decide whether the answer is correct (matches the reference in meaning; ignore formatting).
Reply with a short justification, then a final line that is exactly
VERDICT: CORRECT
or
VERDICT: INCORRECT"""

_VERDICT = re.compile(r"VERDICT\s*:\s*(CORRECT|INCORRECT)", re.IGNORECASE)
_SCORE = re.compile(r"SCORE\s*:\s*([-+]?\d*\.?\d+)", re.IGNORECASE)


def parse_verdict(reply: str) -> tuple[float, bool]:
    """``(reward, is_correct)`` from a judge reply; the last VERDICT/SCORE line wins."""
    verdicts = _VERDICT.findall(reply)
    if verdicts:
        correct = verdicts[-1].upper() == "CORRECT"
        return (1.0 if correct else 0.0), correct
    scores = _SCORE.findall(reply)
    if scores:
        score = float(scores[-1])
        if not 0.0 <= score <= 1.0:
            raise JudgeParseError(f"judge SCORE {score} is outside [0, 1]")
        return score, score >= 0.5
    raise JudgeParseError(
        f"judge reply has no 'VERDICT: CORRECT|INCORRECT' or 'SCORE: x' line: {reply[-200:]!r}"
    )


class LLMJudge:
    """Evaluator that asks a model whether the episode's answer matches the reference.

    ``base_url`` is any OpenAI-compatible endpoint (vLLM, ``rllm serve``, a hosted API); or pass
    a ready ``endpoint`` (shared with other judges: one concurrency limit, cache and tally).
    """

    def __init__(
        self,
        base_url: str = "",
        model: str = "",
        api_key: str = "EMPTY",
        prompt_template: str = DEFAULT_JUDGE_PROMPT,
        temperature: float = 0.0,
        max_tokens: int = 512,
        answer_role: str | None = None,
        timeout_s: float = 60.0,
        endpoint: JudgeEndpoint | None = None,
    ) -> None:
        for field in ("{answer}",):
            if field not in prompt_template:
                raise InputError(f"judge prompt_template must contain {field}")
        self.endpoint = endpoint or JudgeEndpoint(
            base_url,
            model,
            api_key=api_key,
            temperature=temperature,
            max_tokens=max_tokens,
            timeout_s=timeout_s,
        )
        self.prompt_template = prompt_template
        self.answer_role = answer_role

    def render_prompt(self, task: Task, episode: Episode) -> str:
        instruction = task.instruction if isinstance(task.instruction, str) else str(task.instruction)
        reference = "" if task.ground_truth is None else str(task.ground_truth)
        return self.prompt_template.format(
            instruction=instruction,
            reference=reference or "(none given)",
            answer=final_answer(episode, self.answer_role),
        )

    async def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        messages = [{"role": "user", "content": self.render_prompt(task, episode)}]
        try:
            answer = await self.endpoint.ask(messages, parse_verdict)
        except Exception as exc:
            return mark_judge_failure(episode, exc)
        reward, correct = answer.value
        signals: list[Signal] = answer.usage.signals()
        return EvalOutput(
            reward=reward, is_correct=correct, signals=signals, metadata={"judge_reply": answer.reply}
        )

    async def aclose(self) -> None:
        await self.endpoint.aclose()


__all__ = ["DEFAULT_JUDGE_PROMPT", "JudgeParseError", "LLMJudge", "parse_verdict"]
