"""Connecting the driver to Ray: the instance it has, the cluster at ``rollout.ray.address``, or
a new local one, and checking beforehand that an address answers at all.

Ray is imported only inside the calls that use it, so :func:`check_address_answers` can run in
the CLI's checks before any work starts, without the ``ray`` extra's import cost.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from rllm.types.errors import ConfigError, StateError

# Ray waits a fixed 30 s for a new node's raylet to register; on a loaded machine a local start
# misses that window now and then although nothing is wrong, so a local start is tried again (a
# cluster at an address is never retried: its failure is the user's to see).
RAY_START_TRIES = 3
RAY_START_TIMEOUT_TEXT = "timed out during startup"


ADDRESS_KEY = "rollout.ray.address"
UV_HOOK_ENV = "RAY_ENABLE_UV_RUN_RUNTIME_ENV"


def connect_ray(
    address: str | None, *, uv_runtime_env: bool = False, connect_timeout_s: float = 30.0
) -> bool:
    """Connect this process to Ray: the instance it already has, the cluster at ``address``, or
    a new local instance. True when this call connected (the caller then shuts it down).

    Ray's own uv hook (on by default when the driver runs under ``uv run``) would start every
    worker with ``uv run`` in a copy of the working directory: a new virtualenv per node in Ray's
    session folder (gigabytes), and workers without Ray when uv resolves another environment, which
    the driver sees only as workers that never start. Unless ``uv_runtime_env``
    (``rollout.ray.uv_runtime_env``) asks for it, the hook is off and the workers run in this
    process's interpreter and environment.

    When Ray is already initialised here (e.g. by the verl backend), it is reused if ``address``
    is unset, ``auto`` or names the same cluster; another address is refused (ConfigError naming
    both) rather than silently running the rollouts on the cluster Ray is connected to."""
    import ray

    if ray.is_initialized():
        current = current_ray_address()
        if address not in (None, "auto") and not same_ray_address(address, current):
            raise ConfigError.for_key(
                ADDRESS_KEY,
                f"{address!r}, but Ray is already initialised in this process with {current!r} (by "
                f"the backend or an earlier ray.init); set {ADDRESS_KEY} to {current!r} or leave it "
                "unset to share that cluster",
            )
        return False
    if address not in (None, "auto"):
        check_address_answers(address, connect_timeout_s)
    if not uv_runtime_env:
        _disable_ray_uv_hook()
    init_ray(ray, address=address, include_dashboard=False, log_to_driver=True)
    return True


def init_ray(ray: Any, *, address: str | None, **options: Any) -> None:
    """``ray.init`` (of the ``ray`` module given: the executor's and the verl backend's start);
    a local instance whose raylet missed Ray's start-up window is shut down and started again, at
    most ``RAY_START_TRIES`` times, then the error stands."""
    for attempt in range(1, RAY_START_TRIES + 1):
        try:
            ray.init(address=address, **options)
            return
        except Exception as exc:
            if address is not None or RAY_START_TIMEOUT_TEXT not in str(exc) or attempt == RAY_START_TRIES:
                raise
            ray.shutdown()


def check_address_answers(address: str, timeout_s: float) -> None:
    """StateError naming ``address`` unless something accepts a connection at its host and port
    within ``timeout_s``. Ray itself, given an address nobody answers at, rewrites it and retries
    without end (and Ctrl-C does not stop it), so the address is tried here first."""
    _, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":")
    if not port.isdigit():
        return  # no port: Ray resolves it (e.g. from a cluster's address file); nothing to try
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        if isinstance(exc, TimeoutError):
            why = f"no answer within {timeout_s:g} s"
        else:
            why = (exc.strerror or type(exc).__name__).lower()
        raise StateError(
            f"{ADDRESS_KEY} {address!r} does not answer ({why}): is the "
            "Ray cluster up there? (`ray status` on its head node)"
        ) from None


def _disable_ray_uv_hook() -> None:
    """Turn off Ray's ``uv run`` runtime-env hook for this process. Ray reads the switch from its
    environment variable once, at import, into ``ray_constants`` (read again at each ``ray.init``),
    so both are set: the variable for processes started from here, the constant for this one."""
    os.environ[UV_HOOK_ENV] = "0"
    from ray._private import ray_constants  # the switch has no public setter

    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False


def current_ray_address() -> str:
    """The cluster this process's Ray is connected to: ``ray://HOST:PORT`` (Ray client) or the
    GCS's ``HOST:PORT``."""
    import ray
    from ray.util.client import ray as client

    if client.is_connected():
        worker = getattr(client.get_context(), "client_worker", None)
        return f"ray://{getattr(worker, '_conn_str', '') or '?'}"
    return str(ray.get_runtime_context().gcs_address)


def _endpoint(address: str) -> tuple[str, str, int | None]:
    """(scheme, IP, port) of ``[ray://]HOST[:PORT]``; a loopback host stands for this machine."""
    scheme, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    host = host.strip("[]")
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        ip = host
    if ip.startswith("127.") or ip == "::1":
        import ray

        ip = ray.util.get_node_ip_address()
    return scheme, ip, int(port) if port.isdigit() else None


def same_ray_address(wanted: str, current: str) -> bool:
    """Whether ``wanted`` (a ``rollout.ray.address``) names the cluster at ``current``."""
    w_scheme, w_ip, w_port = _endpoint(wanted)
    c_scheme, c_ip, c_port = _endpoint(current)
    return (w_scheme, w_ip) == (c_scheme, c_ip) and (w_port is None or w_port == c_port)
