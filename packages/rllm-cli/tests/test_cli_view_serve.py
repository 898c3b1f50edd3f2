"""`rllm view RUN` as the README says it behaves: it serves the run on a loopback URL it prints
on one line, opens a browser only with `--open` (the browser is $BROWSER, as Python's webbrowser
picks it: here a script that writes the URL it was given to stderr), and Ctrl-C stops it with
exit 0 and no traceback. A real subprocess; the page is fetched over loopback."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rllm.testing import read_until_line


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    # A long path: the URL line must not be wrapped at a terminal's width (stderr is a pipe here).
    run = tmp_path / ("a-run-folder-with-a-long-name-" * 3) / "run"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    return run


@pytest.fixture
def browser(tmp_path: Path) -> Path:
    script = tmp_path / "fake-browser"  # named as such: stands in for a desktop's browser
    script.write_text('#!/bin/sh\necho "browser opened: $1" >&2\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _ctrl_c_at_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a terminal starts a foreground command


def _view(run: Path, browser: Path, *flags: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "rllm.cli.main", "view", str(run), "--port", "0", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_ctrl_c_at_default,
        # No display and no terminal: $BROWSER is the only browser Python's webbrowser may try.
        env={
            **{k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "TERM")},
            "BROWSER": str(browser),
            "COLUMNS": "80",
        },
    )


@contextmanager
def _viewing(run: Path, browser: Path, *flags: str) -> Iterator[subprocess.Popen[bytes]]:
    """``rllm view`` running for the block; killed after it if the block did not stop it."""
    proc = _view(run, browser, *flags)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _url(lines: list[str], run: Path) -> str:
    line = lines[-1]
    assert line.startswith(f"viewing {run} at http://127.0.0.1:") and line.endswith("/ (Ctrl-C stops)"), lines
    return line.split(" at ", 1)[1].split(" ", 1)[0]


def _fetch(url: str) -> None:
    with urllib.request.urlopen(url, timeout=60) as page:
        assert page.status == 200 and b"<html" in page.read().lower()


def _stop(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=60)
    return proc.returncode, rest.decode(errors="replace")


def test_view_prints_the_url_and_opens_no_browser(run_dir: Path, browser: Path) -> None:
    with _viewing(run_dir, browser) as proc:  # the default is --no-open
        url = _url(read_until_line(proc, "viewing", 120), run_dir)
        _fetch(url)  # an answer: it serves, so any browser would have been opened by now
        code, rest = _stop(proc)
    assert code == 0 and "Traceback" not in rest, rest
    assert "browser opened" not in rest, rest


def test_view_open_opens_the_url_in_the_browser(run_dir: Path, browser: Path) -> None:
    with _viewing(run_dir, browser, "--open") as proc:
        url = _url(read_until_line(proc, "viewing", 120), run_dir)
        # The fake browser's line, or the warning that none could be opened (then it names why).
        lines = read_until_line(proc, "browser opened:", 60)
        assert lines[-1] == f"browser opened: {url}", lines
        _fetch(url)  # serving (the browser call has returned): Ctrl-C now stops the server
        code, rest = _stop(proc)
    assert code == 0 and "Traceback" not in rest, rest


def test_view_open_without_a_browser_says_so(run_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-browser"  # $BROWSER names nothing that runs
    with _viewing(run_dir, missing, "--open") as proc:
        url = _url(read_until_line(proc, "viewing", 120), run_dir)
        line = read_until_line(proc, "warning:", 60)[-1]
        assert "no browser could be opened" in line, line
        _fetch(url)  # still serving
        code, rest = _stop(proc)
    assert code == 0 and "Traceback" not in rest, rest
