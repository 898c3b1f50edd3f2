"""The fast decode step's native kernels (``decode_kernels.c``): built with the system's C compiler
on first use, cached, and called through ctypes.

Why native: at 32 rows a decode step spent as long in ~25 small torch operations a layer (each a
dispatch over a tensor of a few thousand values) and in attention's batched products of 3 x 64
matrices as in its matrix products; three fused kernels a layer (``add_norm``, ``silu_mul``,
``attend``) cut SmolLM2's bf16 step from 34 to ~21 ms (benchmarks/RESULTS.md,
"real_model_sampling.py"). No library on the package index ships such kernels for this torch
(intel-extension-for-pytorch 2.8 pins torch 2.8), so they are ours, ~300 lines of C.

The library is compiled once per source, compiler and CPU (``-march=native``: the key holds the
CPU's flags, so a cache folder shared between machines never loads another CPU's build) into
``$RLLM_CACHE_DIR/kernels`` (``~/.cache/rllm/kernels``), with OpenMP where the compiler has it
(it then shares torch's runtime: the same ``libgomp.so.1``). Without a compiler, or with
``RLLM_NATIVE_KERNELS=0`` (any value but 0/1 is refused the same way, naming it), ``load`` says
why and the fast step keeps its torch operations.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rllm.types.errors import RLLMError, StateError

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_kernels.c")
INCLUDED = Path(__file__).with_name("decode_kernels.inc")
VERSION = 2  # rllm_decode_kernels_version() of the matching source
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC")
SUFFIXES = {torch.bfloat16: "bf16", torch.float32: "f32"}
MAX_HEAD_DIM = 512  # attend keeps a head's values in stack arrays
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class NoWorkingMemory(RLLMError, MemoryError):
    """A kernel could not allocate its working memory."""


class DecodeKernels:
    """The loaded library's kernels for bfloat16 and float32 tensors (see decode_kernels.inc for
    each one's contract). The tensors passed must be contiguous, on the CPU, of one dtype."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self._library = library  # kept alive while its functions are
        self._fns: dict[torch.dtype, tuple[Any, ...]] = {}  # ctypes functions
        for dtype, suffix in SUFFIXES.items():
            add_norm = getattr(library, f"add_norm_{suffix}")
            add_norm.argtypes, add_norm.restype = [_P, _P, _P, _P, _I, _I, _F], None
            silu_mul = getattr(library, f"silu_mul_{suffix}")
            silu_mul.argtypes, silu_mul.restype = [_P, _P, _I, _I, ctypes.c_int], None
            attend = getattr(library, f"attend_{suffix}")
            # qkv cos sin q_norm k_norm eps keys values attention out; rows heads kv_heads dim width
            # column steps; scale threads
            attend.argtypes = [*[_P] * 5, _F, *[_P] * 4, *[_I] * 7, _F, ctypes.c_int]
            attend.restype = ctypes.c_int
            self._fns[dtype] = (add_norm, silu_mul, attend)

    def supports(self, dtype: torch.dtype, head_dim: int) -> bool:
        return dtype in self._fns and 0 < head_dim <= MAX_HEAD_DIM

    def add_norm(
        self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor, eps: float
    ) -> None:
        """``h += delta`` (in place; None: no add), then ``out = weight * RMSNorm(h)``; [rows, n]."""
        rows, n = h.shape
        self._fns[h.dtype][0](
            h.data_ptr(),
            None if delta is None else delta.data_ptr(),
            weight.data_ptr(),
            out.data_ptr(),
            rows,
            n,
            eps,
        )

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        """``out = SiLU(gate) * up`` for ``gate_up`` = [gate | up] [rows, 2 * inter]."""
        rows, inter = out.shape
        self._fns[out.dtype][1](gate_up.data_ptr(), out.data_ptr(), rows, inter, torch.get_num_threads())

    def attend(
        self,
        qkv: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        head_norms: tuple[torch.Tensor | None, torch.Tensor | None],
        eps: float,
        buffers: tuple[torch.Tensor, torch.Tensor],
        column: int,
        attention: torch.Tensor,
        out: torch.Tensor,
        heads: int,
        steps: int = 1,
    ) -> None:
        """One layer's attention for ``steps`` tokens a row (qkv, rotary and out rows: row-major
        [rows, steps]): token t's key and value into column ``column + t`` of the cache
        ``buffers`` [rows, kv_heads, width, dim]; it attends to the columns up to ``column + t``
        where ``attention`` [rows, column + steps] (int64) is not 0; ``out`` [rows * steps, heads
        * dim]."""
        keys, values = buffers
        rows, kv_heads, width, dim = keys.shape
        if not (
            keys.is_contiguous()
            and values.is_contiguous()
            and values.shape == keys.shape
            and attention.dtype == torch.int64
            and attention.is_contiguous()
            and attention.shape == (rows, column + steps)
            and column + steps <= width
            and qkv.shape == (rows * steps, (heads + 2 * kv_heads) * dim)
            and out.shape == (rows * steps, heads * dim)
        ):
            raise StateError(  # the caller's bug, not the user's: the buffers are ours
                f"attend: buffers {tuple(keys.shape)}, qkv {tuple(qkv.shape)}, out {tuple(out.shape)}, "
                f"attention {tuple(attention.shape)} {attention.dtype}, column {column}, steps {steps}"
            )
        cos, sin = rotary
        q_norm, k_norm = head_norms
        failed = self._fns[qkv.dtype][2](
            qkv.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            None if q_norm is None else q_norm.data_ptr(),
            None if k_norm is None else k_norm.data_ptr(),
            eps,
            keys.data_ptr(),
            values.data_ptr(),
            attention.data_ptr(),
            out.data_ptr(),
            rows,
            heads,
            kv_heads,
            dim,
            width,
            column,
            steps,
            dim**-0.5,
            torch.get_num_threads(),
        )
        if failed:
            raise NoWorkingMemory(f"attend: no memory for {rows} rows x {column + steps} columns of scores")


