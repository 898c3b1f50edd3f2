"""FrozenLake, multi-turn: each turn shows the map, the reply's move is played, until the goal,
a hole or the turn limit. Reward 1 at the goal; with ``step_credit="turn"`` each move is credited
with the discounted outcome."""

from __future__ import annotations

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook
from rllm.sdk.evaluator import evaluator
from rllm.types import AgentConfig, Episode, EvalOutput, Signal, Task, TerminationReason
from rllm_cookbook_frozenlake.data import FIXED_MAP, generate, load_tasks, task_for_map
from rllm_cookbook_frozenlake.env import make_env, parse_action, render


@rollout
async def frozenlake_flow(task: Task, config: AgentConfig) -> Episode:
    desc = task.metadata["map"]
    max_turns = int(task.metadata.get("max_turns", 8))
    env = make_env(desc)
    position, _ = env.reset(seed=0)
    messages = [{"role": "user", "content": str(task.instruction)}]
    moves: list[str] = []
    outcome, invalid = "turn_limit", 0
    async with async_openai(config) as client:
        for _ in range(max_turns):
            reply = await client.chat.completions.create(
                model=config.model, messages=messages, **{"max_tokens": 64, **sampling_kwargs(config)}
            )
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            action = parse_action(text)
            moves.append(text)
            if action is None:
                invalid += 1
                messages.append({"role": "user", "content": f"No move found.\n{render(desc, position)}"})
                continue
            position, reward, terminated, _, _ = env.step(action)
            if terminated:
                outcome = "goal" if reward > 0 else "hole"
                break
            messages.append({"role": "user", "content": render(desc, int(position))})
    env.close()
    return Episode(
        task_id=task.id,
        artifacts={"outcome": outcome, "turns": len(moves), "moves": moves, "invalid_moves": invalid},
        termination_reason=TerminationReason.MAX_TURNS if outcome == "turn_limit" else TerminationReason.DONE,
    )


@evaluator
def frozenlake_evaluator(task: Task, episode: Episode) -> EvalOutput:
    success = episode.artifacts.get("outcome") == "goal"
    return EvalOutput(
        reward=1.0 if success else 0.0,
        is_correct=success,
        signals=[Signal(name="invalid_moves", value=float(episode.artifacts.get("invalid_moves", 0)))],
    )


TRAIN_DEFAULTS = {
    "total_steps": 100,
    "tasks_per_step": 16,
    "group_size": 8,
    "val_split": "test",
    "val_every": 10,
    "rollout": {"sampling": {"temperature": 1.0, "max_tokens": 64}},
    # The outcome arrives at the last move; each earlier move gets it discounted.
    "algorithm": {"step_credit": "turn", "gamma": 0.9},
}

cookbook = Cookbook(
    name="frozenlake",
    flow=frozenlake_flow,
    evaluator=frozenlake_evaluator,
    load_tasks=load_tasks,
    description="Multi-turn FrozenLake (gymnasium, 4x4, not slippery); reward 1 for reaching the goal.",
    train_defaults=TRAIN_DEFAULTS,
)

__all__ = [
    "FIXED_MAP",
    "cookbook",
    "frozenlake_evaluator",
    "frozenlake_flow",
    "generate",
    "load_tasks",
    "task_for_map",
]
