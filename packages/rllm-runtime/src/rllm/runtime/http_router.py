"""Route a request to its handler: static paths in a dict, ``{name}`` patterns as regexes."""

from __future__ import annotations

import re
from urllib.parse import unquote

from rllm.runtime.http_messages import ErrorFactory, Handler, Request, Response, StreamResponse
from rllm.types.errors import RLLMError


class RouteNotFound(RLLMError):
    """No route for the path (404)."""


class MethodNotAllowed(RLLMError):
    """The path exists, not for this method (405)."""


class Router:
    """Static paths in a dict, ``{name}`` patterns as regexes tried in the order added."""

    def __init__(self) -> None:
        self._static: dict[str, dict[str, Handler]] = {}
        self._dynamic: list[tuple[re.Pattern[str], dict[str, Handler]]] = []
        self._patterns: dict[str, dict[str, Handler]] = {}

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        methods = self._patterns.get(pattern)
        if methods is None:
            methods = self._patterns[pattern] = {}
            if "{" in pattern:
                regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(pattern))
                self._dynamic.append((re.compile(f"^{regex}$"), methods))
            else:
                self._static[pattern] = methods
        methods[method] = handler

    def resolve(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        methods = self._static.get(path)
        params: dict[str, str] = {}
        if methods is None:
            for regex, candidate in self._dynamic:
                m = regex.match(path)
                if m is not None:
                    methods, params = candidate, m.groupdict()
                    if "%" in path:
                        params = {k: unquote(v) for k, v in params.items()}
                    break
            else:
                raise RouteNotFound(path)
        handler = methods.get(method)
        if handler is None and method == "HEAD":  # HEAD is GET without the body (RFC 9110)
            handler = methods.get("GET")
        if handler is None:
            raise MethodNotAllowed(method)
        return handler, params

    async def dispatch(self, request: Request, on_error: ErrorFactory) -> Response | StreamResponse:
        """Run the request's handler (``match_info`` set); an unknown path is answered with
        ``on_error(404, ...)``, a known one asked with another method with ``on_error(405, ...)``."""
        try:
            handler, request.match_info = self.resolve(request.method, request.path)
            return await handler(request)
        except RouteNotFound:
            return on_error(404, f"no route for {request.method} {request.path}")
        except MethodNotAllowed:
            return on_error(405, f"method {request.method} not allowed on {request.path}")
