"""``rllm-gateway serve``: run a gateway from a config file (TOML/YAML/JSON) and flags (flags win)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from rllm.gateway.config import GatewayConfig, load_config
from rllm.gateway.server import GatewayServer
from rllm.runtime.gc_threshold import raise_gc_threshold
from rllm.types import ConfigError


def build_parser() -> argparse.ArgumentParser:
    d = GatewayConfig()  # each flag's help shows the default it leaves in place
    p = argparse.ArgumentParser(prog="rllm-gateway", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, title="subcommands", metavar="serve")
    s = sub.add_parser(
        "serve",
        help="run the gateway until SIGINT/SIGTERM",
        description="Run the gateway until SIGINT/SIGTERM. Flags override the --config file; "
        "a flag left out keeps the file's value, else the default shown.",
    )
    s.add_argument(
        "--config", help="TOML, YAML or JSON file with gateway settings (a [gateway] table or top level)"
    )
    s.add_argument("--host", help=f"address to listen on (default: {d.host})")
    s.add_argument("--port", type=int, help=f"port to listen on; 0 picks a free one (default: {d.port})")
    s.add_argument(
        "--upstream",
        action="append",
        dest="upstreams",
        metavar="URL",
        help="OpenAI-compatible base URL ending in /v1 (repeatable)",
    )
    s.add_argument("--store", help=f"trace store: 'memory' or 'sqlite:/path/file.db' (default: {d.store})")
    s.add_argument(
        "--admin-key",
        help="admin API key (or set RLLM_GATEWAY_ADMIN_KEY); without one the admin routes are open "
        "(a warning on loopback; any other --host is refused)",
    )
    s.add_argument(
        "--insecure-no-admin-key",
        action="store_const",
        const=True,
        default=None,
        help="serve on a non-loopback --host without an admin key: anyone who reaches the port can "
        "list sessions, read every trace and set the weight version (a trusted private network only)",
    )
    s.add_argument(
        "--session-auth",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="require the per-session token on session routes",
    )
    s.add_argument(
        "--auto-create-sessions",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"create a session on its first call instead of answering 404 (default: {d.auto_create_sessions})",
    )
    s.add_argument(
        "--max-body-bytes", type=int, help=f"largest request body accepted (default: {d.max_body_bytes})"
    )
    s.add_argument(
        "--upstream-timeout-s",
        type=float,
        help=f"seconds one upstream call may take (default: {d.upstream_timeout_s})",
    )
    s.add_argument(
        "--tokenizer-path", help="tokenizer (local folder or hub name) for --tokenizer-mode cumulative"
    )
    s.add_argument(
        "--tokenizer-mode",
        choices=["plain", "cumulative"],
        help=f"cumulative: token-level bridging of multi-turn chats (default: {d.tokenizer_mode})",
    )
    s.add_argument(
        "--health-interval-s",
        type=float,
        help=f"seconds between upstream health checks; 0 turns them off (default: {d.health_interval_s})",
    )
    s.add_argument(
        "--health-timeout-s", type=float, help=f"one health check's timeout (default: {d.health_timeout_s})"
    )
    s.add_argument(
        "--hosted-model", help="send requests through LiteLLM to this model, e.g. openai/gpt-4o-mini"
    )
    s.add_argument("--hosted-api-base", help="the hosted provider's base URL (LiteLLM api_base)")
    s.add_argument("--model-name", help="model name to send upstream, whatever the client asked for")
    s.add_argument("--log-level", help=f"debug, info, warning or error (default: {d.log_level})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    if overrides.get("admin_key") is None and os.environ.get("RLLM_GATEWAY_ADMIN_KEY"):
        overrides["admin_key"] = os.environ["RLLM_GATEWAY_ADMIN_KEY"]
    if overrides.get("hosted_api_key") is None and os.environ.get("RLLM_GATEWAY_HOSTED_API_KEY"):
        overrides["hosted_api_key"] = os.environ["RLLM_GATEWAY_HOSTED_API_KEY"]
    try:
        config = load_config(args.config, **overrides)
    except (ConfigError, OSError) as exc:
        print(f"rllm-gateway: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not config.upstreams and not config.hosted_model:
        # Not an error (upstreams can be added later through POST /admin/upstreams), but every model
        # call fails until then: say so at start, not at the first 503.
        print(
            "rllm-gateway: warning: no --upstream and no --hosted-model: model calls answer 503 "
            "until an upstream is added (POST /admin/upstreams)",
            file=sys.stderr,
            flush=True,
        )
    for url in config.upstreams:
        if not url.rstrip("/").endswith("/v1"):
            # Model calls go to URL/chat/completions: an OpenAI-compatible server's base URL ends
            # in /v1, and without it every call is a 404 from the upstream, seen only then.
            print(
                f"rllm-gateway: warning: upstream {url} does not end in /v1: model calls go to "
                f"{url.rstrip('/')}/chat/completions (did you mean {url.rstrip('/')}/v1?)",
                file=sys.stderr,
                flush=True,
            )
    if config.admin_key is None:
        # Refused above on any address but loopback (unless --insecure-no-admin-key): still, any
        # local process, a flow's or an agent's, may drive the gateway. Say so, in one line.
        print(
            f"rllm-gateway: warning: no admin key: the admin routes on {config.host} are open "
            "(anyone who can connect may list sessions, read every trace, open sessions and set "
            "the weight version); pass --admin-key or set RLLM_GATEWAY_ADMIN_KEY",
            file=sys.stderr,
            flush=True,
        )
    prepare_process(config)
    asyncio.run(_serve(GatewayServer(config)))
    return 0


def prepare_process(config: GatewayConfig) -> None:
    """What a process that only serves a gateway sets for itself: uvloop (when installed) and
    the GC threshold (traces in the store would otherwise be walked by every full collection)."""
    raise_gc_threshold(config.gc_gen0_threshold)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - Windows
        pass


async def _serve(server: GatewayServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Handlers before the line below: whoever reads it may signal at once, and a SIGINT that
    # reached the default handler while the loop slept in epoll (no timers) was never acted on.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    # One parseable line, so scripts and tests can find the port when --port 0 was given.
    print(f"rllm-gateway listening on {server.url}", flush=True)
    await stop.wait()
    await server.stop()


if __name__ == "__main__":
    sys.exit(main())
