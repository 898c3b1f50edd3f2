"""A sandbox's virtual screen as a flow drives it: screenshots and mouse/keyboard actions.

``Desktop(sandbox)`` works on any :class:`~rllm.sdk.sandbox.Sandbox` whose spec has a
``desktop`` (:class:`~rllm.sdk.sandbox.DesktopSpec`). Where the sandbox runs a desktop helper
(``sandbox.desktop_helper``, a :class:`~rllm.sdk.desktop_channel.HelperChannel`: the local
backend's do), an action is one request to that long-lived process (libxdo, xdotool's library)
and a screenshot one ``XGetImage`` through the X server; elsewhere, or once the helper is gone,
each action is one ``exec`` of xdotool on the sandbox's own display and a screenshot ``xwd``
(converted by netpbm in the sandbox). PNGs are encoded by Pillow here, off the event loop. Bad
input (a point off the screen, an unknown key, text over the size limit) raises :class:`DesktopInputError` before anything runs, so a flow can
hand the message back to the model as the tool's result.

Needs Pillow (``rllm-sdk[images]``) for screenshots.
"""

from __future__ import annotations

import asyncio
import io
import re
import zlib
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from rllm.sdk.desktop_channel import HelperChannel
from rllm.sdk.desktop_helper import SHOT_HEADER
from rllm.sdk.sandbox import DesktopSpec, Sandbox, SandboxError
from rllm.types.errors import InputError, MissingExtraError, UsageError

DISPLAY = ":0"  # each sandbox has a display of its own, so every sandbox uses the same number
SCREEN_FILE = ".rllm-desktop/screen.ppm"  # in the workdir, where read_file reaches it
MAX_TEXT = 2000  # characters one type_text may type
# Different non-ASCII characters one type_text may type: the helper binds each to a spare keycode
# of its own for good (Xvfb's map has about 100 to spare), so none of one text's is reused while typing it.
MAX_OFF_MAP = 48
T = TypeVar("T")
Button = Literal["left", "middle", "right"]
_BUTTONS = {"left": 1, "middle": 2, "right": 3}
_MODIFIERS = {
    "ctrl": "ctrl",
    "control": "ctrl",
    "alt": "alt",
    "shift": "shift",
    "super": "super",
    "meta": "meta",
}
# Named keys a model may press (X keysym names; a few common aliases map onto them).
_ALIASES = {
    "enter": "Return",
    "return": "Return",
    "tab": "Tab",
    "esc": "Escape",
    "escape": "Escape",
    "backspace": "BackSpace",
    "delete": "Delete",
    "del": "Delete",
    "space": "space",
    "up": "Up",
    "down": "Down",
    "left": "Left",
    "right": "Right",
    "home": "Home",
    "end": "End",
    "pageup": "Page_Up",
    "page_up": "Page_Up",
    "pagedown": "Page_Down",
    "page_down": "Page_Down",
    "insert": "Insert",
    **{f"f{n}": f"F{n}" for n in range(1, 13)},
}
_SINGLE = re.compile(r"^[A-Za-z0-9]$|^[-=\[\];',./`\\]$")


class DesktopInputError(InputError):
    """An action the desktop refuses (off-screen point, unknown key, text too long); nothing ran."""


