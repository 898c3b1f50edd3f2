"""The generator of desktop tasks: Harbor-style task directories, each a Tk form (its form.json,
shown by form_app.py) on a small virtual screen and a verifier that reads the form's saved state.

The app itself ships once, as this package's ``form_app.py``, and so does the verifier's checker
(``check_form.py``; each task's ``tests/test.sh`` is one line naming what it expects): task
directories do not hold copies; :func:`with_app` puts them into a loaded task (as ``app.py``,
where its task.toml runs it, and among its tests), so a loaded task is self-contained.

Three kinds: ``check`` ("tick the box labelled ... and press Save"), ``type`` ("type ... into
the ... field and press Save") and ``choose`` ("choose ... from the list and press Save"). The
layout is fixed and on screen coordinates (the window sits at 0,0), so :func:`centre` tells a
scripted model where each widget is. ``python -m rllm_cookbook_desktop.forms OUT N SEED`` writes
N more tasks.
"""

from __future__ import annotations

import json
import random
import shlex
import sys
from pathlib import Path
from typing import Any

from rllm.types import Task
from rllm.types.errors import InputError

WIDTH, HEIGHT = 320, 240
TITLE = "rllm-form"
KINDS = ("check", "type", "choose")
CHECK_LABELS = ("Subscribe", "Remember me", "Dark mode", "Notifications", "Auto save", "Beta features")
CHOICES = ("red", "green", "blue", "orange", "purple", "yellow")
FIELDS = ("Name", "City", "Email", "Team")
WORDS = ("alice", "berlin", "tokyo", "delta", "kiwi", "lumen", "orbit", "pixel", "quartz", "sierra")
APP = Path(__file__).with_name("form_app.py")
CHECKER = Path(__file__).with_name("check_form.py")
SETTLE_S = 2.0  # how long a verifier waits for a right state to land (wrong ones take this long)


def form_of(rng: random.Random) -> dict[str, Any]:
    """A form: three checkboxes (left), three choices (right), a text field, a Save button."""
    checks = rng.sample(CHECK_LABELS, 3)
    choices = rng.sample(CHOICES, 3)
    widgets: list[dict[str, Any]] = [
        {"kind": "check", "label": label, "rect": [10, 10 + 30 * i, 140, 26]}
        for i, label in enumerate(checks)
    ]
    widgets += [
        {"kind": "radio", "label": label, "rect": [170, 10 + 30 * i, 140, 26]}
        for i, label in enumerate(choices)
    ]
    widgets.append({"kind": "field", "label": rng.choice(FIELDS), "rect": [80, 110, 230, 26]})
    widgets.append({"kind": "button", "label": "Save", "rect": [10, 150, 100, 30]})
    return {"title": TITLE, "width": WIDTH, "height": HEIGHT, "widgets": widgets}


def centre(form: dict[str, Any], kind: str, label: str | None = None) -> tuple[int, int]:
    """The screen point at the middle of the form's widget of ``kind`` (and ``label``)."""
    for widget in form["widgets"]:
        if widget["kind"] == kind and (label is None or widget["label"] == label):
            x, y, w, h = widget["rect"]
            return x + w // 2, y + h // 2
    raise InputError(f"the form has no {kind} widget {label!r}")


def task_files(kind: str, rng: random.Random) -> dict[str, str]:
    """One task directory's files (relative path -> text) of ``kind``."""
    if kind not in KINDS:
        raise InputError(f"task kind must be one of {', '.join(KINDS)}, got {kind!r}")
    form = form_of(rng)
    labels = {k: [w["label"] for w in form["widgets"] if w["kind"] == k] for k in ("check", "radio", "field")}
    save = centre(form, "button")
    if kind == "check":
        target = rng.choice(labels["check"])
        instruction = f"Tick the box labelled '{target}' and press Save."
        expect = {"checked": [target]}
        steps = [f"mousemove {x} {y} click 1" for x, y in (centre(form, "check", target), save)]
    elif kind == "type":
        target = rng.choice(WORDS)
        instruction = f"Type '{target}' into the {labels['field'][0]} field and press Save."
        expect = {"text": target}
        x, y = centre(form, "field")
        steps = [
            f"mousemove {x} {y} click 1",
            f"type -- {shlex.quote(target)}",
            "mousemove {} {} click 1".format(*save),
        ]
    else:
        target = rng.choice(labels["radio"])
        instruction = f"Choose '{target}' from the list and press Save."
        expect = {"choice": target}
        steps = [f"mousemove {x} {y} click 1" for x, y in (centre(form, "radio", target), save)]
    toml = (
        "[agent]\ntimeout_sec = 120\n\n[verifier]\ntimeout_sec = 30\n\n"
        "[environment]\nnetwork = false\nsetup_timeout_sec = 30\n\n"
        f"[environment.desktop]\nwidth = {WIDTH}\nheight = {HEIGHT}\nscreenshot_max = {WIDTH}\n"
        'apps = ["exec python3 app.py"]\n\n'
        f'[metadata]\nkind = "{kind}"\nmax_turns = 8\n'
    )
    return {
        "instruction.md": instruction + "\n",
        "task.toml": toml,
        "environment/files/form.json": json.dumps(form, indent=1) + "\n",
        # the checker ships once (check_form.py); with_app adds it to a loaded task's tests
        "tests/test.sh": f'exec python3 "$(dirname "$0")/check_form.py" {shlex.quote(json.dumps(expect))} {SETTLE_S!r}\n',
        "solution/solve.sh": "".join(f"xdotool {step}\n" for step in steps),
    }


def with_app(task: Task) -> Task:
    """``task`` with the form app among its sandbox files as ``app.py`` and the verifier's
    checker among its tests as ``check_form.py`` (a task directory that brings its own keeps it)."""
    sandbox = task.metadata.get("sandbox")
    if not isinstance(sandbox, dict):
        raise InputError(f"task {task.id!r} is not from a task directory (no sandbox in its metadata)")
    files = sandbox.get("files") or {}
    if "app.py" not in files:
        sandbox = {**sandbox, "files": {**files, "app.py": APP.read_text()}}
    tests = task.metadata.get("tests") or {}
    if "check_form.py" not in tests:
        tests = {**tests, "check_form.py": CHECKER.read_text()}
    task.metadata = {**task.metadata, "sandbox": sandbox, "tests": tests}  # new dicts: nothing shared changes
    return task


def generate(out: str | Path, count: int, seed: int = 0) -> list[Path]:
    """Write ``count`` task directories under ``out`` (kinds in turn); returns their paths."""
    rng, root, made = random.Random(seed), Path(out), []
    for number in range(count):
        kind = KINDS[number % len(KINDS)]
        folder = root / f"form-{seed}-{number:03d}-{kind}"
        for rel, text in task_files(kind, rng).items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)
        made.append(folder)
    return made


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python -m rllm_cookbook_desktop.forms OUT_DIR COUNT SEED")
    for path in generate(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])):
        print(path)
