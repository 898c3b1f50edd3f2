"""The desktop helper: one long-lived process per sandbox desktop that takes input and screenshot
requests over a socket, so an action costs a round trip instead of starting xdotool or xwd.

This file is a standalone program (standard library only, no rllm import): the sandbox backend
copies it into the sandbox and runs it there with the system's ``python3 -I -S`` on the
sandbox's display, with the path of a unix socket the host listens on as its argument (the
helper connects; requests and replies go over that one connection). Input goes through libxdo
(xdotool's own library: its key names, its typing of ASCII) and XTest (characters off the keyboard
map, each through a spare keycode bound to it for good: ``_OffMapKeys``), screenshots through the X
server (``XShmGetImage`` into a shared memory segment where MIT-SHM is there, else
``XGetImage`` of the root window); all are loaded with ctypes from the system, which has them
wherever xdotool is installed.

Wire format (the host side, with its bounds and checks, is ``rllm.sdk.desktop_channel``):

- requests, host to helper: one JSON object per line, ``{"id": n, "op": ..., ...}``;
- replies, helper to host: a header ``>4sIBI`` (magic ``RDH1``, the request's id, status 0 ok /
  1 failed, payload length), then the payload (the error message when failed). Before any
  request the helper sends a hello (id 0): status 0 when it holds the display, else 1 and why.

A screenshot's payload is eight big-endian uint32s (width, height, bytes per line, bits per
pixel, red, green and blue masks, byte order: 0 LSB first) and the image rows.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import socket
import struct
import sys
import time
from typing import Any

MAGIC = b"RDH1"
HEADER = struct.Struct(">4sIBI")
SHOT_HEADER = struct.Struct(">8I")
MAX_REQUEST = 256 * 1024  # bytes in one request line (type_text's limit is far below)
CURRENTWINDOW = 0
ZPIXMAP = 2
RUNS = re.compile(r"[\x00-\x7f]+|[^\x00-\x7f]+")  # ASCII and not
ALL_PLANES = ctypes.c_ulong(-1).value


class XImage(ctypes.Structure):
    # The leading fields of Xlib's XImage (a stable ABI); the image is only read through a pointer.
    _fields_ = [
        ("width", ctypes.c_int),
        ("height", ctypes.c_int),
        ("xoffset", ctypes.c_int),
        ("format", ctypes.c_int),
        ("data", ctypes.c_void_p),
        ("byte_order", ctypes.c_int),
        ("bitmap_unit", ctypes.c_int),
        ("bitmap_bit_order", ctypes.c_int),
        ("bitmap_pad", ctypes.c_int),
        ("depth", ctypes.c_int),
        ("bytes_per_line", ctypes.c_int),
        ("bits_per_pixel", ctypes.c_int),
        ("red_mask", ctypes.c_ulong),
        ("green_mask", ctypes.c_ulong),
        ("blue_mask", ctypes.c_ulong),
    ]


class _Failed(Exception):  # (a standalone program: no rllm error classes here)
    """One request failed; its message goes back to the host and the helper carries on."""


def _load() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    x11 = ctypes.CDLL("libX11.so.6")
    xdo = ctypes.CDLL("libxdo.so.3")
    vp, ul, i = ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int
    x11.XOpenDisplay.restype, x11.XOpenDisplay.argtypes = vp, [ctypes.c_char_p]
    x11.XDefaultRootWindow.restype, x11.XDefaultRootWindow.argtypes = ul, [vp]
    x11.XDisplayWidth.restype, x11.XDisplayWidth.argtypes = i, [vp, i]
    x11.XDisplayHeight.restype, x11.XDisplayHeight.argtypes = i, [vp, i]
    x11.XSync.restype, x11.XSync.argtypes = i, [vp, i]
    x11.XGetImage.restype = ctypes.POINTER(XImage)
    x11.XGetImage.argtypes = [vp, ul, i, i, ctypes.c_uint, ctypes.c_uint, ul, i]
    x11.XDestroyImage.restype, x11.XDestroyImage.argtypes = i, [ctypes.POINTER(XImage)]
    x11.XSetErrorHandler.restype, x11.XSetErrorHandler.argtypes = vp, [vp]
    xdo.xdo_new_with_opened_display.restype = vp
    xdo.xdo_new_with_opened_display.argtypes = [vp, ctypes.c_char_p, i]
    xdo.xdo_move_mouse.restype, xdo.xdo_move_mouse.argtypes = i, [vp, i, i, i]
    for name in ("xdo_mouse_down", "xdo_mouse_up"):
        getattr(xdo, name).restype, getattr(xdo, name).argtypes = i, [vp, ul, i]
    xdo.xdo_get_mouse_location.restype = i
    xdo.xdo_get_mouse_location.argtypes = [vp, *([ctypes.POINTER(i)] * 3)]
    for name in ("xdo_enter_text_window", "xdo_send_keysequence_window"):
        getattr(xdo, name).restype = i
        getattr(xdo, name).argtypes = [vp, ul, ctypes.c_char_p, ctypes.c_uint]
    x11.XDisplayKeycodes.restype = i
    x11.XDisplayKeycodes.argtypes = [vp, ctypes.POINTER(i), ctypes.POINTER(i)]
    x11.XGetKeyboardMapping.restype = ctypes.POINTER(ul)
    x11.XGetKeyboardMapping.argtypes = [vp, ctypes.c_ubyte, i, ctypes.POINTER(i)]
    x11.XChangeKeyboardMapping.restype = i
    x11.XChangeKeyboardMapping.argtypes = [vp, i, i, ctypes.POINTER(ul), i]
    x11.XFree.restype, x11.XFree.argtypes = i, [vp]
    return x11, xdo


class Helper:
    """The display and libxdo, opened once; ``handle`` runs one request."""

    def __init__(self) -> None:
        self.x11, self.xdo = _load()
        self.errors: list[int] = []
        self._image: Any = None
        self._shm: _SharedImage | None = None
        self._shm_tried = False
        # Xlib's default error handler ends the process; this one records the error for the reply.
        self._on_error = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(self._x_error)
        self.x11.XSetErrorHandler(ctypes.cast(self._on_error, ctypes.c_void_p))
        self.dpy = self.x11.XOpenDisplay(None)
        if not self.dpy:
            raise _Failed(f"cannot open display {os.environ.get('DISPLAY', '(DISPLAY unset)')}")
        self.handle_xdo = self.xdo.xdo_new_with_opened_display(self.dpy, None, 0)
        if not self.handle_xdo:
            raise _Failed("libxdo could not use the display")
        self.root = self.x11.XDefaultRootWindow(self.dpy)
        self.width = self.x11.XDisplayWidth(self.dpy, 0)
        self.height = self.x11.XDisplayHeight(self.dpy, 0)
        self.keys = _OffMapKeys(self.x11, self.dpy)

    def _x_error(self, _display: int, event: int) -> int:
        # XErrorEvent: int type; Display*; XID; unsigned long serial; unsigned char error_code
        self.errors.append(ctypes.string_at(event + 32, 1)[0] if event else 0)
        return 0

    def handle(self, request: dict[str, object]) -> list[bytes | memoryview]:
        op = request.get("op")
        method = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if method is None:
            raise _Failed(f"unknown op {op!r}")
        self.errors.clear()
        payload = method(request)
        self.x11.XSync(self.dpy, 0)  # the server has handled (and sent on) every event on reply
        if self.errors:
            raise _Failed(f"X error code {self.errors[0]} during {op}")
        return payload

    # ------------------------------------------------------------------ ops
    def op_cursor(self, _request: dict[str, object]) -> list[bytes | memoryview]:
        x, y, screen = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        self._check(self.xdo.xdo_get_mouse_location(self.handle_xdo, x, y, screen), "cursor")
        return [f"{x.value} {y.value}".encode()]

    def op_click(self, request: dict[str, object]) -> list[bytes | memoryview]:
        self._move(request, "x", "y")
        button, repeat = _int(request, "button"), _int(request, "repeat", 1)
        delay = _int(request, "delay_ms", 0) / 1000
        for n in range(repeat):
            if n:
                time.sleep(delay)
            self._press(button)
        return []

    def op_drag(self, request: dict[str, object]) -> list[bytes | memoryview]:
        button = _int(request, "button")
        self._move(request, "x1", "y1")
        self._check(self.xdo.xdo_mouse_down(self.handle_xdo, CURRENTWINDOW, button), "mouse down")
        self._move(request, "x2", "y2")
        self._check(self.xdo.xdo_mouse_up(self.handle_xdo, CURRENTWINDOW, button), "mouse up")
        return []

    def op_scroll(self, request: dict[str, object]) -> list[bytes | memoryview]:
        self._move(request, "x", "y")
        for steps, back, forward in ((_int(request, "dy"), 4, 5), (_int(request, "dx"), 6, 7)):
            for _ in range(abs(steps)):
                self._press(forward if steps > 0 else back)
        return []

    def op_type(self, request: dict[str, object]) -> list[bytes | memoryview]:
        text = request.get("text")
        if not isinstance(text, str) or "\0" in text:
            raise _Failed("type: text must be a string without NUL")
        for run in RUNS.findall(text):
            if run.isascii():  # on the keyboard map: libxdo finds each key (and its shift)
                code = self.xdo.xdo_enter_text_window(self.handle_xdo, CURRENTWINDOW, run.encode(), 0)
                self._check(code, "type")
            else:
                self.keys.type(run)
        return []

    def op_key(self, request: dict[str, object]) -> list[bytes | memoryview]:
        combo = request.get("combo")
        if not isinstance(combo, str) or "\0" in combo:
            raise _Failed("key: combo must be a string")
        code = self.xdo.xdo_send_keysequence_window(self.handle_xdo, CURRENTWINDOW, combo.encode(), 0)
        self._check(code, "key")
        return []

    def op_shot(self, _request: dict[str, object]) -> list[bytes | memoryview]:
        self.release()
        if self._shm is None and not self._shm_tried:
            self._shm_tried = True
            self._shm = _SharedImage.make(self)  # None where MIT-SHM is not there
        if self._shm is not None and self._shm.grab(self):
            image = self._shm.image
        else:
            image = self.x11.XGetImage(
                self.dpy, self.root, 0, 0, self.width, self.height, ALL_PLANES, ZPIXMAP
            )
            if not image:
                raise _Failed("XGetImage of the root window failed")
            self._image = image  # freed after the reply is written: its rows are sent without a copy
        im = image.contents
        head = SHOT_HEADER.pack(
            im.width,
            im.height,
            im.bytes_per_line,
            im.bits_per_pixel,
            im.red_mask & 0xFFFFFFFF,
            im.green_mask & 0xFFFFFFFF,
            im.blue_mask & 0xFFFFFFFF,
            im.byte_order,
        )
        rows = (ctypes.c_char * (im.bytes_per_line * im.height)).from_address(im.data)
        return [head, memoryview(rows).cast("B")]

    def release(self) -> None:
        """Free the last screenshot's image."""
        if self._image is not None:
            self.x11.XDestroyImage(self._image)
            self._image = None

    # ------------------------------------------------------------------ helpers
    def _move(self, request: dict[str, object], kx: str, ky: str) -> None:
        x, y = _int(request, kx), _int(request, ky)
        if not (0 <= x < self.width and 0 <= y < self.height):
            raise _Failed(f"point ({x}, {y}) is off the screen")
        self._check(self.xdo.xdo_move_mouse(self.handle_xdo, x, y, 0), "mouse move")

    def _press(self, button: int) -> None:
        # xdo_click_window sleeps 12 ms between press and release; X needs no pause between them.
        self._check(self.xdo.xdo_mouse_down(self.handle_xdo, CURRENTWINDOW, button), "mouse down")
        self._check(self.xdo.xdo_mouse_up(self.handle_xdo, CURRENTWINDOW, button), "mouse up")

    @staticmethod
    def _check(code: int, what: str) -> None:
        if code != 0:
            raise _Failed(f"libxdo {what} failed (code {code})")


