"""reasoning-gym's generators as rLLM cookbooks: ``rllm train reasoning-gym:NAME``.

Each generator NAME becomes a cookbook: its entries are the tasks (a train split and a test
split, from two seeds), the flow asks the model once with reasoning-gym's own system prompt and
reads the ``<answer>...</answer>`` it asks for, and the evaluator is the generator's own
``score_answer`` (reward in [0, 1], correct at 1). Difficulty parameters are cookbook options
(``cookbook_options.min_animals=3``, ``rllm eval reasoning-gym:NAME --option min_animals=3``),
checked against the generator's config before anything runs, as are ``size``, ``test_size``,
``seed`` and ``system_prompt`` (a key of ``reasoning_gym.utils.SYSTEM_PROMPTS``).
"""

from __future__ import annotations

from typing import Any

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Adapter, Cookbook, train_defaults
from rllm.types import AgentConfig, Episode, EvalOutput, Signal, Task
from rllm.types.errors import InputError
from rllm_adapter_reasoning_gym import generators


@rollout
async def reasoning_gym_flow(task: Task, config: AgentConfig) -> dict[str, Any]:
    """One model call: reasoning-gym's system prompt and the question; the answer in its tags."""
    from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer

    style = task.metadata.get("system_prompt", "default")
    messages = [
        {"role": "system", "content": SYSTEM_PROMPTS[style]},
        {"role": "user", "content": task.instruction},
    ]
    async with async_openai(config) as client:
        reply = await client.chat.completions.create(
            model=config.model, messages=messages, **sampling_kwargs(config)
        )
    text = reply.choices[0].message.content or ""
    return {"answer": extract_answer(text), "reply": text, "is_validation": config.is_validation}


class ReasoningGymScorer:
    """The generator's own ``score_answer`` on the flow's extracted answer (None when the reply
    had no answer tags, which the generator scores as it scores any missing answer)."""

    async def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        dataset, entry = generators.entry_of(task)
        answer = episode.artifacts.get("answer")
        score = float(dataset.score_answer(answer=answer, entry=entry))
        return EvalOutput(
            reward=score,
            is_correct=score >= 1.0,
            signals=[Signal(name="answer_tagged", value=float(answer is not None))],
        )


reasoning_gym_scorer = ReasoningGymScorer()


def cookbook_for(name: str, options: dict[str, Any] | None = None) -> Cookbook:
    """The cookbook of generator ``name`` with ``options`` (difficulty parameters and the
    adapter's own ``size``, ``test_size``, ``seed``, ``system_prompt``)."""
    generators.library()
    generators.parameters(name)  # LookupFailed naming the generators there are
    options = dict(options or {})
    size = _positive(options.pop("size", 1000), "size")
    test_size = _positive(options.pop("test_size", 64), "test_size")
    seed = int(options.pop("seed", 1))
    style = str(options.pop("system_prompt", "default"))
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if style not in SYSTEM_PROMPTS:
        raise InputError(f"reasoning-gym system_prompt {style!r} is not one of {sorted(SYSTEM_PROMPTS)}")
    params = options
    generators.check_params(name, params)

    def load_tasks(split: str) -> list[Task]:
        if split not in ("train", "test"):
            raise InputError(f"reasoning-gym:{name} has splits 'train' and 'test', not {split!r}")
        # The test split comes from another seed: other entries than training's.
        n, split_seed = (size, seed) if split == "train" else (test_size, seed + 1_000_003)
        made = generators.tasks(name, params, seed=split_seed, size=n, split=split)
        if style != "default":
            for task in made:
                task.metadata["system_prompt"] = style
        return made

    def configure(more: dict[str, Any]) -> Cookbook:
        return cookbook_for(
            name,
            {"size": size, "test_size": test_size, "seed": seed, "system_prompt": style, **params, **more},
        )

    return Cookbook(
        name=f"reasoning-gym:{name}",
        flow=reasoning_gym_flow,
        evaluator=reasoning_gym_scorer,
        load_tasks=load_tasks,
        description=f"reasoning-gym's {name} generator, scored by its own score_answer",
        train_defaults=train_defaults(tasks_per_step=16, group_size=8, max_tokens=1024),
        configure=configure,
    )


def _positive(value: Any, key: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise InputError(f"reasoning-gym option {key} must be a whole number >= 1, got {value!r}")
    return number


adapter = Adapter(
    prefix="reasoning-gym",
    package="rllm-adapter-reasoning-gym",
    library="reasoning-gym",
    cookbook=cookbook_for,
    names=generators.names,
    flows=("single-turn",),
    modes=("train", "eval"),
    description="any reasoning-gym generator as a dataset with its own scorer",
)

__all__ = [
    "ReasoningGymScorer",
    "adapter",
    "cookbook_for",
    "reasoning_gym_flow",
    "reasoning_gym_scorer",
]
