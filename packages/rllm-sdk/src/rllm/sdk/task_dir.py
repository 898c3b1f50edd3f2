"""Harbor-style task directories: a task an agent solves in a sandbox, as files.

::

    my-task/
      task.toml            # optional: timeouts, network, limits, metadata
      instruction.md       # what the agent is asked
      environment/setup.sh # optional: run in the sandbox before the agent starts
      environment/files/   # optional: copied into the sandbox's workdir before setup
      tests/test.sh        # the verifier: exit 0 = solved (other files in tests/ go with it)
      solution/solve.sh    # optional: a reference solution (to check the task itself)

``task.toml`` keys (all optional): ``[agent] timeout_sec``, ``[verifier] timeout_sec``,
``[environment] network, setup_timeout_sec, cpu_s, memory_mb, max_procs, output_bytes``,
``[environment.desktop] width, height, depth, apps, screenshot_max, image`` (a virtual screen whose
``apps`` start the task's GUI program; see ``rllm.sdk.sandbox.DesktopSpec``),
``[metadata]`` (free-form, kept in ``Task.metadata``; list keys the agent must not see in its
``grader_only``). The agent never sees the tests, the reference solution or the sandbox spec (whose
setup script may hold the answer): the engine hands flows, command harnesses (``RLLM_TASK``) and
remote agents only ``rllm.types.agent_view(task)``, which leaves them out, and they are not in the
sandbox while the agent works. The evaluator gets the full task and runs in the rollout's sandbox
after the agent is done (``current_sandbox()``): ``run_verifier`` copies the tests in then, so the
agent can neither read nor edit them. A verifier the agent's own doing breaks (its disk cap full,
a link where a test file goes) raises ``SandboxAgentError``: the rollout is scored 0 with that
reason, never retried.

Tasks in Harbor's own format (the ``harbor`` package's ``task.toml``) load too: its sandbox keys
are mapped and what rLLM does not run is refused by name (``rllm.sdk.task_harbor``).

``network = true`` is the dataset asking for the network, which the operator must grant: loading
such a task is refused unless ``allow_network=True``; in a run, the engine refuses it unless
``sandbox.allow_task_network`` is set. With the local sandbox, a networked sandbox has a
network namespace of its own with outbound NAT and no route to the host's loopback services
(see rllm.engine.sandbox.network).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgspec

from rllm.sdk.sandbox import DesktopSpec, ExecResult, Sandbox, SandboxLimits, SandboxSpec
from rllm.sdk.task_harbor import check_harbor, harbor_metadata, mapped_spec_fields, wants_network
from rllm.types import Task, convert, to_builtins
from rllm.types.errors import RLLMError

TESTS_DIR = ".rllm-tests"
_LIMIT_KEYS = ("cpu_s", "memory_mb", "max_procs", "output_bytes")


class TaskDirError(RLLMError, ValueError):
    """A task directory is missing a file or has a bad task.toml value (named in the message)."""


def _text_files(root: Path) -> dict[str, str]:
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def load_task_dir(path: str | Path, *, allow_network: bool = False) -> Task:
    """One task directory as a Task (self-contained: every file's text is in its metadata).
    A task asking for ``network = true`` is refused unless the operator ``allow_network``."""
    root = Path(path)
    instruction, verifier = root / "instruction.md", root / "tests" / "test.sh"
    for required in (instruction, verifier):
        if not required.is_file():
            raise TaskDirError(f"task directory {root}: missing {required.relative_to(root)}")
    config: dict[str, Any] = {}
    if (root / "task.toml").is_file():
        try:
            config = tomllib.loads((root / "task.toml").read_text())
        except tomllib.TOMLDecodeError as exc:
            raise TaskDirError(f"{root / 'task.toml'}: {exc}") from None
    check_harbor(root, config)
    env = config.get("environment", {})
    network = wants_network(config)
    if network and not allow_network:
        raise TaskDirError(
            f"{root / 'task.toml'}: the task asks for the network ([environment] network = true, "
            "or Harbor's network_mode = 'public', its default), but task directories get the "
            "network only with the operator's consent (allow_network=True here; "
            "sandbox.allow_task_network in a run)"
        )
    setup = root / "environment" / "setup.sh"
    try:
        spec_fields, harbor_limits = mapped_spec_fields(env)
        spec = SandboxSpec(
            network=network,
            limits=SandboxLimits(**{k: env[k] for k in _LIMIT_KEYS if k in env}, **harbor_limits),
            setup=setup.read_text() if setup.is_file() else None,
            setup_timeout_s=float(env.get("setup_timeout_sec", 120.0)),
            files=_text_files(root / "environment" / "files"),
            desktop=convert(env["desktop"], DesktopSpec) if "desktop" in env else None,
            **spec_fields,
        )
    except (TypeError, ValueError, msgspec.ValidationError) as exc:
        raise TaskDirError(f"{root / 'task.toml'} [environment]: {exc}") from None
    solution = root / "solution" / "solve.sh"
    verify_env = {str(k): str(v) for k, v in dict(config.get("verifier", {}).get("env", {})).items()}
    return Task(
        id=root.name,
        instruction=instruction.read_text().strip(),
        metadata={
            **config.get("metadata", {}),
            **harbor_metadata(config),
            **({"verify_env": verify_env} if verify_env else {}),
            "sandbox": to_builtins(spec),
            "tests": _text_files(root / "tests"),
            "agent_timeout_s": float(config.get("agent", {}).get("timeout_sec", 600.0)),
            "verify_timeout_s": float(config.get("verifier", {}).get("timeout_sec", 120.0)),
            **({"solution": solution.read_text()} if solution.is_file() else {}),
        },
    )


def load_task_dirs(parent: str | Path, *, allow_network: bool = False) -> list[Task]:
    """Every task directory (a folder with an instruction.md) under ``parent``, sorted by name."""
    folders = sorted(p.parent for p in Path(parent).glob("*/instruction.md"))
    if not folders:
        raise TaskDirError(f"no task directories (folders with instruction.md) under {parent}")
    return [load_task_dir(folder, allow_network=allow_network) for folder in folders]


def task_sandbox_spec(task: Task) -> SandboxSpec:
    """The sandbox a task-directory task runs in (use as ``@needs_sandbox(task_sandbox_spec)``)."""
    if "sandbox" not in task.metadata:
        raise TaskDirError(f"task {task.id!r} has no 'sandbox' in its metadata: not from a task directory")
    return convert(task.metadata["sandbox"], SandboxSpec)


async def run_verifier(sandbox: Sandbox, task: Task) -> ExecResult:
    """Copy the task's tests into the sandbox (replacing anything the agent put there) and run
    ``tests/test.sh`` in the workdir; exit 0 means solved. Call it from the evaluator, which has
    the full task (a flow has only the agent's view, without the tests) and the rollout's sandbox.

    Whatever the agent left at the tests' folder is removed first, and the removal is checked:
    a folder it made undeletable (read-only) is made writable and removed; when something still
    remains, the verdict is a failure (exit 1) that says so, never tests mixed with its files."""
    cleared = await sandbox.exec(
        f"chmod -R u+rwx {TESTS_DIR} 2>/dev/null; rm -rf {TESTS_DIR} && test ! -e {TESTS_DIR} && test ! -L {TESTS_DIR}"
    )
    if not cleared.ok:
        return ExecResult(
            exit_code=1,
            stderr=f"verifier: could not clear {TESTS_DIR} before copying the tests in "
            f"(exit {cleared.exit_code}): {cleared.stderr.strip()[-300:]}",
        )
    if "tests" not in task.metadata:
        raise TaskDirError(
            f"task {task.id!r} has no tests in its metadata: run_verifier needs the full task (the "
            "evaluator's), not the agent's view a flow gets"
        )
    for rel, text in task.metadata["tests"].items():
        await sandbox.write_file(f"{TESTS_DIR}/{rel}", text)
    return await sandbox.exec(
        ["sh", f"{TESTS_DIR}/test.sh"],
        timeout=task.metadata["verify_timeout_s"],
        env=task.metadata.get("verify_env"),
    )