class _OffMapKeys:
    """Characters missing from the keyboard map, typed through spare keycodes (those bound to no
    keysym, or only to XF86 media keys no action can press) that stay bound to them.

    xdotool binds a scratch keycode, sends the key and unbinds it 12 ms later; but an app reads
    the new map only when it looks the key up (Xlib refetches it lazily after a MappingNotify), so
    an app that gets to the key after the unbind reads nothing: text was lost under load. Here a
    binding is made before its key is sent (the server handles the requests of one connection in
    order, so every client gets the MappingNotify before the key) and is not undone, so whenever
    the app looks the key up, the map has it. A binding is reused only when every spare keycode
    is taken, least recently used first and never one the text being typed needs; a text with more
    different such characters than there are spare keycodes is refused. (Only an app that had not
    read a key by the time its keycode was reused, at least ``len(spare)`` minus one text's
    characters later, could still misread it; ``rllm.sdk.desktop`` allows MAX_OFF_MAP per text.)"""

    def __init__(self, x11: ctypes.CDLL, dpy: int) -> None:
        self.x11, self.dpy = x11, dpy
        self.xtst = ctypes.CDLL("libXtst.so.6")
        self.xtst.XTestFakeKeyEvent.restype = ctypes.c_int
        self.xtst.XTestFakeKeyEvent.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_ulong]
        low, high = ctypes.c_int(), ctypes.c_int()
        x11.XDisplayKeycodes(dpy, low, high)
        per = ctypes.c_int()
        count = high.value - low.value + 1
        syms = x11.XGetKeyboardMapping(dpy, low.value, count, per)
        if not syms:
            raise _Failed("could not read the keyboard map")
        try:
            rows = [[syms[n * per.value + level] for level in range(per.value)] for n in range(count)]
        finally:
            x11.XFree(syms)
        empty = [low.value + n for n, row in enumerate(rows) if not any(row)]
        # Keys bound only to vendor keysyms (XF86's media and launch keys, which no action can
        # press) are spare too: Xvfb's map has 18 empty keycodes but 91 such.
        vendor = [low.value + n for n, row in enumerate(rows) if any(row) and all(_vendor(s) for s in row)]
        # libxdo takes the lowest empty keycode as its scratch (for keys it cannot find): not ours.
        self.spare = empty[1:] + vendor
        self.bound: dict[int, int] = {}  # keysym -> keycode, least recently used first

    def type(self, text: str) -> None:
        needed = {_keysym(char) for char in text}
        if len(needed) > len(self.spare):
            raise _Failed(
                f"type: {len(needed)} different characters off the keyboard map in one text, "
                f"at most {len(self.spare)}"
            )
        for char in text:
            keysym = _keysym(char)
            code = self.bound.pop(keysym, None)
            if code is None:
                code = self._bind(keysym, needed)
            self.bound[keysym] = code  # now the most recently used
            for press in (1, 0):
                if not self.xtst.XTestFakeKeyEvent(self.dpy, code, press, 0):
                    raise _Failed("XTest could not send a key")

    def _bind(self, keysym: int, needed: set[int]) -> int:
        taken = set(self.bound.values())
        free = [code for code in self.spare if code not in taken]
        if free:
            code = free[0]
        else:  # reuse the least recently used binding this text does not need
            old = next(sym for sym in self.bound if sym not in needed)
            code = self.bound.pop(old)
        # The keysym on both shift levels: the character whatever the modifiers' state.
        syms = (ctypes.c_ulong * 2)(keysym, keysym)
        self.x11.XChangeKeyboardMapping(self.dpy, code, 2, syms, 1)
        return code


