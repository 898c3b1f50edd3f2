"""math-arith: the generator and the math-verify grader agree, the held-out split stays held out,
and the SFT set trains on the assistant's worked solution only."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rllm_cookbook_math import arith, arith_cookbook

from rllm.engine.data.chat_data import ChatExample, tokenize_chat
from rllm.engine.data.sft import chat_vocabulary
from rllm.tiny.tokenizer import build_tokenizer

TWO_DIGITS = st.integers(10, 99)


def _problem(a: int, op: str, b: int) -> tuple[int, str, int]:
    return (max(a, b), op, min(a, b)) if op == "-" else (a, op, b)


def _decoded(tokenizer, text: str) -> str:
    """What the sampler hands the flow: the tiny tokenizer's decoding of ``text``'s tokens."""
    return tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="module")
def sft_set() -> list[ChatExample]:
    return [ChatExample(messages=row["messages"]) for row in arith.sft_examples(300, seed=3)]


@pytest.fixture(scope="module")
def tokenizer(sft_set):
    return build_tokenizer(chat_vocabulary(sft_set))


def _columns(solution: str) -> tuple[list[str], list[str], list[str]]:
    """The worked solution's (units result, tens result, boxed) digits."""
    units, tens, boxed = re.fullmatch(
        r"[\d ]+[+-][\d ]+= ([\d ]+?)(?: ,) [\d +-]+= (-?[\d ]+?) , so \\boxed\{([\d ]+)\}", solution
    ).groups()
    return units.split(), tens.split(), boxed.split()


@settings(max_examples=60, deadline=None)
@given(TWO_DIGITS, st.sampled_from(arith.OPS), TWO_DIGITS, st.integers(-150, 150))
def test_generator_and_grader_agree(tokenizer, a, op, b, delta):
    a, op, b = _problem(a, op, b)
    truth = str(arith.answer(a, op, b))
    assert int(truth) == eval(f"{a} {op} {b}")  # the reference answer is the arithmetic itself
    solution = arith.worked_solution(a, op, b)
    # the worked solution's columns are right: its digits re-derive the answer
    if op == "+":
        assert re.fullmatch(r"\d \+ \d = \d \d , \d \+ \d \+ \d = \d \d , so \\boxed\{\d( \d)*\}", solution)
    else:
        assert re.fullmatch(r"\d \d - \d = \d , \d - \d - \d = -?\d , so \\boxed\{\d( \d)*\}", solution)
    # the box holds the answer digit by digit, each a digit the columns already wrote (tens result
    # less its leading 0, then the units digit): the last tokens are a copy of the column work
    units, tens, boxed = _columns(solution)
    assert "".join(boxed) == truth
    assert boxed == [*(tens if tens[0] != "0" or len(tens) == 1 else tens[1:]), units[-1]][-len(boxed) :]
    # graded as written and as the tiny model's tokens decode it ("\ boxed { 7 2 }")
    assert arith.arith_reward(solution, truth).reward == 1.0
    assert arith.arith_reward(_decoded(tokenizer, solution), truth).reward == 1.0
    wrong = solution.replace(
        f"{{{arith.boxed_digits(int(truth))}}}", f"{{{arith.boxed_digits(int(truth) + delta)}}}"
    )
    assert arith.arith_reward(wrong, truth).reward == (1.0 if delta == 0 else 0.0)
    assert arith.arith_reward(_decoded(tokenizer, wrong), truth).reward == (1.0 if delta == 0 else 0.0)


