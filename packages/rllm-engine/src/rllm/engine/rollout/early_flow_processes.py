"""Flow processes started before their engine exists, so their start-up overlaps the caller's.

A spawned flow process spends seconds importing (the interpreter, the flow's module and its
openai client, the gateway, transformers and torch for the gateway's tokenizer) before it can
take a rollout, and a trainer only knows its workers' engine arguments (the gateway's upstreams)
once its backend has loaded the model. :func:`start_early` spawns the processes at once: each
imports the modules it will need, then waits for its engine arguments on its socket. The
:class:`~rllm.engine.rollout.flow_processes.FlowProcessPool` built later adopts them
(:meth:`EarlyFlowProcesses.take`) and sends the entry point and arguments a spawn would have
carried (one pickled frame, :mod:`rllm.engine.rollout.frames`); from there a worker runs exactly
as a freshly spawned one. A module that fails to import early is imported again from the
arguments; a failure there is sent to the driver as the worker's one error line
(:func:`~rllm.engine.rollout.frames.send_start_failure`). A pool with no processes
started early starts its own this way (with nothing to import first), for that same line.

``RLLM_NO_EARLY_WORKERS=1`` turns it off (to measure the two against each other).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from rllm.engine.rollout.executors import resolve_executor
from rllm.engine.rollout.frames import HEADER, read_frame, send_start_failure

OFF_ENV = "RLLM_NO_EARLY_WORKERS"
log = logging.getLogger(__name__)


def _early_main(sock: socket.socket, modules: list[str]) -> None:
    """Entry point of an early flow process: import, then wait for the worker's entry point and
    its arguments, and run it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a worker's: the parent handles Ctrl-C
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:
            pass  # imported again when the arguments are unpickled, which reports the failure
    payload = read_frame(sock)
    if not payload:
        return  # the parent closed the socket: nothing to run
    try:
        target, args = pickle.loads(payload)  # as multiprocessing's spawn reads its arguments
    except Exception as exc:  # a flow module that fails to import here: the driver says why
        send_start_failure(sock, exc)
        sys.exit(1)
    target(sock, *args)


def _ignore_sigint() -> tuple[bool, Any]:
    """Ignore SIGINT in this process: (whether it did, the handler to restore). Not off the main
    thread, where handlers cannot change: the processes then start as fresh spawns do."""
    if threading.current_thread() is not threading.main_thread():
        return False, None
    return True, signal.signal(signal.SIGINT, signal.SIG_IGN)


def _module_of(obj: Any) -> str | None:
    module = getattr(obj, "__module__", None) if callable(obj) else None
    module = module or getattr(type(obj), "__module__", None)
    return module if isinstance(module, str) and module not in ("builtins", "__main__") else None


class EarlyFlowProcesses:
    """Spawned flow processes waiting for their engine arguments (see the module docstring)."""

    def __init__(self, n: int, modules: list[str], *, first_index: int = 0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._waiting: list[tuple[Any, socket.socket]] = []
        # Ctrl-C is likeliest during start-up, when these processes are still importing: they
        # start with SIGINT ignored (an ignored signal survives exec, and Python then installs no
        # KeyboardInterrupt handler), so they print no traceback; the parent handles it.
        ignored, previous = _ignore_sigint()
        try:
            for i in range(n):
                parent_sock, child_sock = socket.socketpair()
                proc = ctx.Process(
                    target=_early_main,
                    args=(child_sock, modules),
                    name=f"rllm-rollout-{first_index + i}",
                    daemon=True,
                )
                try:
                    proc.start()
                except BaseException:
                    parent_sock.close()
                    self.close()
                    raise
                finally:
                    child_sock.close()
                self._waiting.append((proc, parent_sock))
        finally:
            if ignored:  # None: a handler not set from Python, which SIG_DFL stands for
                signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)

    def take(self, target: Callable[..., None], args: tuple[Any, ...]) -> tuple[Any, socket.socket] | None:
        """A waiting process, sent ``target`` and ``args`` (it runs ``target(sock, *args)``, as a
        spawned worker would), and the parent's end of its socket; None when none is left alive.
        Raises what pickling them raises (as ``Process.start`` would for a fresh spawn)."""
        from multiprocessing.reduction import ForkingPickler

        payload = bytes(ForkingPickler.dumps((target, args)))
        while self._waiting:
            proc, sock = self._waiting.pop(0)
            try:
                sock.sendall(HEADER.pack(len(payload)) + payload)
            except OSError:  # it exited while waiting (killed?): a fresh spawn replaces it
                log.warning("early flow process %s exited (code %s); spawning another", proc.name,
                            proc.exitcode)  # fmt: skip
                sock.close()
                continue
            return proc, sock
        return None

    def close(self) -> None:
        """End the processes not taken (one still importing would finish first, then see its
        socket closed); no waiting: multiprocessing reaps them."""
        waiting, self._waiting = self._waiting, []
        for proc, sock in waiting:
            sock.close()
            if proc.is_alive():
                proc.terminate()

    def __del__(self) -> None:  # dropped without close() (a Trainer built and never fitted)
        with contextlib.suppress(Exception):
            self.close()


def start_early(settings: Any, flow: Any, evaluator: Any, *, tokenizer: bool) -> EarlyFlowProcesses | None:
    """Start the flow processes of a RolloutConfig ``settings`` now (None when its flows run in
    this process or on Ray, or when ``RLLM_NO_EARLY_WORKERS=1``); ``tokenizer``: their gateways
    will load a tokenizer (cumulative mode), so transformers' tokenizer classes are imported too."""
    if os.environ.get(OFF_ENV) == "1" or resolve_executor(settings.executor, settings.workers) != "processes":
        return None
    modules = ["rllm.engine.rollout.flow_processes", "rllm.engine.rollout.rollout_engine", "rllm.gateway"]
    modules += [m for m in (_module_of(flow), _module_of(evaluator)) if m]
    if tokenizer:
        modules += ["rllm.gateway.tokenizer_load", "transformers.tokenization_utils_tokenizers"]
    return EarlyFlowProcesses(settings.workers, list(dict.fromkeys(modules)))


def start_early_for(config: Any, cookbook: Any) -> EarlyFlowProcesses | None:
    """:func:`start_early` for a TrainerConfig ``config`` and its ``cookbook``."""
    return start_early(
        config.rollout, cookbook.flow, cookbook.evaluator, tokenizer=config.gateway.mode == "cumulative"
    )


__all__ = ["OFF_ENV", "EarlyFlowProcesses", "start_early", "start_early_for"]
