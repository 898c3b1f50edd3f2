"""A verl platform for CPU-only processes, registered through verl's own platform registry.

verl picks its device through ``verl.plugin.platform`` (``VERL_PLATFORM`` or auto-detection,
which falls back to CUDA). A CUDA build of torch on a machine without a GPU then asks for NCCL
and ``cuda:0``. Selecting ``cpu`` makes verl's engines place tensors on the CPU and communicate
over gloo, so the same FSDP engine runs in tests and on CPU-only Ray nodes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

CPU_PLATFORM = "cpu"


class _CPUDeviceModule(ModuleType):
    """``torch.cpu`` plus the memory queries verl makes of a device module (``torch.cuda`` has
    them, ``torch.cpu`` does not). Peaks report the process's peak resident memory."""

    def __init__(self) -> None:
        super().__init__("rllm_verl_cpu_device")

    def __getattr__(self, name: str) -> Any:
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name in ("max_memory_allocated", "max_memory_reserved"):
            return _peak_rss_bytes
        if name in ("memory_allocated", "memory_reserved"):
            return lambda *args, **kwargs: 0
        if name in ("reset_peak_memory_stats", "reset_max_memory_allocated", "ipc_collect", "empty_cache"):
            return lambda *args, **kwargs: None
        if name == "mem_get_info":
            return _mem_get_info
        if name in ("get_rng_state", "set_rng_state"):  # the CPU generator is torch's default one
            return getattr(torch, name)
        if name == "get_device_name":
            return lambda *args, **kwargs: "CPU"  # verl's FLOPs table knows it (for its MFU metric)
        raise AttributeError(f"the CPU device module has no {name!r}")


def _peak_rss_bytes(*args: Any, **kwargs: Any) -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _mem_get_info(*args: Any, **kwargs: Any) -> tuple[int, int]:
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


_DEVICE_MODULE = _CPUDeviceModule()


@PlatformRegistry.register(platform=CPU_PLATFORM)
class CPUPlatform(PlatformBase):
    """Device "cpu", collectives over gloo, no Ray accelerator resource."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def current_device(self) -> torch.device:  # type: ignore[override]
        # verl passes this straight to ``Tensor.to``/``Module.to``; an int would mean cuda:N.
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        """One logical CPU device: nothing to select."""

    def synchronize(self, device_index: int | None = None) -> None:
        """CPU ops are synchronous."""

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        """The CPU allocator has no tunables verl sets."""

    def empty_cache(self) -> None:
        """No device cache to free."""

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return (None, None)

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "RLLM_CPU_VISIBLE_DEVICES"

    # verl's abstract method is annotated as returning None (its body is `...`), though every
    # platform returns a context manager, as this one does.
    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:  # pyright: ignore[reportIncompatibleMethodOverride]
        yield

    def profiler_start(self) -> None:
        """No device profiler on CPU."""

    def profiler_stop(self) -> None:
        """No device profiler on CPU."""

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {}

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def use_cpu_platform() -> None:
    """Make verl run on the CPU in this process (and in Ray workers started from it)."""
    from verl.plugin.platform import get_platform, set_platform

    os.environ["VERL_PLATFORM"] = CPU_PLATFORM
    if not isinstance(get_platform(), CPUPlatform):  # verl chose a platform before we were asked
        set_platform(CPUPlatform())
    _register_fsdp_engines_for_cpu()


def _register_fsdp_engines_for_cpu() -> None:
    """verl registers its FSDP engines for cuda/npu only; the same classes run on the CPU."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, engine in (
        ("language_model", FSDPEngineWithLMHead),
        ("value_model", FSDPEngineWithValueHead),
    ):
        for backend in ("fsdp", "fsdp2"):
            if CPU_PLATFORM not in EngineRegistry._engines.get(model_type, {}).get(backend, {}):
                EngineRegistry.register(model_type=model_type, backend=backend, device=CPU_PLATFORM)(engine)


def init_cpu_process_group() -> None:
    """Join the process group over gloo alone (from RANK/WORLD_SIZE/MASTER_* like verl does).

    verl's worker initialisation names ``cpu:gloo,<device>:<backend>``, which on the CPU
    platform names the CPU twice; a group that already exists is kept, so create it first.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