def _vendor(keysym: int) -> bool:
    return keysym == 0 or 0x1008FF00 <= keysym <= 0x1008FFFF


def _keysym(char: str) -> int:
    """The X keysym of a character: Latin-1 ones are their own code, others Unicode keysyms."""
    point = ord(char)
    if 0x20 <= point < 0x7F or 0xA0 <= point < 0x100:
        return point
    return 0x01000000 | point


class _ShmSegmentInfo(ctypes.Structure):
    _fields_ = [
        ("shmseg", ctypes.c_ulong),
        ("shmid", ctypes.c_int),
        ("shmaddr", ctypes.c_void_p),
        ("readOnly", ctypes.c_int),
    ]


class _SharedImage:
    """A screen-sized image in a SysV shared memory segment the X server writes into (MIT-SHM):
    a screenshot then costs the server one copy, not a stream of the pixels over the socket.
    The segment is marked for removal once both sides hold it, so it goes when they do."""

    def __init__(self, xext: ctypes.CDLL, info: _ShmSegmentInfo, image: Any) -> None:
        self.xext, self.info, self.image = xext, info, image

    @classmethod
    def make(cls, helper: Helper) -> _SharedImage | None:
        try:
            xext, libc = ctypes.CDLL("libXext.so.6"), ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
        vp, i = ctypes.c_void_p, ctypes.c_int
        xext.XShmQueryExtension.restype, xext.XShmQueryExtension.argtypes = i, [vp]
        xext.XShmCreateImage.restype = ctypes.POINTER(XImage)
        xext.XShmCreateImage.argtypes = [vp, vp, ctypes.c_uint, i, vp, vp, ctypes.c_uint, ctypes.c_uint]
        xext.XShmAttach.restype, xext.XShmAttach.argtypes = i, [vp, vp]
        xext.XShmGetImage.restype = i
        xext.XShmGetImage.argtypes = [vp, ctypes.c_ulong, ctypes.POINTER(XImage), i, i, ctypes.c_ulong]
        libc.shmget.restype, libc.shmget.argtypes = i, [i, ctypes.c_size_t, i]
        libc.shmat.restype, libc.shmat.argtypes = vp, [i, vp, i]
        libc.shmctl.restype, libc.shmctl.argtypes = i, [i, i, vp]
        x11 = helper.x11
        x11.XDefaultVisual.restype, x11.XDefaultVisual.argtypes = vp, [vp, i]
        x11.XDefaultDepth.restype, x11.XDefaultDepth.argtypes = i, [vp, i]
        if not xext.XShmQueryExtension(helper.dpy):
            return None
        info = _ShmSegmentInfo()
        visual, depth = x11.XDefaultVisual(helper.dpy, 0), x11.XDefaultDepth(helper.dpy, 0)
        image = xext.XShmCreateImage(
            helper.dpy, visual, depth, ZPIXMAP, None, ctypes.byref(info), helper.width, helper.height
        )
        if not image:
            return None
        size = image.contents.bytes_per_line * image.contents.height
        info.shmid = libc.shmget(0, size, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
        if info.shmid < 0:
            x11.XDestroyImage(image)
            return None
        address = libc.shmat(info.shmid, None, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            libc.shmctl(info.shmid, 0, None)  # IPC_RMID
            x11.XDestroyImage(image)
            return None
        info.shmaddr = address
        image.contents.data = address
        helper.errors.clear()
        attached = xext.XShmAttach(helper.dpy, ctypes.byref(info))
        x11.XSync(helper.dpy, 0)
        libc.shmctl(info.shmid, 0, None)  # IPC_RMID: gone once the server and this process are
        if not attached or helper.errors:
            return None  # (a server that cannot attach: XGetImage it is; the segment goes with us)
        return cls(xext, info, image)

    def grab(self, helper: Helper) -> bool:
        """The root window into the shared image; False when the server refused."""
        helper.errors.clear()
        ok = self.xext.XShmGetImage(helper.dpy, helper.root, self.image, 0, 0, ALL_PLANES)
        helper.x11.XSync(helper.dpy, 0)
        return bool(ok) and not helper.errors


def _int(request: dict[str, object], key: str, default: int | None = None) -> int:
    value = request.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**31) < value < 2**31:
        raise _Failed(f"{key} must be an integer, got {value!r}")
    return value


def _send(out: int, number: int, ok: bool, parts: list[bytes | memoryview]) -> None:
    length = sum(len(part) for part in parts)
    todo = [memoryview(HEADER.pack(MAGIC, number, 0 if ok else 1, length)), *map(memoryview, parts)]
    while todo:  # writev without copying the rows; the socket may take part of it at a time
        written = os.writev(out, todo)
        while todo and written >= len(todo[0]):
            written -= len(todo[0])
            todo.pop(0)
        if todo and written:
            todo[0] = todo[0][written:]


def main() -> None:
    # Connected first, so even a helper that cannot work says why.
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(sys.argv[1])
    with contextlib.suppress(OSError):  # fewer wake-ups per screenshot (as large as allowed)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    out = conn.fileno()
    try:
        helper = Helper()
    except (OSError, AttributeError, _Failed) as exc:  # no libxdo, no display: say so, end
        _send(out, 0, False, [f"the desktop helper cannot start: {exc}".encode()])
        return
    _send(out, 0, True, [b"ok"])
    requests = conn.makefile("rb")
    while line := requests.readline(MAX_REQUEST):
        try:
            request = json.loads(line)
        except ValueError:
            request = None
        number = request.get("id") if isinstance(request, dict) else None
        if not isinstance(request, dict) or not isinstance(number, int) or not 0 < number < 2**32:
            _send(out, 0, False, [b"malformed request line"])  # id 0: the host drops the helper
            return
        try:
            _send(out, number, True, helper.handle(request))
        except _Failed as exc:
            _send(out, number, False, [str(exc).encode()])
        helper.release()


if __name__ == "__main__":
    main()
