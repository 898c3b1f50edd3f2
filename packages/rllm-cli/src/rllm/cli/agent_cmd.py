"""`rllm agent serve module:flow --port P`: any Python flow as a remote agent service.

The service speaks the remote agent protocol (docs/remote-agents.md); a trainer reaches it with
``rollout.executor = "remote"`` and ``rollout.remote.urls = ["http://HOST:P"]``, so agent hosts
can be split from the trainer.
"""

from __future__ import annotations

import asyncio
import sys

import click

from rllm.cli.eval_cmd import load_object


@click.group("agent")
def agent_group() -> None:
    """Agent services: serve a flow over the remote agent protocol."""


@agent_group.command("serve")
@click.argument("flow_ref", metavar="MODULE:FLOW")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8700, show_default=True, type=int, help="port (0: any free one)")
@click.option("--capacity", default=None, type=int, help="rollouts at once; more are answered 503")
def serve_agent(flow_ref: str, host: str, port: int, capacity: int | None) -> int:
    """Serve MODULE:FLOW (a @rollout function, a flow object, or a cookbook name's flow) until
    SIGINT/SIGTERM; prints its URL once it listens.

    \b
    Example:
      rllm agent serve my_agents:solver --port 8700
      rllm train math rollout.executor=remote 'rollout.remote.urls=["http://127.0.0.1:8700"]'
    """
    from rllm.engine.rollout.agent_server import AgentServer, serve_forever

    if capacity is not None and capacity < 1:
        raise click.BadParameter(f"must be >= 1, got {capacity}", param_hint="--capacity")
    flow = load_object(flow_ref, "flow")
    server = AgentServer(flow, host=host, port=port, capacity=capacity)
    asyncio.run(serve_forever(server, ready=lambda line: print(line, flush=True, file=sys.stdout)))
    return 0
