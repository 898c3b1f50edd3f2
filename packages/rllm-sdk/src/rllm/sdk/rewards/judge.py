"""An LLM-as-judge evaluator that calls any OpenAI-compatible endpoint (install ``rllm-sdk[judge]``).

The judge sees the task, the reference answer (if any) and the episode's final answer, and must
end its reply with ``VERDICT: CORRECT`` or ``VERDICT: INCORRECT`` (or ``SCORE: x`` in [0, 1]).
An unparseable reply is an error, not a silent 0: the engine records it on the episode.
"""

from __future__ import annotations

import re
from typing import Any

from rllm.sdk.answer import final_answer
from rllm.types import Episode, EvalOutput, Task
from rllm.types.errors import InputError, MissingExtraError, RLLMError

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


class JudgeParseError(RLLMError, ValueError):
    """The judge model's reply had neither a VERDICT nor a SCORE line."""


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
    """Evaluator that asks a model to grade the episode's answer.

    ``base_url`` is any OpenAI-compatible endpoint (a gateway session URL, vLLM, a hosted API).
    The client is created lazily and reused, so one judge serves many concurrent rollouts.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "EMPTY",
        prompt_template: str = DEFAULT_JUDGE_PROMPT,
        temperature: float = 0.0,
        max_tokens: int = 512,
        answer_role: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        for field in ("{answer}",):
            if field not in prompt_template:
                raise InputError(f"judge prompt_template must contain {field}")
        self.base_url = base_url
        self.model = model
        self.api_key = api_key
        self.prompt_template = prompt_template
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.answer_role = answer_role
        self.timeout_s = timeout_s
        self._client: Any = None

    def _get_client(self) -> Any:
        if self._client is None:
            try:
                from openai import AsyncOpenAI
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise MissingExtraError("the LLM judge needs openai: pip install 'rllm-sdk[judge]'") from exc
            self._client = AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s)
        return self._client

    def render_prompt(self, task: Task, episode: Episode) -> str:
        instruction = task.instruction if isinstance(task.instruction, str) else str(task.instruction)
        reference = "" if task.ground_truth is None else str(task.ground_truth)
        return self.prompt_template.format(
            instruction=instruction,
            reference=reference or "(none given)",
            answer=final_answer(episode, self.answer_role),
        )

    async def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        reply = await self.ask(self.render_prompt(task, episode))
        reward, correct = parse_verdict(reply)
        return EvalOutput(reward=reward, is_correct=correct, metadata={"judge_reply": reply})

    async def ask(self, prompt: str) -> str:
        client = self._get_client()
        completion = await client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            temperature=self.temperature,
            max_tokens=self.max_tokens,
        )
        return completion.choices[0].message.content or ""

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
