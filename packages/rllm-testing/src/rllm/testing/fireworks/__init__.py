"""A FAKE of the remote Fireworks training service (needs ``fireworks-ai``, torch and aiohttp)."""

from rllm.testing.fireworks.control_plane import ACCOUNT
from rllm.testing.fireworks.server import FAKE_API_KEY, FakeFireworksServer
from rllm.testing.service import ContractError

__all__ = ["ACCOUNT", "FAKE_API_KEY", "ContractError", "FakeFireworksServer"]
