"""Command harnesses: train an agent that is a program, not a Python function.

``command_flow(argv)`` is a flow that starts ``argv`` as a process for every rollout, with the
rollout's gateway session as its OpenAI endpoint (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``), so
any harness that reads those variables (a CLI coding agent, a bash script with ``curl``) is
trained unchanged: the gateway captures its LLM calls with their token ids like any flow's.

The process gets, besides the engine's own environment and ``env``:

- ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``: the session's URL and token; ``OPENAI_MODEL`` and
  ``RLLM_MODEL``: the model name to send;
- ``RLLM_TASK_FILE``: a file holding the agent's view of the task as JSON
  (``rllm.types.agent_view``: its id, instruction and the metadata that is not grader-only; never
  its ground truth, hidden tests or reference solution), also in ``RLLM_TASK`` up to 64 KiB (an
  environment variable is limited to 128 KiB); ``RLLM_TASK_ID``; ``RLLM_SAMPLING``: the
  sampling settings as JSON; ``RLLM_WORKDIR``: a fresh empty directory for this rollout (its
  working directory unless ``cwd`` is given), removed afterwards.

``{instruction}``, ``{task_id}`` and ``{workdir}`` in ``argv`` (and in ``answer_from``'s path)
are replaced by the task's text, id and that directory; other braces are left alone.

The answer is the process's stdout (``answer_from="stdout"``) or a file it wrote
(``"file:PATH"``). Exit status, signal, the tails of stdout and stderr and the duration go on
the episode (``metadata["command"]``, ``metrics["command_s"]``). A non-zero exit ends the
rollout as ``agent_error`` and running past ``timeout_s`` as ``timeout`` (a :class:`CommandError`
carrying that termination reason and those details). The process runs in a session (process
group) of its own, and whatever way the rollout ends (exit, error, timeout, the engine's
deadline cancelling it) the whole tree is killed: the process group, and on Linux also every
descendant that left it (``setsid``, double forks), found by a per-rollout token in its
environment.

``sandbox=SandboxSpec(...)`` (or ``task -> SandboxSpec``) runs the process inside the rollout's
sandbox instead (``rllm.sdk.command_sandbox``): one exec there, whose PID namespace takes the whole
tree down with it, reaching only its own session through the sandbox's gateway bridge.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from rllm.sdk.flow import RolloutFlow
from rllm.sdk.sandbox import SpecSource, current_sandbox, needs_sandbox
from rllm.types import AgentConfig, Episode, Task, TerminationReason, agent_view
from rllm.types.errors import RLLMError, UsageError

_PLACEHOLDER = re.compile(r"\{(instruction|task_id|workdir)\}")
_TOKEN_VAR = "RLLM_COMMAND_ID"
TAIL_CHARS = 2000  # of stdout / stderr kept on the episode
MAX_CAPTURE = 1 << 20  # bytes of stdout kept for the answer; the rest is dropped, counted
MAX_ENV_TASK = 64 << 10  # a task's JSON up to this size is also in RLLM_TASK


class CommandError(RLLMError, RuntimeError):
    """A command harness failed: exited non-zero, was killed by a signal, ran past its timeout,
    or wrote no answer. ``termination_reason`` is the episode's; ``details`` goes on
    ``episode.metadata["command"]`` (the engine copies ``episode_metadata``)."""

    def __init__(
        self, message: str, *, termination_reason: TerminationReason, details: dict[str, Any]
    ) -> None:
        super().__init__(message)
        self.termination_reason = termination_reason
        self.details = details
        self.episode_metadata = {"command": details}


class CommandFlow(RolloutFlow):
    """The flow ``command_flow`` returns; picklable (for flow processes) by its arguments."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        answer_from: str = "stdout",
        timeout_s: float | None = None,
        name: str | None = None,
        sandbox: SpecSource | None = None,
    ) -> None:
        argv = list(argv)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise UsageError(f"command_flow needs a non-empty list of strings as argv, got {argv!r}")
        if answer_from != "stdout" and not (answer_from.startswith("file:") and len(answer_from) > 5):
            raise UsageError(f"answer_from must be 'stdout' or 'file:PATH', got {answer_from!r}")
        if timeout_s is not None and timeout_s <= 0:
            raise UsageError(f"command_flow timeout_s must be > 0 or None, got {timeout_s}")
        self.argv = argv
        self.env = dict(env or {})
        self.cwd = None if cwd is None else str(cwd)
        self.answer_from = answer_from
        self.timeout_s = timeout_s
        self.sandbox = sandbox

        async def run(task: Task, config: AgentConfig) -> Episode:
            return await run_command(self, task, config)

        run.__name__ = run.__qualname__ = name or Path(argv[0]).name
        super().__init__(run, name=name or Path(argv[0]).name)
        if sandbox is not None:
            needs_sandbox(sandbox)(self)  # the engine leases one per rollout, as for any flow

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = {
            "env": self.env,
            "cwd": self.cwd,
            "answer_from": self.answer_from,
            "timeout_s": self.timeout_s,
            "sandbox": self.sandbox,
        }
        return (_rebuild, (self.argv, kwargs, self.name))

    def __repr__(self) -> str:
        return f"<command flow {self.argv!r}>"