def compiler() -> str | None:
    """``$CC``, else ``cc``, ``gcc`` or ``clang`` on the PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _cpu() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    wanted = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(wanted))  # one copy per distinct line (every core repeats them)


def _compile(cc: str, target: Path) -> str:
    """Compile the library into ``target`` (atomically: a finished file or none); "" or why not."""
    target.parent.mkdir(parents=True, exist_ok=True)
    errors = ""
    for openmp in (("-fopenmp",), ()):  # Apple's clang has no OpenMP: single-threaded kernels then
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
        os.close(fd)
        cmd = [cc, *FLAGS, *openmp, "-I", str(SOURCE.parent), str(SOURCE), "-o", tmp, "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            os.replace(tmp, target)
            return ""
        os.unlink(tmp)
        errors = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return f"{cc} failed: {errors}"


def build() -> tuple[DecodeKernels | None, str]:
    """The kernels, compiled if not cached yet; or None and why not."""
    switch = os.environ.get("RLLM_NATIVE_KERNELS", "1").strip().lower()
    if switch in ("0", "false", "off", "no"):
        return None, f"RLLM_NATIVE_KERNELS={switch}"
    if switch not in ("1", "true", "on", "yes"):  # a typo must not read as "on" (or "off") silently
        return None, f"RLLM_NATIVE_KERNELS must be 0 or 1, got {switch!r}"
    cc = compiler()
    if cc is None:
        return None, "no C compiler (cc, gcc or clang) on the PATH"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    except OSError as exc:
        return None, f"{cc}: {exc}"
    from rllm.backends.tinker.model_cache import cache_root  # its module reads GGUF: only when building

    key = hashlib.sha256()
    for part in (
        SOURCE.read_bytes(),
        INCLUDED.read_bytes(),
        " ".join(FLAGS).encode(),
        version.encode(),
        _cpu().encode(),
    ):
        key.update(hashlib.sha256(part).digest())
    path = cache_root() / "kernels" / f"decode-{key.hexdigest()[:20]}.so"
    try:
        if not path.is_file():
            started = time.perf_counter()
            reason = _compile(cc, path)
            if reason:
                return None, reason
            logger.info(
                "native decode kernels compiled into %s (%.1f s)", path, time.perf_counter() - started
            )
        library = ctypes.CDLL(str(path))
        if library.rllm_decode_kernels_version() != VERSION:
            return None, f"{path} is version {library.rllm_decode_kernels_version()}, not {VERSION}"
        return DecodeKernels(library, path), ""
    except (OSError, AttributeError) as exc:
        return None, f"{path}: {exc}"


@functools.cache
def load() -> DecodeKernels | None:
    """The process's kernels (built once); None, with one warning, where they cannot be built."""
    kernels, reason = build()
    if kernels is None:
        logger.warning(
            "local sampler: native decode kernels unavailable (%s); the fast decode step uses torch "
            "operations (about 1.5x slower a step at 32 rows)",
            reason,
        )
    return kernels
