"""Sandbox desktops (SandboxSpec.desktop): a private Xvfb + window manager in the bwrap sandbox,
screenshots and input through rllm.sdk.desktop, torn down at close. Real bubblewrap, Xvfb, Tk."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import textwrap
from pathlib import Path

import pytest
from sandbox_helpers import host_processes_with, needs_bwrap, within

from rllm.engine.sandbox import BubblewrapBackend
from rllm.sdk.desktop import MAX_OFF_MAP, MAX_TEXT, Desktop, DesktopInputError
from rllm.sdk.sandbox import DesktopSpec, SandboxError, SandboxSpec

needs_x = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("Xvfb", "evilwm", "xdotool", "xwd", "xwdtopnm")),
    reason="apt-get install xvfb evilwm xdotool x11-apps netpbm",
)
pytestmark = [needs_bwrap, needs_x, pytest.mark.timeout(120)]

# A Tk form that records its state in state.json and, once shown, where its widgets are.
APP = textwrap.dedent(
    """
    import json, os, tkinter as tk
    root = tk.Tk(); root.title("rllm-test-form"); root.geometry("300x160+20+20")
    state = {"clicks": 0, "saved": None}
    # Each save also writes its count to saves.fifo: a test reading it waits for the next save.
    # (Held open for reading and writing: never blocks the app, keeps unread counts in the pipe.)
    os.mkfifo("saves.fifo"); saves = os.open("saves.fifo", os.O_RDWR | os.O_NONBLOCK)
    def write():
        with open("state.tmp", "w") as f: json.dump(state, f)
        os.replace("state.tmp", "state.json")
    entry = tk.Entry(root); entry.pack(pady=8)
    def save():
        state["clicks"] += 1; state["saved"] = entry.get(); write()
        os.write(saves, b"%d\\n" % state["clicks"])
    button = tk.Button(root, text="Save", command=save); button.pack()
    # "~" keeps the app busy for 0.3 s before it reads its next key (as a loaded machine would)
    entry.bind("<KeyPress-asciitilde>", lambda event: __import__("time").sleep(0.3))
    def ready():
        def centre(w): return [w.winfo_rootx() + w.winfo_width() // 2, w.winfo_rooty() + w.winfo_height() // 2]
        state["entry"], state["button"] = centre(entry), centre(button); write()
    root.after(300, ready)
    root.mainloop()
    """
)


def form_spec(width: int = 400, height: int = 300) -> SandboxSpec:
    return SandboxSpec(
        files={"app.py": APP},
        desktop=DesktopSpec(width=width, height=height, apps=("exec /usr/bin/python3 app.py",)),
    )


async def wait_for_form(sandbox) -> dict:
    # xdotool's --sync blocks until the window exists; then the app's own record of its widgets.
    result = await sandbox.exec("xdotool search --sync --name rllm-test-form >/dev/null", timeout=30)
    assert result.ok, result.stderr
    result = await sandbox.exec(
        "while ! grep -q button state.json 2>/dev/null; do sleep 0.02; done; cat state.json", timeout=30
    )
    assert result.ok, result.stderr
    return json.loads(result.stdout)


async def test_desktop_starts_screenshots_at_its_size_and_is_gone_after_close() -> None:
    from PIL import Image

    sandbox = await BubblewrapBackend().create(form_spec(width=357, height=241))
    try:
        desktop = Desktop(sandbox)
        png = await desktop.screenshot()
        assert png.startswith(b"\x89PNG") and Image.open(io.BytesIO(png)).size == (357, 241)
        block, scale = await desktop.screenshot_block()
        assert block["type"] == "image_url" and scale == 1.0
        assert len(host_processes_with("Xvfb :0 -screen 0 357x241x24")) == 1
        assert len(host_processes_with("evilwm -fn fixed")) >= 1  # the window manager runs too
        assert (await sandbox.exec("xdotool getdisplaygeometry")).stdout.split() == ["357", "241"]
    finally:
        await sandbox.close()
    assert host_processes_with("Xvfb :0 -screen 0 357x241x24") == []
    assert not sandbox.root.exists()


async def saved_state(sandbox, clicks: int) -> dict:
    """The app's state once it has counted ``clicks`` Save clicks: the X server has sent the
    events when an action returns, but the app handles them in its own time. Each read of the
    app's saves.fifo blocks until its next save (one count per line; the shell's ``read`` takes
    one line and leaves the rest in the pipe)."""
    while True:
        result = await sandbox.exec("read -r n < saves.fifo && echo $n", timeout=30)
        assert result.ok, result.stderr
        if int(result.stdout) >= clicks:
            return json.loads(await sandbox.read_file("state.json"))


@pytest.mark.parametrize("helper", [True, False], ids=["helper", "exec-per-action"])
async def test_click_on_the_button_and_typed_text_reach_the_app(helper: bool) -> None:
    sandbox = await BubblewrapBackend().create(form_spec())
    try:
        desktop = Desktop(sandbox, helper=helper)
        form = await wait_for_form(sandbox)
        await desktop.click(*form["entry"])
        # (ASCII: exec-per-action types characters off the keyboard map on xdotool's timing;
        # the helper's way is the test below.)
        text = "hello desk"
        await desktop.type_text(text)
        await desktop.click(*form["button"])
        async with within(30, "the app saving"):
            state = await saved_state(sandbox, clicks=1)
        assert state["clicks"] == 1 and state["saved"] == text
        assert await desktop.cursor() == tuple(form["button"])
        await desktop.key("ctrl+a")  # Tk's entry: to the start of the line
        await desktop.key("Delete")
        await desktop.type_text("J")
        await desktop.click(5, 5)  # nowhere near the button: no click counted
        await desktop.click(*form["button"])
        async with within(30, "the app saving"):
            state = await saved_state(sandbox, clicks=2)
        assert state["clicks"] == 2 and state["saved"] == "J" + text[1:]
        assert sandbox.desktop_helper is not None
        assert sandbox.desktop_helper.state == ("ready" if helper else "new")
    finally:
        await sandbox.close()


async def test_characters_off_the_keyboard_map_arrive_when_the_app_reads_its_keys_late() -> None:
    # Each "~" holds the app up (as load would) before it reads the next key: a keycode bound to
    # a character for a moment (xdotool's way) was unbound by then, and the character was lost.
    sandbox = await BubblewrapBackend().create(form_spec())
    try:
        desktop = Desktop(sandbox)
        form = await wait_for_form(sandbox)
        await desktop.click(*form["entry"])
        # 36 different characters: past Xvfb's 17 empty keycodes into those of XF86 keys
        text = "~é~日本~ßé~Ω" + "".join(chr(0x3041 + n) for n in range(31))
        await desktop.type_text(text)
        await desktop.click(*form["button"])
        async with within(30, "the app saving"):
            state = await saved_state(sandbox, clicks=1)
        assert state["saved"] == text
        assert sandbox.desktop_helper is not None and sandbox.desktop_helper.state == "ready"
    finally:
        await sandbox.close()


async def test_the_helper_screenshot_is_the_xwd_screenshot() -> None:
    from PIL import Image

    sandbox = await BubblewrapBackend().create(form_spec(width=333, height=211))
    try:
        await wait_for_form(sandbox)
        fast, slow = Desktop(sandbox), Desktop(sandbox, helper=False)
        ours, theirs = await fast.screenshot(), await slow.screenshot()
        assert sandbox.desktop_helper is not None and sandbox.desktop_helper.state == "ready"
        a, b = Image.open(io.BytesIO(ours)), Image.open(io.BytesIO(theirs))
        assert a.size == b.size == (333, 211) and a.mode == b.mode == "RGB"
        assert a.tobytes() == b.tobytes()  # pixel for pixel, the form's window included
        assert len(a.getcolors(maxcolors=1 << 24) or []) > 2  # not a blank screen
    finally:
        await sandbox.close()


async def test_a_helper_killed_in_the_sandbox_leaves_actions_working_by_exec() -> None:
    sandbox = await BubblewrapBackend().create(form_spec())
    try:
        desktop = Desktop(sandbox)
        form = await wait_for_form(sandbox)
        await desktop.cursor()  # the helper is up and answering
        assert sandbox.desktop_helper is not None and sandbox.desktop_helper.state == "ready"
        assert sandbox._desktop is not None
        helpers = [pid for pid in descendants(sandbox._desktop.pid) if "desktop-helper" in cmdline(pid)]
        assert len(helpers) == 1
        os.kill(helpers[0], signal.SIGKILL)  # what any process of the sandbox may do
        reader, _ = sandbox.desktop_helper._connection.result()
        async with within(30, "the host seeing the helper's end"):
            assert await reader.read() == b""
        await desktop.click(*form["button"])  # known gone: nothing is sent, it runs as one exec
        async with within(30, "the app saving"):
            await saved_state(sandbox, clicks=1)
        assert sandbox.desktop_helper.state == "broken"
        assert await desktop.cursor() == tuple(form["button"])
    finally:
        await sandbox.close()


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.mark.parametrize("helper", [True, False], ids=["helper", "exec-per-action"])
async def test_every_pointer_action_ends_where_it_was_sent(helper: bool) -> None:
    sandbox = await BubblewrapBackend().create(SandboxSpec(desktop=DesktopSpec(width=200, height=100)))
    try:
        desktop = Desktop(sandbox, helper=helper)
        await desktop.double_click(20, 30)
        assert await desktop.cursor() == (20, 30)
        await desktop.drag(20, 30, 150, 80, button="right")
        assert await desktop.cursor() == (150, 80)
        await desktop.scroll(40, 50, dy=-3, dx=2)
        assert await desktop.cursor() == (40, 50)
        await desktop.key("shift+Tab")
        assert sandbox.desktop_helper is not None
        assert sandbox.desktop_helper.state == ("ready" if helper else "new")
    finally:
        await sandbox.close()


async def test_bad_actions_are_refused_before_anything_runs() -> None:
    sandbox = await BubblewrapBackend().create(SandboxSpec(desktop=DesktopSpec(width=200, height=100)))
    try:
        desktop = Desktop(sandbox)
        with pytest.raises(DesktopInputError, match=r"off the screen"):
            await desktop.click(200, 5)
        with pytest.raises(DesktopInputError, match=r"off the screen"):
            await desktop.drag(0, 0, 5, -1)
        with pytest.raises(DesktopInputError, match=r"unknown key 'Hyper_Return'"):
            await desktop.key("ctrl+Hyper_Return")
        with pytest.raises(DesktopInputError, match=r"unknown modifier"):
            await desktop.key("cmd+a")
        with pytest.raises(DesktopInputError, match=rf"at most {MAX_TEXT} characters"):
            await desktop.type_text("x" * (MAX_TEXT + 1))
        with pytest.raises(DesktopInputError, match=rf"at most {MAX_OFF_MAP} different non-ASCII"):
            await desktop.type_text("".join(chr(0x4E00 + n) for n in range(MAX_OFF_MAP + 1)))
        with pytest.raises(DesktopInputError, match=r"unknown mouse button"):
            await desktop.click(1, 1, "side")  # type: ignore[arg-type]
        assert await desktop.cursor() != (200, 5)
    finally:
        await sandbox.close()


async def test_the_display_is_private_to_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    # A host X socket the sandbox must not see, and a host DISPLAY it must not inherit.
    host_dir = Path("/tmp/.X11-unix")
    host_dir.mkdir(mode=0o1777, exist_ok=True)
    if host_dir.stat().st_uid == os.getuid():  # mkdir's mode is cut by the umask: make it X's
        host_dir.chmod(0o1777)  # (else a later non-root run cannot bind in the folder a root run made)
    if not os.access(host_dir, os.W_OK):
        pytest.skip(f"{host_dir} belongs to another user without X's mode 1777: no host socket to hide")
    name = f"X{9000 + os.getpid() % 900}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(host_dir / name))
    monkeypatch.setenv("DISPLAY", f":{name[1:]}")
    before = set(os.listdir(host_dir))
    try:
        backend = BubblewrapBackend()
        sandbox = await backend.create(SandboxSpec(desktop=DesktopSpec(width=200, height=100)))
        other = await backend.create(SandboxSpec(desktop=DesktopSpec(width=200, height=100)))
        try:
            result = await sandbox.exec('echo "$DISPLAY"; ls -A /tmp/.X11-unix; ls -A /tmp')
            # the helper's socket folder is the desktop session's alone, never an exec's
            assert result.stdout.split() == [":0", "X0", ".X11-unix"]
            assert set(os.listdir(host_dir)) == before  # the sandbox's X0 is not on the host
            # its socket sits under a folder other host users cannot enter
            assert (sandbox.root / "display").stat().st_mode & 0o777 == 0o700
            # two sandboxes, two displays: a click in one does not move the other's pointer
            await Desktop(sandbox).click(150, 70)
            assert await Desktop(sandbox).cursor() == (150, 70)
            assert await Desktop(other).cursor() != (150, 70)
        finally:
            await sandbox.close()
            await other.close()
    finally:
        listener.close()
        (host_dir / name).unlink()


async def test_the_agent_cannot_fill_the_host_through_the_display_socket_folder() -> None:
    # The socket folder is a host folder: the agent's execs see it read-only (connecting to the
    # socket needs no write), and the session's own writes (an app the agent drives) are capped
    # by a small tmpfs where the backend can mount one (root).
    app = "dd if=/dev/zero of=/tmp/.X11-unix/fill bs=64k count=64 2>dd.err; echo $? > dd.done"
    spec = SandboxSpec(desktop=DesktopSpec(width=160, height=120, apps=(app,)))
    backend = BubblewrapBackend()
    sandbox = await backend.create(spec)
    try:
        written = await sandbox.exec("dd if=/dev/zero of=/tmp/.X11-unix/agent bs=1M count=8")
        assert not written.ok and "Read-only file system" in written.stderr, written
        assert not (sandbox.root / "display" / "x11" / "agent").exists()
        # Control: the display works through the read-only folder.
        geometry = await sandbox.exec("xdotool getdisplaygeometry")
        assert geometry.stdout.split() == ["160", "120"], geometry
        done = await sandbox.exec(
            "while [ ! -e dd.done ]; do sleep 0.02; done; cat dd.done dd.err", timeout=30
        )
        assert done.ok, done
        on_host = sum(p.stat().st_size for p in (sandbox.root / "display").rglob("*") if p.is_file())
        if backend.disk_capped:
            assert on_host <= 64 * 1024, on_host
            assert done.stdout.split()[0] != "0" and "No space left" in done.stdout, done
        else:  # the documented weaker mode: no mounts, so the session's folder is not sized
            assert backend.mode().count("uncapped host folder") == 1
    finally:
        await sandbox.close()


async def test_a_failed_start_never_quotes_a_host_file_the_task_linked_as_the_x_log(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("HOST-SECRET-4711\n")
    secret.chmod(0o600)
    # The setup script (the task's) plants the X server's log as a link to a host file; the
    # session's redirect follows it inside the sandbox, where that path does not exist, so the
    # X server never starts and the start-up error quotes "its log".
    setup = f"mkdir -p .rllm-desktop && ln -s {secret} .rllm-desktop/xvfb.log\n"
    spec = SandboxSpec(setup=setup, desktop=DesktopSpec(width=160, height=120))
    with pytest.raises(SandboxError) as failed:
        await BubblewrapBackend().create(spec)
    message = str(failed.value)
    assert "HOST-SECRET-4711" not in message
    assert "X server log: (not read:" in message and "link" in message, message
