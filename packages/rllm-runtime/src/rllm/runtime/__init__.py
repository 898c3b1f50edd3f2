"""rllm.runtime: the process and I/O machinery rLLM's servers share, below every layer that serves.

The gateway, the mock upstream of ``rllm-testing`` and the tinker sampler server run on it; none
of it knows about traces, sessions or models (``hub_names`` knows only that a hub stores names).
"""

from rllm.runtime.background import BackgroundLoop
from rllm.runtime.event_loop import new_event_loop, run, use_uvloop
from rllm.runtime.gc_threshold import raise_gc_threshold, restore_gc_threshold
from rllm.runtime.http_client import FastHttpPool
from rllm.runtime.http_messages import Headers, Request, Response, StreamResponse
from rllm.runtime.http_router import MethodNotAllowed, RouteNotFound, Router
from rllm.runtime.http_server import HttpServer

__all__ = [
    "BackgroundLoop",
    "FastHttpPool",
    "Headers",
    "HttpServer",
    "MethodNotAllowed",
    "Request",
    "Response",
    "RouteNotFound",
    "Router",
    "StreamResponse",
    "new_event_loop",
    "raise_gc_threshold",
    "restore_gc_threshold",
    "run",
    "use_uvloop",
]
