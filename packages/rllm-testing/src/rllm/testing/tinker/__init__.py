"""A FAKE of the remote Tinker training service (needs the ``tinker`` SDK, torch and aiohttp)."""

from rllm.testing.service import ContractError
from rllm.testing.tinker.contract import API, FAKE_API_KEY
from rllm.testing.tinker.server import FakeTinkerServer

__all__ = ["API", "FAKE_API_KEY", "ContractError", "FakeTinkerServer"]
