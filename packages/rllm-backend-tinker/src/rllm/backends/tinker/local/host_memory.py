"""What the machine has for a training step: the memory the process holds, what is still free
(the kernel's available memory capped by the process's memory cgroup, or CUDA's free memory),
the budget a step may plan for, and handing freed heap memory back to the OS between steps."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import sys
from functools import cache
from pathlib import Path
from typing import Any

import torch

# Of the memory free at the first step, the share a step may plan to use (the rest absorbs
# allocator rounding and whatever else the machine does meanwhile).
FREE_SHARE = 0.9


def resident_bytes(device: torch.device) -> int:
    """What the process holds now: resident memory on CPU, torch's allocations on CUDA."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    # No /proc (macOS): the peak so far is the closest figure (bytes there, KiB on Linux).
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def free_bytes(device: torch.device) -> int:
    """Memory the process can still take: CUDA's free memory plus what torch's cache holds
    unallocated; on CPU the kernel's available memory, capped by the cgroup's limit."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + cached)
    candidates = []
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                candidates.append(int(line.split()[1]) * 1024)
    headroom = _cgroup_headroom()
    if headroom is not None:
        candidates.append(headroom)
    if not candidates:
        try:
            candidates.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            candidates.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2)
    return max(0, min(candidates))


def _cgroup_headroom() -> int | None:
    """The process's memory cgroup's limit minus its usage (v2 or v1), None without a limit."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            files = (Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            files = (
                Path("/sys/fs/cgroup/memory") / path.lstrip("/"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        else:
            continue
        base, limit_name, usage_name = files
        try:
            limit = (base / limit_name).read_text().strip()
            usage = int((base / usage_name).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit != "max" and int(limit) < 1 << 60:
            return max(0, int(limit) - usage)
    return None


def budget_bytes(device: torch.device, limit_gb: float) -> int:
    """What a step may hold at its peak: ``limit_gb`` when set, else what is held now plus a
    share of what is free."""
    if limit_gb > 0:
        return int(limit_gb * (1 << 30))
    return resident_bytes(device) + int(FREE_SHARE * free_bytes(device))


@cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(name)
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def release_free_memory() -> None:
    """Hand freed heap memory back to the OS (glibc). Each thread that allocates gets its own
    malloc arena and keeps what it freed: the trainer's worker threads and the sampler would
    otherwise each hold their largest working set resident, and the resident size would climb
    with every new thread a step runs on."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


__all__ = ["FREE_SHARE", "budget_bytes", "free_bytes", "release_free_memory", "resident_bytes"]