class Desktop:
    """Screenshots and input for ``sandbox``'s display (its spec must have a ``desktop``).
    ``helper=False`` leaves the sandbox's desktop helper unused (one exec per action), for
    comparisons."""

    def __init__(self, sandbox: Sandbox, *, helper: bool = True) -> None:
        spec = sandbox.spec.desktop
        if spec is None:
            raise UsageError("this sandbox has no desktop: give its SandboxSpec a desktop=DesktopSpec(...)")
        self.sandbox, self.spec = sandbox, spec
        channel = getattr(sandbox, "desktop_helper", None) if helper else None
        self._channel = channel if isinstance(channel, HelperChannel) else None

    # ------------------------------------------------------------------ screen
    async def screenshot(self) -> bytes:
        """The whole screen as PNG bytes, at the display's size."""
        image = await self._capture()
        return await asyncio.to_thread(_png, image)  # Pillow lets go of the GIL: other rollouts run

    async def screenshot_block(self) -> tuple[dict[str, Any], float]:
        """The screen as an OpenAI ``image_url`` block, downscaled to ``screenshot_max`` on its
        longer side, and the scale (screen pixels per image pixel) to map a model's point back."""
        image = await self._capture()
        return await asyncio.to_thread(_block, image, self.spec.screenshot_max)

    async def _capture(self) -> Any:
        try:
            from PIL import Image
        except ImportError:
            raise MissingExtraError("screenshots need Pillow: pip install 'rllm-sdk[images]'") from None
        payload = await self._call("shot") if self.spec.depth == 24 else None
        if payload is not None:
            image = self._checked(_decode_shot, payload, self.spec, Image)
            if image is not None:
                return image
        # xwd reads the screen through the X server; xwdtopnm turns its dump into a PPM Pillow reads.
        script = f"mkdir -p .rllm-desktop && xwd -root -silent | xwdtopnm 2>/dev/null > {SCREEN_FILE}"
        await self._run(script)
        data = await self.sandbox.read_file(SCREEN_FILE)
        image = Image.open(io.BytesIO(data))
        image.load()
        return image.convert("RGB")

    async def cursor(self) -> tuple[int, int]:
        """Where the mouse pointer is."""
        reply = await self._call("cursor")
        if reply is not None:
            return self._checked(_decode_point, reply)
        out = await self._run(["xdotool", "getmouselocation", "--shell"])
        values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        try:
            return int(values["X"]), int(values["Y"])
        except (KeyError, ValueError):
            raise SandboxError(f"xdotool gave no pointer position: {out.strip()[:200]!r}") from None

    # ------------------------------------------------------------------ mouse
    async def click(self, x: int, y: int, button: Button = "left") -> None:
        """Move to (x, y) and click ``button``."""
        self._point(x, y)
        if await self._call("click", x=x, y=y, button=self._button(button)) is None:
            await self._run(["xdotool", "mousemove", str(x), str(y), "click", str(self._button(button))])

    async def double_click(self, x: int, y: int, button: Button = "left") -> None:
        self._point(x, y)
        number = self._button(button)
        if await self._call("click", x=x, y=y, button=number, repeat=2, delay_ms=60) is None:
            twice = ["click", "--repeat", "2", "--delay", "60", str(number)]
            await self._run(["xdotool", "mousemove", str(x), str(y), *twice])

    async def drag(self, x1: int, y1: int, x2: int, y2: int, button: Button = "left") -> None:
        """Press ``button`` at (x1, y1), move to (x2, y2), release."""
        self._point(x1, y1)
        self._point(x2, y2)
        number = self._button(button)
        if await self._call("drag", x1=x1, y1=y1, x2=x2, y2=y2, button=number) is None:
            press = ["mousemove", str(x1), str(y1), "mousedown", str(number)]
            await self._run(["xdotool", *press, "mousemove", str(x2), str(y2), "mouseup", str(number)])

    async def scroll(self, x: int, y: int, dy: int = 0, dx: int = 0) -> None:
        """Scroll at (x, y): ``dy`` wheel steps down (negative: up), ``dx`` right (negative: left)."""
        self._point(x, y)
        if not (-50 <= dy <= 50 and -50 <= dx <= 50):
            raise DesktopInputError(f"scroll: at most 50 steps each way, got dy={dy}, dx={dx}")
        if await self._call("scroll", x=x, y=y, dy=dy, dx=dx) is not None:
            return
        argv = ["xdotool", "mousemove", str(x), str(y)]
        for steps, negative, positive in ((dy, "4", "5"), (dx, "6", "7")):
            if steps:
                argv += ["click", "--repeat", str(abs(steps)), positive if steps > 0 else negative]
        await self._run(argv)

    # ------------------------------------------------------------------ keyboard
    async def type_text(self, text: str) -> None:
        """Type ``text`` into the focused window (newlines press Return)."""
        if not isinstance(text, str):
            raise DesktopInputError(f"type_text takes a string, got {type(text).__name__}")
        if len(text) > MAX_TEXT:
            raise DesktopInputError(f"type_text: at most {MAX_TEXT} characters at once, got {len(text)}")
        if "\0" in text:
            raise DesktopInputError("type_text: the text holds a NUL character")
        off_map = {char for char in text if not char.isascii()}
        if len(off_map) > MAX_OFF_MAP:
            raise DesktopInputError(
                f"type_text: at most {MAX_OFF_MAP} different non-ASCII characters at once, got "
                f"{len(off_map)}; type the rest in another call"
            )
        if text and await self._call("type", text=text) is None:
            # (xdotool binds a character off the keyboard map for its 12 ms delay only: without
            # the helper such characters arrive only if the app reads its keys in time.)
            delay = "0" if text.isascii() else "12"
            await self._run(["xdotool", "type", "--delay", delay, "--", text])

    async def key(self, combo: str) -> None:
        """Press a key or combination, e.g. ``Return``, ``ctrl+a``, ``shift+Tab``."""
        name = key_combo(combo)
        if await self._call("key", combo=name) is None:
            await self._run(["xdotool", "key", "--", name])

    # ------------------------------------------------------------------ helpers
    def _point(self, x: int, y: int) -> None:
        if isinstance(x, bool) or isinstance(y, bool) or not isinstance(x, int) or not isinstance(y, int):
            raise DesktopInputError(f"a point needs integer x and y, got ({x!r}, {y!r})")
        if not (0 <= x < self.spec.width and 0 <= y < self.spec.height):
            raise DesktopInputError(
                f"point ({x}, {y}) is off the screen (0..{self.spec.width - 1}, 0..{self.spec.height - 1})"
            )

    @staticmethod
    def _button(button: str) -> int:
        if button not in _BUTTONS:
            raise DesktopInputError(f"unknown mouse button {button!r} (left, middle, right)")
        return _BUTTONS[button]

    async def _call(self, op: str, **args: Any) -> bytes | None:
        """The helper's reply; None when there is no usable helper (the caller execs instead)."""
        return None if self._channel is None else await self._channel.call(op, **args)

    def _checked(self, decode: Callable[..., T], *args: Any) -> T:
        """``decode(*args)`` of a helper's reply; one that does not decode drops the helper."""
        try:
            return decode(*args)
        except SandboxError as exc:
            if self._channel is not None:
                self._channel.drop(str(exc))
            raise

    async def _run(self, cmd: str | list[str]) -> str:
        result = await self.sandbox.exec(cmd, env={"DISPLAY": DISPLAY})
        if not result.ok:
            what = cmd if isinstance(cmd, str) else " ".join(cmd[:3])
            why = "timed out" if result.timed_out else f"exit {result.exit_code}"
            raise SandboxError(f"desktop action {what!r} failed ({why}): {result.stderr.strip()[-300:]}")
        return result.stdout


