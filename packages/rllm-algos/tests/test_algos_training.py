"""A real (tiny) RL loop: group → filter → advantages → loss → optimizer step improves reward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rllm.algos import AlgorithmConfig, compute_advantages, filter_groups, group_trajectories  # noqa: E402
from rllm.algos.losses import compute_policy_loss  # noqa: E402
from rllm.types import Episode, Step, Trajectory  # noqa: E402

VOCAB, LENGTH, PROMPTS, GROUP = 6, 4, 4, 8


class TinyPolicy(torch.nn.Module):
    """Autoregressive over a 6-token vocabulary, conditioned on the prompt id and previous token."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt = torch.nn.Embedding(PROMPTS, 16)
        self.prev = torch.nn.Embedding(VOCAB + 1, 16)
        self.out = torch.nn.Linear(16, VOCAB)

    def logits(self, prompt: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.prompt(prompt)[:, None, :] + self.prev(prev)))


def _rollouts(policy: TinyPolicy, gen: torch.Generator) -> list[Episode]:
    prompt = torch.arange(PROMPTS).repeat_interleave(GROUP)
    tokens = torch.full((len(prompt), LENGTH + 1), VOCAB)  # start token
    logprobs = torch.zeros(len(prompt), LENGTH)
    with torch.no_grad():
        for t in range(LENGTH):
            dist = torch.log_softmax(policy.logits(prompt, tokens[:, : t + 1])[:, -1], -1)
            nxt = torch.multinomial(dist.exp(), 1, generator=gen).squeeze(-1)
            tokens[:, t + 1] = nxt
            logprobs[:, t] = dist.gather(-1, nxt[:, None]).squeeze(-1)
    episodes = []
    for i in range(len(prompt)):
        target = int(prompt[i]) + 1  # each prompt wants a different token
        response = tokens[i, 1:].tolist()
        reward = sum(tok == target for tok in response) / LENGTH
        step = Step(
            prompt_ids=[int(prompt[i])], completion_ids=response, completion_logprobs=logprobs[i].tolist()
        )
        traj = Trajectory(role="solver", steps=[step], reward=reward)
        episodes.append(Episode(task_id=f"p{int(prompt[i])}", rollout_index=i % GROUP, trajectories=[traj]))
    return episodes


@pytest.mark.parametrize("loss", ["ppo_clip", "gspo", "cispo"])
def test_grpo_training_improves_reward(loss: str) -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    policy = TinyPolicy()
    opt = torch.optim.Adam(policy.parameters(), lr=0.05)
    config = AlgorithmConfig(loss=loss, clip_high=0.28, aggregation="token-mean").validate()
    mean_rewards = []
    for _ in range(25):
        episodes = _rollouts(policy, gen)
        mean_rewards.append(sum(e.trajectories[0].reward for e in episodes) / len(episodes))
        kept, _ = filter_groups(group_trajectories(episodes, config), config)
        if not kept:
            continue
        compute_advantages(kept, config)
        steps = [t.steps[0] for g in kept for t in g.trajectories]
        prompt = torch.tensor([s.prompt_ids[0] for s in steps])
        response = torch.tensor([list(s.completion_ids) for s in steps])
        old = torch.tensor([list(s.completion_logprobs) for s in steps])
        adv = torch.tensor([s.advantage for s in steps], dtype=torch.float32)
        prev = torch.cat([torch.full((len(steps), 1), VOCAB), response[:, :-1]], dim=1)
        for _ in range(2):  # two updates per batch so the ratio actually moves off 1
            lp = (
                torch.log_softmax(policy.logits(prompt, prev), -1).gather(-1, response[..., None]).squeeze(-1)
            )
            loss_value, _ = compute_policy_loss(lp, old, adv, torch.ones_like(lp), config)
            opt.zero_grad()
            loss_value.backward()
            opt.step()
    assert mean_rewards[0] < 0.35  # about 1/6 at random init
    assert sum(mean_rewards[-3:]) / 3 > 0.6, mean_rewards
