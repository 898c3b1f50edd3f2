"""Geometry problems drawn with Pillow: right triangles, triangle angles, circles, triangle areas.

Each problem is a labelled diagram (the numbers needed to solve it appear only in the picture),
a question and the exact answer in LaTeX that math-verify grades (``5``, ``\\sqrt{41}``,
``25\\pi``).
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Callable

from PIL import Image, ImageDraw, ImageFont

SIZE = 256
Point = tuple[float, float]
Problem = tuple[str, str, bytes]  # question, answer, PNG bytes


def _canvas() -> tuple[Image.Image, ImageDraw.ImageDraw, ImageFont.FreeTypeFont | ImageFont.ImageFont]:
    img = Image.new("L", (SIZE, SIZE), 255)  # greyscale keeps the PNGs small
    return img, ImageDraw.Draw(img), ImageFont.load_default(size=16)


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def _label(draw: ImageDraw.ImageDraw, font, at: Point, text: str) -> None:
    draw.text(at, text, fill=0, font=font, anchor="mm")


def _midpoint_out(a: Point, b: Point, centre: Point, offset: float = 16) -> Point:
    """A point beside the middle of segment ab, on the side away from ``centre``."""
    mx, my = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
    dx, dy = mx - centre[0], my - centre[1]
    norm = math.hypot(dx, dy) or 1.0
    return mx + dx / norm * offset, my + dy / norm * offset


def _sqrt_latex(n: int) -> str:
    """sqrt(n) simplified: 5, 2\\sqrt{3}, \\sqrt{41}."""
    outer, inner = 1, n
    for k in range(math.isqrt(n), 1, -1):
        if inner % (k * k) == 0:
            outer, inner = outer * k, inner // (k * k)
            break
    if inner == 1:
        return str(outer)
    return f"\\sqrt{{{inner}}}" if outer == 1 else f"{outer}\\sqrt{{{inner}}}"


def _right_triangle(rng: random.Random) -> Problem:
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    img, draw, font = _canvas()
    scale = 160 / max(a, b)
    c_pt, a_pt, b_pt = (48.0, 208.0), (48.0, 208 - a * scale), (48 + b * scale, 208.0)
    draw.polygon([c_pt, a_pt, b_pt], outline=0, width=3)
    draw.rectangle([c_pt[0], c_pt[1] - 14, c_pt[0] + 14, c_pt[1]], outline=0, width=2)  # right angle
    centre = ((c_pt[0] + a_pt[0] + b_pt[0]) / 3, (c_pt[1] + a_pt[1] + b_pt[1]) / 3)
    _label(draw, font, _midpoint_out(c_pt, a_pt, centre, 18), str(a))
    _label(draw, font, _midpoint_out(c_pt, b_pt, centre, 16), str(b))
    _label(draw, font, _midpoint_out(a_pt, b_pt, centre, 16), "x")
    question = "The triangle in the diagram has a right angle. Find x, the length of the hypotenuse."
    return question, _sqrt_latex(a * a + b * b), _png(img)


def _triangle_angle(rng: random.Random) -> Problem:
    alpha, beta = rng.randint(25, 80), rng.randint(25, 80)
    img, draw, font = _canvas()
    p, q = (32.0, 200.0), (224.0, 200.0)
    # apex from the two base angles, scaled down if it leaves the canvas
    ta, tb = math.tan(math.radians(alpha)), math.tan(math.radians(beta))
    base = q[0] - p[0]
    x = base * tb / (ta + tb)
    h = min(x * ta, 170.0)
    r = (p[0] + x, p[1] - h)
    draw.polygon([p, q, r], outline=0, width=3)
    # labels on each base angle's bisector, inside the triangle
    ha, hb = math.radians(alpha) / 2, math.radians(beta) / 2
    _label(draw, font, (p[0] + 46 * math.cos(ha), p[1] - 46 * math.sin(ha)), f"{alpha}°")
    _label(draw, font, (q[0] - 46 * math.cos(hb), q[1] - 46 * math.sin(hb)), f"{beta}°")
    _label(draw, font, (r[0], r[1] + 24), "x°")
    question = "Find x, the measure in degrees of the marked angle of the triangle."
    return question, str(180 - alpha - beta), _png(img)


def _circle(rng: random.Random) -> Problem:
    r = rng.randint(2, 15)
    img, draw, font = _canvas()
    c, rad = (128.0, 128.0), 90.0
    draw.ellipse([c[0] - rad, c[1] - rad, c[0] + rad, c[1] + rad], outline=0, width=3)
    draw.ellipse([c[0] - 3, c[1] - 3, c[0] + 3, c[1] + 3], fill=0)
    draw.line([c, (c[0] + rad, c[1])], fill=0, width=2)
    _label(draw, font, (c[0] + rad / 2, c[1] - 12), str(r))
    if rng.random() < 0.5:
        return "Find the area of the circle. Give the exact answer in terms of pi.", f"{r * r}\\pi", _png(img)
    return (
        "Find the circumference of the circle. Give the exact answer in terms of pi.",
        f"{2 * r}\\pi",
        _png(img),
    )


def _triangle_area(rng: random.Random) -> Problem:
    base, height = rng.randint(3, 14), rng.randint(3, 14)
    img, draw, font = _canvas()
    scale = 170 / max(base, height)
    p, q = (40.0, 210.0), (40 + base * scale, 210.0)
    apex = (p[0] + rng.uniform(0.2, 0.8) * base * scale, 210 - height * scale)
    foot = (apex[0], 210.0)
    draw.polygon([p, q, apex], outline=0, width=3)
    draw.line([apex, foot], fill=0, width=1)  # the altitude
    draw.rectangle([foot[0], foot[1] - 10, foot[0] + 10, foot[1]], outline=0, width=1)
    _label(draw, font, ((p[0] + q[0]) / 2, 228), str(base))
    _label(draw, font, (apex[0] - 22, (apex[1] + foot[1]) / 2), str(height))
    return "Find the area of the triangle.", _fraction(base * height, 2), _png(img)


def _fraction(num: int, den: int) -> str:
    g = math.gcd(num, den)
    num, den = num // g, den // g
    return str(num) if den == 1 else f"\\frac{{{num}}}{{{den}}}"


KINDS: list[Callable[[random.Random], Problem]] = [_right_triangle, _triangle_angle, _circle, _triangle_area]


def draw_problem(rng: random.Random) -> Problem:
    """One random problem: (question, exact answer, PNG bytes)."""
    return rng.choice(KINDS)(rng)


__all__ = ["KINDS", "draw_problem"]