def _png(image: Any) -> bytes:
    buf = io.BytesIO()
    # Fast (level 1) and run-length matching (zlib's Z_RLE): a screen's flat runs encode in about
    # two thirds of the default strategy's time, and smaller.
    image.save(buf, format="PNG", compress_level=1, compress_type=zlib.Z_RLE)
    return buf.getvalue()


def _block(image: Any, longest: int) -> tuple[dict[str, Any], float]:
    from rllm.sdk.images import image_block

    scale = max(image.size) / longest
    if scale > 1:
        image = image.resize((round(image.size[0] / scale), round(image.size[1] / scale)))
    else:
        scale = 1.0
    return image_block(_png(image)), scale


def _decode_point(reply: bytes) -> tuple[int, int]:
    x, _, y = reply.decode("ascii", "replace").partition(" ")
    if not (x.isdigit() and y.isdigit() and len(reply) < 24):
        raise SandboxError(f"the desktop helper gave no pointer position: {reply[:40]!r}")
    return int(x), int(y)


def _decode_shot(payload: bytes, spec: DesktopSpec, image_module: Any) -> Any:
    """A helper's screenshot as an RGB image; None for a pixel format read only through xwd.
    The helper is inside the sandbox: its sizes are checked against the spec, never trusted."""
    if len(payload) < SHOT_HEADER.size:
        raise SandboxError("the desktop helper sent a truncated screenshot")
    width, height, stride, bpp, red, green, blue, order = SHOT_HEADER.unpack_from(payload)
    if (width, height) != (spec.width, spec.height):
        raise SandboxError(
            f"the desktop helper sent a {width}x{height} screenshot of a {spec.width}x{spec.height} screen"
        )
    if (bpp, red, green, blue, order) != (32, 0xFF0000, 0xFF00, 0xFF, 0):
        return None
    if not width * 4 <= stride <= width * 4 + 64 or len(payload) != SHOT_HEADER.size + stride * height:
        raise SandboxError("the desktop helper's screenshot does not match its stated size")
    pixels = memoryview(payload)[SHOT_HEADER.size :]
    return image_module.frombuffer("RGB", (width, height), pixels, "raw", "BGRX", stride, 1)


def key_combo(combo: str) -> str:
    """``combo`` as xdotool's key name (``ctrl+shift+Tab``); DesktopInputError for an unknown key."""
    if not isinstance(combo, str) or not combo.strip():
        raise DesktopInputError(f"key: expected a key such as 'Return' or 'ctrl+a', got {combo!r}")
    parts = [part.strip() for part in combo.split("+")]
    *mods, last = parts
    names = []
    for mod in mods:
        if mod.lower() not in _MODIFIERS:
            raise DesktopInputError(
                f"key {combo!r}: unknown modifier {mod!r} (ctrl, alt, shift, super, meta)"
            )
        names.append(_MODIFIERS[mod.lower()])
    if _SINGLE.match(last):
        names.append(last)
    elif last.lower() in _ALIASES:
        names.append(_ALIASES[last.lower()])
    elif last in _ALIASES.values():
        names.append(last)
    else:
        raise DesktopInputError(
            f"key {combo!r}: unknown key {last!r} (a letter, digit or punctuation mark, or one of "
            f"{', '.join(sorted(set(_ALIASES.values())))})"
        )
    return "+".join(names)


__all__ = ["DISPLAY", "MAX_OFF_MAP", "MAX_TEXT", "Desktop", "DesktopInputError", "DesktopSpec", "key_combo"]
