"""rllm.gateway: an OpenAI-compatible, session-routed proxy that captures exact token ids and
logprobs from inference servers, for RL training of language agents.

Embed it (``GatewayServer(GatewayConfig(...))``), drive it through a ``GatewayAdmin``
(``GatewayClient`` over HTTP, ``server.local_client()`` in the same process, ``GatewayGroup``
for several gateways as one), or run it (``rllm-gateway serve``).
A vLLM look-alike for tests is ``rllm.testing.MockUpstream`` (dev only).
"""

from rllm.gateway.admin_api import GatewayAdmin, GatewayAPIError, SessionInfo, session_base_url
from rllm.gateway.client import GatewayClient
from rllm.gateway.config import GatewayConfig, load_config
from rllm.gateway.group import GatewayGroup
from rllm.gateway.local_client import LocalGatewayClient
from rllm.gateway.server import GatewayServer
from rllm.gateway.store import MemoryTraceStore, SqliteTraceStore, TraceStore, open_store
from rllm.gateway.trace_query import TraceQuery

__all__ = [
    "GatewayAPIError",
    "GatewayAdmin",
    "GatewayClient",
    "GatewayConfig",
    "GatewayGroup",
    "GatewayServer",
    "LocalGatewayClient",
    "MemoryTraceStore",
    "SessionInfo",
    "SqliteTraceStore",
    "TraceQuery",
    "TraceStore",
    "load_config",
    "open_store",
    "session_base_url",
]