@settings(max_examples=50, deadline=None)
@given(
    st.integers(0, 10**6),
    st.sampled_from(["\\boxed{", "\\ boxed { ", "\\boxed {  "]),
    st.sampled_from([" ", "  ", "\n"]),
    st.text(alphabet="abc+=, ", max_size=12),
)
def test_boxed_digits_join_into_one_number(n, opening, gap, prose):
    spaced = gap.join(str(n))
    assert arith.join_boxed_digits(f"{prose}{opening}{spaced} }}") == f"{prose}\\boxed{{{n}}}"
    assert arith.arith_reward(f"{prose}{opening}{spaced} }}", str(n)).reward == 1.0
    # digits stay one number next to other symbols and after a minus sign, never a product
    assert arith.join_boxed_digits(f"{opening}{spaced} + 1 }}") == f"\\boxed{{{n} + 1}}"
    assert arith.arith_reward(f"{opening}-{gap}{spaced} }}", str(-n)).reward == 1.0
    assert arith.arith_reward(f"{opening}- 1 5 {spaced} }}", "0").reward == 0.0


def test_the_cookbook_evaluator_grades_the_split(tokenizer):
    from rllm.types import Episode

    for task in arith.load_tasks("test")[:20]:
        a1, a0, op, b1, b0 = re.fullmatch(r"What is (\d) (\d) ([+-]) (\d) (\d) \?", task.instruction).groups()
        a, b = int(a1 + a0), int(b1 + b0)
        reply = _decoded(tokenizer, arith.worked_solution(a, op, b))
        episode = Episode(task_id=task.id, artifacts={"answer": reply})
        assert arith_cookbook.evaluator(task, episode).reward == 1.0
        wrong = Episode(task_id=task.id, artifacts={"answer": reply.replace("{", "{ 1")})
        assert arith_cookbook.evaluator(task, wrong).reward == 0.0


def test_held_out_split_stays_out_of_train_and_the_sft_set():
    test = {r["question"] for r in arith.generate("test")}
    assert len(test) == arith.SPLIT_SIZES["test"]
    assert not test & {r["question"] for r in arith.generate("train")}
    prompts = {row["messages"][0]["content"].split("\n")[0] for row in arith.sft_examples(2000)}
    assert not test & prompts


def test_sft_tokenizer_covers_every_held_out_answer(tokenizer):
    for row in arith.generate("test"):
        boxed = arith.boxed_digits(int(row["answer"]))
        assert tokenizer.unk_token_id not in tokenizer.encode(boxed, add_special_tokens=False)


def test_sft_prompt_is_the_flows_prompt(sft_set):
    from rllm_cookbook_math import INSTRUCTIONS

    user = sft_set[0].messages[0]["content"]
    assert user.endswith(f"\n{INSTRUCTIONS}") and user.startswith("What is ")


def test_sft_loss_mask_covers_only_the_assistant_answer(sft_set, tokenizer):
    for example in sft_set[:50]:
        seq = tokenize_chat(tokenizer, example)
        ids, mask = list(seq.input_ids), list(seq.loss_mask)
        trained = [t for t, m in zip(ids, mask, strict=True) if m]
        answer = example.messages[1]["content"]
        # exactly the reply's tokens and the end-of-turn token that stops sampling
        assert tokenizer.decode(trained) == f"{_decoded(tokenizer, answer)} <|end|>"
        first = mask.index(1.0)
        assert all(mask[first:])  # one contiguous tail: nothing after the reply
        prompt = tokenizer.decode(ids[:first])
        assert (
            prompt.endswith("<|assistant|>") and example.messages[0]["content"].split("\n")[0][:7] in prompt
        )
        assert tokenizer.unk_token_id not in ids


def test_too_small_an_sft_set_is_refused():
    with pytest.raises(ValueError, match="one per answer"):
        arith.sft_examples(10)


