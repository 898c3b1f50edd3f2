"""rllm.testing: fakes for rLLM's tests and benchmarks (dev only, never shipped in a product wheel).

Importing this package needs only rllm-types and rllm-runtime.
"""

from rllm.testing.chat_tokenizer import TINY_CHAT_TEMPLATE, build_tiny_chat_tokenizer
from rllm.testing.mock_replies import MockReply, Responder
from rllm.testing.mock_upstream import MockFailure, MockStats, MockUpstream, mock_upstream_in_thread

__all__ = [
    "TINY_CHAT_TEMPLATE",
    "MockFailure",
    "MockReply",
    "MockStats",
    "MockUpstream",
    "Responder",
    "build_tiny_chat_tokenizer",
    "mock_upstream_in_thread",
]
