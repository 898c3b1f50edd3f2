"""Sandboxes as a flow sees them: the ``Sandbox`` protocol, its spec, and how a flow asks for one.

A flow that runs code declares it with ``@needs_sandbox(spec)`` (a fixed ``SandboxSpec`` or a
function ``task -> SandboxSpec``) and calls ``current_sandbox()`` while it runs; the engine
creates (or takes from its warm pool) a sandbox of that spec, runs the spec's setup script in it,
and closes it when the rollout ends, however it ends. Implementations (bubblewrap, Docker,
hosted services) live in ``rllm.engine.sandbox``; a cookbook depends only on this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Protocol, runtime_checkable

import msgspec

from rllm.sdk.errors import InfraError
from rllm.types import InvariantError, Task, TerminationReason
from rllm.types.errors import InputError, UsageError

TRUNCATION_MARKER = "\n[... output truncated by the sandbox: {dropped} more bytes ...]\n"


class SandboxError(InfraError):
    """A sandbox could not be created or used for a reason the agent cannot cause (the host,
    the backend, a setup script that failed before the agent started): an infrastructure error,
    so the rollout is retried. ``caused_by`` says whose the failure is; a failure the agent
    caused in its own sandbox is a :class:`SandboxAgentError` instead."""

    caused_by: ClassVar[str] = "host"
    termination_reason: ClassVar[TerminationReason] = TerminationReason.INFRA_ERROR


class SandboxUnavailable(SandboxError):
    """The backend cannot isolate commands here (e.g. no user namespaces); nothing was run."""


class SandboxAgentError(SandboxError):
    """A sandbox operation failed because of what the agent did in its own sandbox: it filled
    its disk cap, left a link, a FIFO or a folder where a file was expected, removed what was to
    be read. The agent's outcome, not infrastructure (``caused_by = "agent"``, termination
    ``agent_error``): the engine scores the rollout 0 with this message and never retries it,
    whether it is raised in the flow or in a verifier after it. A SandboxError still, so code that
    handles sandbox failures handles it."""

    caused_by: ClassVar[str] = "agent"
    termination_reason: ClassVar[TerminationReason] = TerminationReason.AGENT_ERROR


class SandboxLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Resource limits of one sandbox.

    Per sandbox (all its processes together; the local backend needs writable cgroups for the
    first three, and says at start-up when it runs without them): ``memory_mb`` of memory
    (RAM-backed files it writes, /tmp and /dev/shm included, count against it), ``max_procs``
    processes at once, ``cpus`` CPUs' worth of time. Per mount: ``tmp_mb`` for /tmp, ``shm_mb``
    for /dev/shm, ``disk_mb`` for the workdir; nothing else is writable. Per process: ``cpu_s``
    CPU seconds, ``memory_mb`` of address space, ``file_size_mb`` per file written. Per exec:
    ``output_bytes`` kept of stdout and of stderr each, ``exec_timeout_s`` of wall clock. Per
    transfer: one ``read_file`` or ``download`` of the local sandbox brings out at most
    ``disk_mb`` (what its workdir can hold; apparent sizes count), else a ``SandboxAgentError``."""

    cpu_s: int = 60
    memory_mb: int = 2048
    max_procs: int = 64
    cpus: float = 1.0
    output_bytes: int = 64 * 1024
    file_size_mb: int = 256
    tmp_mb: int = 256
    shm_mb: int = 64
    disk_mb: int = 1024
    exec_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for name in (
            "cpu_s",
            "memory_mb",
            "max_procs",
            "output_bytes",
            "file_size_mb",
            "tmp_mb",
            "shm_mb",
            "disk_mb",
        ):
            if getattr(self, name) < 1:
                raise InvariantError(f"{name} must be >= 1, got {getattr(self, name)}", name)
        if self.cpus < 0.01:
            raise InvariantError(f"cpus must be >= 0.01, got {self.cpus}", "cpus")
        if self.exec_timeout_s <= 0:
            raise InvariantError(f"exec_timeout_s must be > 0, got {self.exec_timeout_s}", "exec_timeout_s")


class DesktopSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A virtual screen inside the sandbox: an X server (Xvfb) of ``width`` x ``height`` pixels at
    ``depth`` bits and a minimal window manager, private to the sandbox (its own socket folder,
    never the host's), counted in its limits and torn down at close. ``apps`` are shell commands
    started on the display (in ``workdir``, after setup) that live as long as the sandbox;
    ``screenshot_max`` is the longest side of the screenshots sent to a model (downscaled).
    ``image``: the container image a container backend (Docker) runs the desktop in, when the
    sandbox spec names none (it needs Xvfb, evilwm, xdotool, xwd, netpbm, python3 and the apps'
    own needs; ``cookbooks/desktop/Dockerfile`` builds one); the local backend ignores it."""

    width: int = 1024
    height: int = 768
    depth: int = 24
    apps: tuple[str, ...] = ()
    screenshot_max: int = 1024
    image: str | None = None

    def __post_init__(self) -> None:
        for name in ("width", "height"):
            value = getattr(self, name)
            if not 64 <= value <= 8192:
                raise InvariantError(f"desktop {name} must be 64..8192 pixels, got {value}", name)
        if self.depth not in (8, 16, 24):
            raise InvariantError(f"desktop depth must be 8, 16 or 24, got {self.depth}", "depth")
        if self.screenshot_max < 64:
            raise InvariantError(f"screenshot_max must be >= 64, got {self.screenshot_max}", "screenshot_max")


class SandboxSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What sandbox a rollout needs. ``setup`` is a shell script run in the sandbox (in
        ``workdir``) before the agent starts; a failing setup fails the sandbox, not the agent.
        ``image`` is used by container and hosted backends; the local backend runs the host's
        read-only system. ``files`` are written into ``workdir`` before ``setup`` runs. ``desktop``
    asks for a virtual screen (see :class:`DesktopSpec`; its actions are ``rllm.sdk.desktop``)."""

    network: bool = False
    limits: SandboxLimits = SandboxLimits()
    env: dict[str, str] = msgspec.field(default_factory=dict)
    setup: str | None = None
    setup_timeout_s: float = 120.0
    files: dict[str, str] = msgspec.field(default_factory=dict)
    image: str | None = None
    workdir: str = "/work"
    desktop: DesktopSpec | None = None

    def __post_init__(self) -> None:
        if not self.workdir.startswith("/") or self.workdir.rstrip("/") in ("", "/usr", "/etc", "/proc"):
            raise InvariantError(
                f"workdir must be an absolute path of its own, got {self.workdir!r}", "workdir"
            )
        for rel in self.files:
            if rel.startswith("/") or ".." in rel.split("/"):
                raise InvariantError(f"files: {rel!r} must be a relative path inside workdir", "files")

    @property
    def key(self) -> bytes:
        """Equal specs have equal keys: sandboxes prepared for one spec serve any rollout of it."""
        return msgspec.msgpack.encode(self)


def task_sandbox(task: Task) -> SandboxSpec:
    """The sandbox a task asks for in ``metadata["sandbox"]`` (a ``SandboxSpec`` as a mapping;
    hidden from the agent's view like every task's sandbox spec), else the default spec; a
    malformed spec is an InputError naming the task (use as ``@needs_sandbox(task_sandbox)``)."""
    raw = task.metadata.get("sandbox")
    if raw is None:
        return SandboxSpec()
    try:
        return msgspec.convert(raw, SandboxSpec)
    except (msgspec.ValidationError, ValueError) as exc:
        raise InputError(f"task {task.id!r}: sandbox: {exc}") from None


class ExecResult(msgspec.Struct, kw_only=True):
    """One command's outcome. ``stdout``/``stderr`` are cut at the output limit with a marker
    (``truncated``); ``timed_out`` means the wall clock killed it."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class HarnessHookup(msgspec.Struct, frozen=True, kw_only=True):
    """How a command harness started in a sandbox reaches its rollout's session (what
    ``hook_up_harness`` answers): its ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` inside the
    sandbox, a shell line to run first in the harness's exec (it starts the sandbox's end of the
    bridge), and where the given files are inside the sandbox (read-only)."""

    base_url: str
    api_key: str
    launch: str
    files: dict[str, str]


@runtime_checkable
class HarnessHost(Protocol):
    """A sandbox that can connect a command harness in it to the session at ``base_url`` (and to
    nothing else); the local bubblewrap sandbox is one. Called once per rollout; the bridge
    closes with the sandbox."""

    async def hook_up_harness(
        self, base_url: str, api_key: str, files: dict[str, bytes]
    ) -> HarnessHookup: ...


class PipedProcess(Protocol):
    """A long-running process inside a sandbox whose stdin and stdout are pipes to the host
    (what ``ProcessHost.start_process`` answers). Everything it writes is the sandbox's, so
    hostile: the host reads ``stdout`` in bounded pieces, and its stderr is drained by the
    sandbox into a bounded tail (``stderr_tail``) so that it can never block on a full pipe."""

    @property
    def stdin(self) -> asyncio.StreamWriter: ...

    @property
    def stdout(self) -> asyncio.StreamReader: ...

    @property
    def returncode(self) -> int | None: ...

    def stderr_tail(self) -> str: ...

    def socket_path(self, name: str) -> str:
        """A host path to connect to the unix socket ``name`` the process made in its
        ``socket_dir`` (checked to be a socket, never a link; a ``SandboxAgentError`` when not)."""
        ...

    async def wait(self) -> int: ...

    async def close(self) -> None: ...


@runtime_checkable
class ProcessHost(Protocol):
    """A sandbox that can start a long-running process with its stdin and stdout piped to the
    host (a tool server the host talks to over stdio); the local bubblewrap sandbox is one. The
    process runs as the sandbox's commands do (its files, its limits, its namespaces), and it is
    killed when the sandbox closes if it has not ended before. ``socket_dir`` (a folder inside
    the sandbox) gives it a folder of its own, bound from the host, for unix sockets the host
    connects to (``PipedProcess.socket_path``): how the host reaches a server in a sandbox that
    has no network, or whose network is not the host's."""

    async def start_process(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        socket_dir: str | None = None,
    ) -> PipedProcess: ...


@runtime_checkable
class Sandbox(Protocol):
    """An isolated place to run commands. Paths are inside the sandbox; relative ones are
    relative to the spec's ``workdir``. ``upload``/``download`` take files or folders."""

    spec: SandboxSpec

    async def exec(
        self, cmd: str | list[str], timeout: float | None = None, env: dict[str, str] | None = None
    ) -> ExecResult: ...

    async def write_file(self, path: str, data: bytes | str) -> None: ...

    async def read_file(self, path: str) -> bytes: ...

    async def upload(self, local_path: str, path: str) -> None: ...

    async def download(self, path: str, local_path: str) -> None: ...

    async def is_alive(self) -> bool: ...

    async def close(self) -> None: ...


def truncate_output(data: bytes, limit: int, total: int | None = None) -> tuple[str, bool]:
    """The first ``limit`` bytes of ``data`` as text, plus a marker naming what was dropped.

    ``total`` is how many bytes the command wrote when the caller stopped keeping them early."""
    total = len(data) if total is None else total
    if total <= limit:
        return data.decode("utf-8", "replace"), False
    kept = data[:limit].decode("utf-8", "ignore")
    return kept + TRUNCATION_MARKER.format(dropped=total - limit), True


SpecSource = SandboxSpec | Callable[[Task], SandboxSpec]
_SPEC_ATTR = "__rllm_sandbox__"
_current: contextvars.ContextVar[Sandbox | None] = contextvars.ContextVar("rllm_sandbox", default=None)


def needs_sandbox(spec: SpecSource | None = None) -> Callable[[Any], Any]:
    """Declare that a flow runs in a sandbox; put it above or below ``@rollout``.

    ``spec`` is a ``SandboxSpec`` or a function ``task -> SandboxSpec`` (e.g. per-task setup);
    default: ``SandboxSpec()``."""
    source: SpecSource = SandboxSpec() if spec is None else spec
    if not isinstance(source, SandboxSpec) and not callable(source):
        raise UsageError(f"needs_sandbox takes a SandboxSpec or a function task -> SandboxSpec, got {spec!r}")

    def mark(flow: Any) -> Any:
        setattr(flow, _SPEC_ATTR, source)
        return flow

    return mark


def _declared(flow: Any) -> SpecSource | None:
    # On the flow object, the function a RolloutFlow wraps, or the instance of a bound run().
    for obj in (flow, getattr(flow, "fn", None), getattr(getattr(flow, "fn", None), "__self__", None)):
        source = getattr(obj, _SPEC_ATTR, None) if obj is not None else None
        if source is not None:
            return source
    return None


def declares_sandbox(flow: Any) -> bool:
    """True when ``flow`` was marked with ``@needs_sandbox``."""
    return _declared(flow) is not None


def sandbox_spec_for(flow: Any, task: Task) -> SandboxSpec | None:
    """The spec ``flow`` declared for ``task``, or None when it needs no sandbox."""
    source = _declared(flow)
    if source is None:
        return None
    spec = source if isinstance(source, SandboxSpec) else source(task)
    if not isinstance(spec, SandboxSpec):
        raise UsageError(f"the sandbox spec function returned {type(spec).__name__}, not a SandboxSpec")
    return spec


def current_sandbox() -> Sandbox:
    """The sandbox the engine gave this rollout; raises when the flow did not declare one."""
    sandbox = _current.get()
    if sandbox is None:
        raise SandboxError("no sandbox for this rollout: decorate the flow with @needs_sandbox(...)")
    return sandbox


@contextlib.contextmanager
def using_sandbox(sandbox: Sandbox) -> Iterator[Sandbox]:
    """Make ``sandbox`` the current one inside the block (what the engine does per rollout)."""
    token = _current.set(sandbox)
    try:
        yield sandbox
    finally:
        _current.reset(token)
