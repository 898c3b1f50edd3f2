"""rllm.testing: fakes for rLLM's tests and benchmarks (dev only, never shipped in a product wheel).

Importing this package needs only rllm-types and rllm-runtime. The fakes of remote services
live in submodules that import their service's SDK: ``rllm.testing.tinker``,
``rllm.testing.fireworks`` and ``rllm.testing.e2b``.
"""

from rllm.testing.chat_tokenizer import TINY_CHAT_TEMPLATE, build_tiny_chat_tokenizer
from rllm.testing.mock_replies import MockReply, Responder
from rllm.testing.mock_upstream import MockFailure, MockStats, MockUpstream, mock_upstream_in_thread
from rllm.testing.scripted import last_text, say_back
from rllm.testing.waiting import read_until_line, wait_until

__all__ = [
    "TINY_CHAT_TEMPLATE",
    "MockFailure",
    "MockReply",
    "MockStats",
    "MockUpstream",
    "Responder",
    "build_tiny_chat_tokenizer",
    "last_text",
    "mock_upstream_in_thread",
    "read_until_line",
    "say_back",
    "wait_until",
]