def test_difficulty_levels_are_the_sdk_protocol_and_level_one_is_the_standard_split():
    from rllm.engine.training.launch import load_train_config
    from rllm.engine.training.task_sampler import sampler_for
    from rllm.sdk.cookbook import DifficultyLevels

    levels = arith_cookbook.levels
    assert isinstance(levels, DifficultyLevels) and levels.level_count() == 3
    assert levels.load_level("train", 1) == arith.load_tasks("train")  # same tasks, same ids
    seen: set[str] = set()
    for level, digits in enumerate(arith.LEVEL_DIGITS):
        train, test = levels.load_level("train", level), levels.load_level("test", level)
        assert test and len(train) >= 4 * len(test)
        ids = {t.id for t in train + test}
        assert len(ids) == len(train) + len(test) and not ids & seen  # ids differ across levels
        seen |= ids
        held_out = {t.instruction for t in test}
        assert not held_out & {t.instruction for t in train}
        for task in train + test:
            a, op, b = re.fullmatch(r"What is ([\d ]+) ([+-]) ([\d ]+) \?", task.instruction).groups()
            a, b = int(a.replace(" ", "")), int(b.replace(" ", ""))
            assert max(len(str(a)), len(str(b))) == digits and (op == "+" or a >= b)
            assert task.ground_truth == str(arith.answer(a, op, b))
    assert levels.load_level("train", 0) == levels.load_level("train", 0)  # deterministic
    with pytest.raises(ValueError, match="levels 0 to 2"):
        levels.load_level("train", 3)
    # rollout.curriculum.promote starts a run at level 0.
    config, cookbook = load_train_config("math-arith", overrides=["rollout.curriculum.promote=0.8"])
    assert [t.id for t in sampler_for(config, cookbook).tasks][:1] == ["train-L0-0000"]


def test_plain_notation_writes_the_same_problems_as_a_real_tokenizer_reads_them():
    """cookbook_options.notation=plain: ``What is 47 + 25?`` for every split and level, with the
    spaced notation's ids and answers (a run on a real model trains and validates on the same
    problems); the training config picks it up, promotion included."""
    from rllm.engine.training.launch import load_train_config
    from rllm.engine.training.task_sampler import sampler_for

    plain = arith_cookbook.with_options({"notation": "plain"})
    assert arith_cookbook.with_options({"notation": "spaced"}).load_tasks("test") == arith.load_tasks("test")
    for split in ("train", "test"):
        spaced_tasks, plain_tasks = arith.load_tasks(split), plain.load_tasks(split)
        assert [(t.id, t.ground_truth) for t in plain_tasks] == [(t.id, t.ground_truth) for t in spaced_tasks]
        for before, after in zip(spaced_tasks[:50], plain_tasks[:50], strict=True):
            a, op, b = re.fullmatch(r"What is ([\d ]+) ([+-]) ([\d ]+) \?", before.instruction).groups()
            assert after.instruction == f"What is {a.replace(' ', '')} {op} {b.replace(' ', '')}?"
    assert plain.levels is not None and plain.levels.load_level("train", 1) == plain.load_tasks("train")
    for level, digits in enumerate(arith.LEVEL_DIGITS):
        for task in plain.levels.load_level("test", level):
            a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", task.instruction).groups()
            assert max(len(a), len(b)) == digits and task.ground_truth == str(
                arith.answer(int(a), op, int(b))
            )
    config, cookbook = load_train_config(
        "math-arith", overrides=["cookbook_options.notation=plain", "rollout.curriculum.promote=0.8"]
    )
    first = sampler_for(config, cookbook).tasks[0]
    assert first.id == "train-L0-0000" and re.fullmatch(r"What is \d \S \d\?", first.instruction)


@pytest.mark.parametrize(
    ("cookbook", "options", "message"),
    [
        ("math-arith", {"notation": "words"}, r"notation must be one of \['spaced', 'plain'\], got 'words'"),
        (
            "math-arith",
            {"notaton": "plain"},
            r"unknown math option\(s\) \['notaton'\]; known: \['format_coef', 'notation'\]",
        ),
        ("math", {"notation": "plain"}, r"unknown math option\(s\) \['notation'\]; known: \['format_coef'\]"),
    ],
)
def test_a_bad_notation_is_refused_naming_it(cookbook, options, message):
    from rllm.engine.plugins import load_cookbook

    with pytest.raises(ValueError, match=message):
        load_cookbook(cookbook).with_options(options)
