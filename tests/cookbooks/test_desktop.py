"""The desktop cookbook: its task directories (unsolved at start, solved by the reference), and
the screenshot -> tool call -> action loop against a scripted VLM that knows where the widgets
are (reward 1) and one that clicks elsewhere (reward 0). Real bubblewrap, Xvfb and Tk."""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import os
import re
import shutil
from pathlib import Path

import msgspec
import pytest
import rllm_cookbook_desktop
from rllm_cookbook_desktop import TOOLS, load_tasks
from rllm_cookbook_desktop.forms import centre, generate

from rllm.engine.plugins import load_cookbook
from rllm.engine.sandbox import BubblewrapBackend
from rllm.sdk.task_dir import run_verifier, task_sandbox_spec
from rllm.testing import MockReply

pytestmark = [
    pytest.mark.skipif(
        any(shutil.which(t) is None for t in ("bwrap", "Xvfb", "evilwm", "xdotool", "xwd", "xwdtopnm")),
        reason="apt-get install bubblewrap xvfb evilwm xdotool x11-apps netpbm python3-tk",
    ),
    pytest.mark.timeout(240),
]


def _call(name: str, **args: object) -> MockReply:
    return MockReply(
        tool_calls=[
            {
                "id": f"call_{name}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ]
    )


def one_of_each_kind():
    tasks = load_tasks("test")
    assert len(tasks) == 10 and len({t.id for t in tasks}) == 10
    return [next(t for t in tasks if t.metadata["kind"] == kind) for kind in ("check", "type", "choose")]


def test_the_app_ships_once_and_every_loaded_task_carries_it(tmp_path) -> None:
    package = Path(rllm_cookbook_desktop.__file__).parent
    assert list((package / "tasks").rglob("app.py")) == []  # no copy per task folder
    made = generate(tmp_path / "more", 3, 7)
    assert [p for folder in made for p in folder.rglob("*.py")] == []  # nor does the generator write one
    (made[0] / "environment" / "files" / "app.py").write_text("print('its own app')\n")
    app = (package / "form_app.py").read_text()
    for split in ("test", f"dir:{tmp_path / 'more'}"):
        tasks = load_tasks(split)
        own = [t for t in tasks if t.id == made[0].name]
        assert len(tasks) >= 3 and all(
            t.metadata["sandbox"]["files"]["app.py"] == app for t in tasks if t not in own
        )
        assert all(t.metadata["sandbox"]["files"]["app.py"] == "print('its own app')\n" for t in own)


async def test_each_kind_is_unsolved_at_start_and_solved_by_its_reference() -> None:
    backend = BubblewrapBackend()
    for task in one_of_each_kind():
        sandbox = await backend.create(task_sandbox_spec(task))
        try:
            assert (await sandbox.exec("while [ ! -e .form-ready ]; do sleep 0.02; done", timeout=30)).ok
            assert not (await run_verifier(sandbox, task)).ok, task.id
            await sandbox.write_file("solve.sh", task.metadata["solution"])
            ran = await sandbox.exec("sh solve.sh && rm solve.sh")
            assert ran.ok, (task.id, ran.stderr)
            after = await run_verifier(sandbox, task)
            assert after.ok, (task.id, after.stdout, after.stderr)
        finally:
            await sandbox.close()


async def test_a_right_state_that_lands_while_the_verifier_runs_still_counts() -> None:
    # The app handles the agent's last click after the X server sent it: the Save may land just
    # after the episode ended. The verifier gives a right state a moment to land.
    task = next(t for t in load_tasks("test") if t.metadata["kind"] == "type")
    expect = task.instruction.split("'")[1]
    spec = msgspec.structs.replace(task_sandbox_spec(task), desktop=None)  # the state file is all it reads
    right = json.dumps({"saved": True, "text": expect}).encode()
    sandbox = await BubblewrapBackend().create(spec)
    try:
        # state.json is first a FIFO (also linked as .fifo): the verifier's first read blocks in
        # open() until this test writes the old state into it, so that read sees the old state.
        assert (await sandbox.exec("mkfifo state.json && ln state.json .fifo")).ok
        work = sandbox.root / "work"

        def old_state_into_the_first_read() -> None:
            with open(work / "state.json", "wb") as fifo:
                fifo.write(json.dumps({"saved": True, "text": "not yet"}).encode())

        verdict = asyncio.ensure_future(run_verifier(sandbox, task))
        await asyncio.to_thread(old_state_into_the_first_read)
        # Then the app's late Save: a regular file in its place, and the right state for a read
        # that had already opened the FIFO again meanwhile.
        await sandbox.write_file("state.tmp", right)
        assert (await sandbox.exec("mv state.tmp state.json")).ok
        try:
            fd = os.open(work / ".fifo", os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            assert exc.errno == errno.ENXIO  # no read waiting on it
        else:
            os.write(fd, right)
            os.close(fd)
        result = await verdict
        assert result.ok, (result.stdout, result.stderr)
        await sandbox.write_file("state.json", json.dumps({"saved": True, "text": "wrong"}))
        wrong = await run_verifier(sandbox, task)  # and a wrong one still fails, saying why
        assert not wrong.ok and "saved state differs" in wrong.stderr
    finally:
        await sandbox.close()


def plan_for(task) -> list[MockReply]:
    """The right tool calls for ``task``, at its widgets' centres (the screenshot is 1:1)."""
    form = json.loads(task.metadata["sandbox"]["files"]["form.json"])
    target = task.instruction.split("'")[1]
    save = _call("click", **dict(zip("xy", centre(form, "button"), strict=True)))
    kind = task.metadata["kind"]
    if kind == "type":
        field = _call("click", **dict(zip("xy", centre(form, "field"), strict=True)))
        return [field, _call("type_text", text=target), save, _call("done")]
    widget = centre(form, "check" if kind == "check" else "radio", target)
    return [_call("click", **dict(zip("xy", widget, strict=True))), save, _call("done")]


async def test_a_scripted_vlm_that_knows_the_widgets_solves_and_one_clicking_elsewhere_fails(
    scripted,
) -> None:
    right, wrong = one_of_each_kind(), one_of_each_kind()
    wrong = [msgspec.structs.replace(t, id=t.id + "-wrong") for t in wrong]
    plans = {t.id: plan_for(t) for t in right}
    seen_errors: list[str] = []

    def respond(body):
        assert [t["function"]["name"] for t in body["tools"]] == [t["function"]["name"] for t in TOOLS]
        messages = body["messages"]
        users = [m for m in messages if m["role"] == "user"]
        assert all(m["content"][-1]["type"] == "image_url" for m in users)  # a screenshot every turn
        done = sum(1 for m in messages if m["role"] == "tool")
        task_id = next(t.id for t in right if t.instruction == users[0]["content"][0]["text"])
        return plans[task_id][done]

    episodes = await scripted(load_cookbook("desktop"), right, respond)
    assert {e.task_id: e.trajectories[0].reward for e in episodes} == {t.id: 1.0 for t in right}
    assert all(e.artifacts["done"] and e.artifacts["refused"] == 0 for e in episodes)

    def respond_wrong(body):
        messages = body["messages"]
        results = [m["content"] for m in messages if m["role"] == "tool"]
        seen_errors.extend(r for r in results[-1:] if r.startswith("error"))
        return [
            _call("click", x=5000, y=5),
            _call("click", x=300, y=230),
            _call("type_text", text="zzz"),
            _call("done"),
        ][len(results)]

    episodes = await scripted(load_cookbook("desktop"), wrong, respond_wrong)
    assert {e.task_id: e.trajectories[0].reward for e in episodes} == {t.id: 0.0 for t in wrong}
    assert all(e.artifacts["refused"] == 1 and e.artifacts["actions"] == 3 for e in episodes)
    assert len(seen_errors) == 3 and all("off the screen" in error for error in seen_errors)


@pytest.mark.slow
def test_two_training_steps_with_a_tiny_vision_language_model(tmp_path) -> None:
    """The desktop cookbook end to end on the local tinker backend: the tiny Qwen2-VL gets a
    screenshot every turn through the cumulative-mode gateway, and the steps keep the images."""
    import asyncio

    from rllm.engine.training.launch import build_trainer, task_vocabulary
    from rllm.engine.training.metrics_log import read_episode_sample, read_metrics, sample_path
    from rllm.tiny.vlm import init_tiny_vlm

    words = [*task_vocabulary(load_cookbook("desktop")), *re.findall(r"\w+|[^\w\s]", json.dumps(TOOLS))]
    model = init_tiny_vlm(tmp_path / "tiny-vlm", vocab_words=words, tool_calls=True)
    trainer = build_trainer(
        "desktop",
        out_dir=str(tmp_path / "run"),
        overrides=[
            "progress=false",
            "plot=false",
            "tensorboard=false",
            "total_steps=2",
            "tasks_per_step=2",
            "group_size=2",
            "val_every=0",
            "rollout.sampling.max_tokens=6",
            "algorithm.filter_zero_variance=false",
            f"backend.options.model={model}",
            "backend.options.lora.rank=0",
        ],
    )
    assert trainer.config.gateway.mode == "cumulative"
    assert (trainer.config.algorithm.step_credit, trainer.config.algorithm.gamma) == ("turn", 0.9)
    asyncio.run(trainer.fit())
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["train/sequences"] >= row["episodes"] > 0 for row in rows), rows
    from transformers import AutoTokenizer

    from rllm.tiny.vlm import IMAGE_PAD

    pad = AutoTokenizer.from_pretrained(model).convert_tokens_to_ids(IMAGE_PAD)
    sample = read_episode_sample(sample_path(tmp_path / "run", 1))
    for trajectory in (t for e in sample.episodes for t in e.trajectories):
        # A random model acts on nothing, so every turn adds the same screenshot: each step's
        # prompt holds one more image's tokens, and the step keeps that image once (by content).
        pads = [list(s.prompt_ids).count(pad) for s in trajectory.steps]
        assert len(pads) > 1 and all(b - a == pads[0] > 0 for a, b in itertools.pairwise(pads)), pads
        assert all(len(s.images) == 1 for s in trajectory.steps)