def _rebuild(argv: list[str], kwargs: dict[str, Any], name: str) -> CommandFlow:
    return CommandFlow(argv, name=name, **kwargs)


def command_flow(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    answer_from: str = "stdout",
    timeout_s: float | None = None,
    name: str | None = None,
    sandbox: SpecSource | None = None,
) -> CommandFlow:
    """A flow that runs ``argv`` as a process per rollout (see the module docstring).

    ``env`` is added to the engine's environment (the session variables win); ``cwd`` defaults
    to the rollout's fresh ``{workdir}``; ``timeout_s`` (None: only the engine's deadline)
    bounds the process, whose tree is then killed and the rollout ends as ``timeout``.
    ``sandbox`` (a ``SandboxSpec`` or ``task -> SandboxSpec``) runs the process inside the
    rollout's sandbox instead, reaching its session through a bridge (``rllm.sdk.command_sandbox``).
    """
    return CommandFlow(
        argv, env=env, cwd=cwd, answer_from=answer_from, timeout_s=timeout_s, name=name, sandbox=sandbox
    )


def task_json(task: Task) -> bytes:
    """What a harness is given of ``task`` (``RLLM_TASK``, ``RLLM_TASK_FILE``): the agent's view
    as JSON. The engine already hands flows that view; taking it again here keeps a harness run
    outside the engine from ever receiving the grader's part."""
    return msgspec.json.encode(agent_view(task))


def instruction_text(task: Task) -> str:
    """The task's instruction as text (the text blocks of a multimodal one, joined)."""
    if isinstance(task.instruction, str):
        return task.instruction
    return "\n".join(
        str(getattr(block, "text", "")) for block in task.instruction if getattr(block, "text", None)
    )


def fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with ``{instruction}``, ``{task_id}`` and ``{workdir}`` replaced."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _read_log(path: Path) -> tuple[str, str, int]:
    """A captured stream: its first MAX_CAPTURE bytes as text, its tail, and the bytes dropped."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(MAX_CAPTURE)
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - 4 * TAIL_CHARS))
            tail = fh.read()
    except OSError:
        return "", "", 0
    text = head.decode("utf-8", "replace")
    return text, tail.decode("utf-8", "replace")[-TAIL_CHARS:], max(0, size - MAX_CAPTURE)


async def run_command(flow: CommandFlow, task: Task, config: AgentConfig) -> Episode:
    """One rollout of ``flow``: start, wait (bounded), kill the tree, read the answer.

    stdout and stderr go to files, not pipes: a child the harness left behind may hold them open,
    and waiting for a pipe's end would wait for that child."""
    if flow.sandbox is not None:
        from rllm.sdk.command_sandbox import run_in_sandbox  # late: it imports this module

        return await run_in_sandbox(flow, task, config, current_sandbox())
    root = Path(tempfile.mkdtemp(prefix="rllm-cmd-"))
    workdir = root / "work"
    workdir.mkdir()
    token = uuid.uuid4().hex
    values = {"instruction": instruction_text(task), "task_id": task.id, "workdir": str(workdir)}
    argv = [fill(a, values) for a in flow.argv]
    cwd = str(workdir) if flow.cwd is None else fill(flow.cwd, values)
    task_doc = task_json(task)
    (root / "task.json").write_bytes(task_doc)
    env = {
        **os.environ,
        **flow.env,
        "OPENAI_BASE_URL": config.base_url,
        "OPENAI_API_KEY": config.api_key,
        "OPENAI_MODEL": config.model,
        "RLLM_MODEL": config.model,
        "RLLM_TASK_FILE": str(root / "task.json"),
        "RLLM_TASK_ID": task.id,
        "RLLM_SAMPLING": msgspec.json.encode(config.sampling).decode(),
        "RLLM_WORKDIR": str(workdir),
        _TOKEN_VAR: token,
    }
    if len(task_doc) <= MAX_ENV_TASK:  # Linux refuses one variable over 128 KiB (E2BIG)
        env["RLLM_TASK"] = task_doc.decode()
    started = time.monotonic()
    details: dict[str, Any] = {"argv": argv}
    proc: asyncio.subprocess.Process | None = None
    try:
        with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=cwd,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # its own process group, killed as a whole
                )
            except OSError as exc:  # not found, not executable, arguments too long, ...
                raise CommandError(
                    f"command {argv[0]!r} cannot be started: {exc.strerror or exc}",
                    termination_reason=TerminationReason.AGENT_ERROR,
                    details=details,
                ) from None
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), flow.timeout_s)
        except TimeoutError:
            timed_out = True
        finally:
            # Also after a clean exit: children it left behind (``cmd &``) must not outlive it.
            details["killed_leftovers"] = kill_tree(proc.pid, token)
        await proc.wait()  # reaps it after a timeout's SIGKILL
        stdout, stdout_tail, dropped = _read_log(root / "stdout")
        _, stderr_tail, _ = _read_log(root / "stderr")
        details.update(
            exit_code=proc.returncode,
            duration_s=time.monotonic() - started,
            stdout_tail=stdout_tail,
            stderr_tail=stderr_tail,
        )
        if dropped:
            details["stdout_dropped_bytes"] = dropped
        if timed_out:
            raise CommandError(
                f"command {argv[0]!r} ran past its {flow.timeout_s:g} s timeout; its process tree was killed",
                termination_reason=TerminationReason.TIMEOUT,
                details=details,
            )
        if proc.returncode != 0:
            code = proc.returncode
            how = (
                f"was killed by signal {-code}"
                if code is not None and code < 0
                else f"exited with status {code}"
            )
            last = stderr_tail.strip().splitlines()[-1:] or [""]
            raise CommandError(
                f"command {argv[0]!r} {how}" + (f": {last[0][:200]}" if last[0] else ""),
                termination_reason=TerminationReason.AGENT_ERROR,
                details=details,
            )
        answer = stdout.strip() if flow.answer_from == "stdout" else _answer_file(flow, values, cwd, details)
        return Episode(
            task_id=task.id,
            artifacts={"answer": answer},
            metadata={"command": details},
            metrics={"command_s": details["duration_s"]},
        )
    finally:
        if proc is not None and proc.returncode is None:  # cancelled (the engine's deadline)
            kill_tree(proc.pid, token)
        shutil.rmtree(root, ignore_errors=True)


def _answer_file(flow: CommandFlow, values: Mapping[str, str], cwd: str, details: dict[str, Any]) -> str:
    path = Path(cwd) / fill(flow.answer_from[len("file:") :], values)
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError as exc:
        raise CommandError(
            f"command {flow.argv[0]!r} wrote no answer file {str(path)!r}: {exc.strerror}",
            termination_reason=TerminationReason.AGENT_ERROR,
            details=details,
        ) from None


def kill_tree(pid: int, token: str) -> int:
    """SIGKILL the process group ``pid`` leads and every process carrying ``token`` in its
    environment; returns how many processes besides ``pid`` itself were still running."""
    seen = set(processes_with_token(token))
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    # A sweep can race a fork of a process not yet killed, and SIGKILL lands asynchronously:
    # sweep until one finds nothing running (bounded: a process we may not kill stays).
    give_up = time.monotonic() + 2.0
    while (found := processes_with_token(token)) and time.monotonic() < give_up:
        for p in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        seen.update(found)
        time.sleep(0.002)
    seen.discard(pid)
    return len(seen)


def processes_with_token(token: str) -> list[int]:
    """Live processes (of this user) whose environment holds ``RLLM_COMMAND_ID=token`` (Linux;
    elsewhere the process group is the whole tree and this finds nothing)."""
    if not sys.platform.startswith("linux"):
        return []
    needle = f"{_TOKEN_VAR}={token}".encode() + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                data = fh.read()
        except OSError:  # gone, or another user's
            continue
        if needle in data + b"\0" and _alive(int(name)):
            found.append(int(name))
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie only waits for its parent to reap it: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"
