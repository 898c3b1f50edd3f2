from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rllm_cookbook_guess_number import (
    GUESSER_ROLE,
    PICKER_ROLE,
    generate,
    guess_reward,
    load_tasks,
    parse_number,
)

from rllm.engine.plugins import load_cookbook
from rllm.engine.training.trainer_config import load_config

ROOT = Path(__file__).resolve().parents[2] / "cookbooks" / "guess_number"


def test_shipped_sample_is_the_generators_output():
    for split in ("train", "test"):
        tasks = load_tasks(split)
        assert [(t.id, t.metadata["high"]) for t in tasks] == [(r["id"], r["high"]) for r in generate(split)]
        for t in tasks:  # the picker's instruction names every number it may pick
            assert all(f" {n}" in str(t.instruction) for n in range(1, t.metadata["high"] + 1))


@pytest.mark.parametrize(
    ("reply", "number"),
    [
        ("3", 3),
        ("I pick 7.", 7),
        ("7, my guess is 7", 7),
        ("I pick 7 then 2", None),  # several numbers name none
        ("1. First try: 2", None),  # a numbered list is not a guess of 1 (what SmolLM2 learned)
        ("1. 12", None),
        ("0", None),
        ("9", None),
        ("-2", None),
        ("none", None),
        ("", None),
    ],
)
def test_parse_number(reply, number):
    assert parse_number(reply, 8) == number


@given(
    high=st.integers(1, 50),
    data=st.data(),
    words=st.lists(st.text(alphabet=st.characters(blacklist_categories=["Nd"]), max_size=8), max_size=4),
)
def test_a_reply_naming_one_number_in_range_is_read_as_it_and_two_numbers_as_none(high, data, words):
    number = data.draw(st.integers(1, high))
    text = f" {number} ".join(words) if len(words) > 1 else f"{''.join(words)} {number}"
    assert parse_number(text, high) == number
    other = data.draw(st.integers(0, 99).filter(lambda n: n != number))
    assert parse_number(f"{text} {other}", high) is None


@given(high=st.integers(1, 50), reply=st.text(max_size=30))
def test_parse_number_returns_only_numbers_in_range(high, reply):
    number = parse_number(reply, high)
    assert number is None or (1 <= number <= high and str(number) in reply)


@given(guesses=st.integers(1, 10), data=st.data())
def test_guess_reward_is_higher_the_sooner_and_zero_when_never(guesses, data):
    k = data.draw(st.integers(1, guesses))
    assert guess_reward(None, guesses) == 0.0
    assert 0.0 < guess_reward(k, guesses) <= guess_reward(1, guesses) == 1.0
    if k > 1:
        assert guess_reward(k, guesses) < guess_reward(k - 1, guesses)


async def test_the_game_against_a_scripted_model(scripted):
    won, forfeited = load_tasks("test")[:2]
    by_instruction = {t.instruction: t for t in (won, forfeited)}
    seen_hints: list[str] = []

    def respond(body):
        messages = body["messages"]
        first = messages[0]["content"]
        if first.startswith("Pick a secret number"):  # the picker
            task = by_instruction[first]
            return "no idea" if task is forfeited else "2"
        # The guesser counts 1, 2, ...: it finds the 2 the picker said at its second guess, the
        # forfeited game's fallback number when it has guesses enough.
        seen_hints.extend(m["content"] for m in messages[2::2])
        return str(len(messages) // 2 + 1)

    episodes = await scripted(load_cookbook("guess-number"), [won, forfeited], respond)
    by_id = {e.task_id: e for e in episodes}
    for e in episodes:
        assert sorted(t.role for t in e.trajectories) == [GUESSER_ROLE, PICKER_ROLE]
    game = by_id[won.id]
    rewards = {t.role: t.reward for t in game.trajectories}
    guesses = won.metadata["guesses"]
    assert game.artifacts["picked"] == 2 and game.artifacts["guesses"] == [1, 2]
    assert rewards[GUESSER_ROLE] == guess_reward(2, guesses) == (guesses - 1) / guesses
    assert rewards[PICKER_ROLE] == pytest.approx(1 - rewards[GUESSER_ROLE])
    assert "Higher." in seen_hints  # 1 < 2: the guesser was told to go higher
    (guesser,) = [t for t in game.trajectories if t.role == GUESSER_ROLE]
    assert len(guesser.steps) == 2  # one trajectory, a step per guess
    lost_game = by_id[forfeited.id]
    secret = forfeited.metadata["fallback"]
    assert lost_game.artifacts["picked"] is None and lost_game.artifacts["secret"] == secret
    forfeit_rewards = {t.role: t.reward for t in lost_game.trajectories}
    assert forfeit_rewards[PICKER_ROLE] == 0.0  # forfeited, whatever the guesser did
    found = secret <= forfeited.metadata["guesses"]  # the guesser counts 1, 2, ...
    assert forfeit_rewards[GUESSER_ROLE] == guess_reward(
        secret if found else None, forfeited.metadata["guesses"]
    )


def test_the_configs_load_one_shared_policy_and_two():
    cookbook = load_cookbook("guess-number")
    base = {**cookbook.train_defaults, "cookbook": "guess-number"}
    shared = load_config(ROOT / "configs" / "tinker_local.yaml", base=base)
    assert shared.policies == {} and shared.roles == {}
    two = load_config(ROOT / "configs" / "two_policies.yaml", base=base)
    assert two.roles == {GUESSER_ROLE: "guesser"} and set(two.policies) == {"guesser"}
    readme = (ROOT / "README.md").read_text()
    assert "configs/tinker_local.yaml" in readme and "configs/two_policies.yaml" in readme


@pytest.mark.slow
def test_two_training_steps_train_both_players_on_their_own_policies(train, tmp_path):
    rows = train(
        "guess-number",
        tmp_path,
        "backend.options.lora.rank=4",
        "policies.guesser.learning_rate=0.02",
        "roles.guesser=guesser",
    )
    for row in rows:
        # A picker and a guesser trajectory per episode, each trained by its own policy (the
        # guesser's turns may be several sequences: the tiny template starts new segments).
        assert row["policy/default/train/sequences"] == row["episodes"]
        assert row["policy/guesser/train/sequences"] >= row["episodes"]
        assert row["policy/guesser/train/lr"] == pytest.approx(0.02)
        assert (
            "policy/default/advantage/picker/mean" in row and "policy/guesser/advantage/guesser/mean" in row
        )
        assert "policy/default/advantage/guesser/mean" not in row
