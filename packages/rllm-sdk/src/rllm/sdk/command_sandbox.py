"""A command harness inside its rollout's sandbox (``command_flow(..., sandbox=spec)``).

The process runs as one exec of the rollout's sandbox, so the sandbox's isolation and limits
hold for it and its whole tree dies with the exec (a fresh PID namespace per exec: a timeout, an
exit or the engine's deadline kills everything it started). It reaches its session through the
sandbox's bridge (``HarnessHost.hook_up_harness``; the local backend's is
``rllm.engine.sandbox.session_bridge``): ``OPENAI_BASE_URL`` is a loopback URL inside the
sandbox that leads to that one session and nothing else, and ``OPENAI_API_KEY`` is a
placeholder (the bridge adds the session's token on the host side, so the harness never holds
it). ``RLLM_TASK_FILE`` is a read-only file inside the sandbox holding the agent's view of the
task (``rllm.types.agent_view``: never its ground truth, hidden tests or reference solution,
which reach the sandbox only when a verifier copies them in after the harness is done),
``RLLM_WORKDIR`` and ``{workdir}`` the spec's workdir (the default ``cwd``), and the environment
is the sandbox's (cleared, then the spec's ``env``) plus ``env`` and these variables — never the
engine's.
``timeout_s`` defaults to the spec's ``limits.exec_timeout_s``; stdout is kept up to
``limits.output_bytes``.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

import msgspec

from rllm.sdk.command import (
    MAX_ENV_TASK,
    TAIL_CHARS,
    CommandError,
    CommandFlow,
    fill,
    instruction_text,
    task_json,
)
from rllm.sdk.sandbox import HarnessHost, Sandbox, SandboxUnavailable
from rllm.types import AgentConfig, Episode, Task, TerminationReason


async def run_in_sandbox(flow: CommandFlow, task: Task, config: AgentConfig, sandbox: Sandbox) -> Episode:
    """One rollout of ``flow`` as an exec of ``sandbox`` (see the module docstring)."""
    if not isinstance(sandbox, HarnessHost):
        raise SandboxUnavailable(
            f"the {type(sandbox).__name__} cannot bridge a command harness to its session "
            "(the local bubblewrap sandbox can): run the command outside a sandbox or use sandbox_backend=bubblewrap"
        )
    task_doc = task_json(task)
    hookup = await sandbox.hook_up_harness(config.base_url, config.api_key, {"task.json": task_doc})
    workdir = sandbox.spec.workdir
    values = {"instruction": instruction_text(task), "task_id": task.id, "workdir": workdir}
    argv = [fill(a, values) for a in flow.argv]
    cwd = workdir if flow.cwd is None else fill(flow.cwd, values)
    env = {
        **flow.env,
        "OPENAI_BASE_URL": hookup.base_url,
        "OPENAI_API_KEY": hookup.api_key,
        "OPENAI_MODEL": config.model,
        "RLLM_MODEL": config.model,
        "RLLM_TASK_FILE": hookup.files["task.json"],
        "RLLM_TASK_ID": task.id,
        "RLLM_SAMPLING": msgspec.json.encode(config.sampling).decode(),
        "RLLM_WORKDIR": workdir,
    }
    if len(task_doc) <= MAX_ENV_TASK:  # Linux refuses one variable over 128 KiB (E2BIG)
        env["RLLM_TASK"] = task_doc.decode()
    timeout = flow.timeout_s if flow.timeout_s is not None else sandbox.spec.limits.exec_timeout_s
    script = f"{hookup.launch}\ncd {shlex.quote(cwd)} || exit 125\nexec {shlex.join(argv)}\n"
    details: dict[str, Any] = {"argv": argv, "sandboxed": True}
    started = time.monotonic()
    result = await sandbox.exec(script, timeout=timeout, env=env)
    details.update(
        exit_code=result.exit_code,
        duration_s=time.monotonic() - started,
        stdout_tail=result.stdout[-TAIL_CHARS:],
        stderr_tail=result.stderr[-TAIL_CHARS:],
    )
    if result.truncated:
        details["output_truncated"] = True
    if result.timed_out:
        raise CommandError(
            f"command {argv[0]!r} ran past its {timeout:g} s timeout; its sandboxed process tree was killed",
            termination_reason=TerminationReason.TIMEOUT,
            details=details,
        )
    if result.exit_code != 0:
        last = result.stderr.strip().splitlines()[-1:] or [""]
        raise CommandError(
            f"command {argv[0]!r} exited with status {result.exit_code} in its sandbox"
            + (f": {last[0][:200]}" if last[0] else ""),
            termination_reason=TerminationReason.AGENT_ERROR,
            details=details,
        )
    if flow.answer_from == "stdout":
        answer = result.stdout.strip()
    else:
        path = fill(flow.answer_from[len("file:") :], values)
        try:
            answer = (await sandbox.read_file(path)).decode("utf-8", "replace").strip()
        except Exception as exc:  # missing, a link, a folder: the sandbox's error names it
            raise CommandError(
                f"command {argv[0]!r} wrote no answer file {path!r} in its sandbox: {exc}",
                termination_reason=TerminationReason.AGENT_ERROR,
                details=details,
            ) from None
    return Episode(
        task_id=task.id,
        artifacts={"answer": answer},
        metadata={"command": details},
        metrics={"command_s": details["duration_s"]},
    )
