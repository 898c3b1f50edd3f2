"""The fast decode step's native kernels (local/decode_kernels.c, built by local/native_kernels.py
with the system's C compiler: CI installs one) against torch references on random tensors:
add_norm and silu_mul element by element, attend (hypothesis over shapes, grouped heads, Qwen3's
head norms, masks with holes, one token a row or several: a decode step or a prefill) in float32 to 1e-5 and in bfloat16 to its rounding; and the
build's refusals (no compiler, a failing one, RLLM_NATIVE_KERNELS=0), each with its reason."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.backends.tinker.local import native_kernels
from rllm.backends.tinker.local.native_kernels import DecodeKernels

EPS = 1e-6


@pytest.fixture(scope="module")
def kernels() -> DecodeKernels:
    built, reason = native_kernels.build()
    assert built is not None, reason  # a machine without a C compiler: install one (CI does)
    return built


def _norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaRMSNorm: in float32, cast back, then scaled."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=EPS).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_norm_and_silu_mul_equal_torch(kernels: DecodeKernels, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    h, delta = torch.randn(5, 96).to(dtype), (3 * torch.randn(5, 96)).to(dtype)
    weight = torch.empty(96).uniform_(0.5, 1.5).to(dtype)
    want_h = h + delta
    want = _norm(want_h, weight)
    out = torch.empty_like(h)
    kernels.add_norm(h, delta, weight, out, EPS)  # h in place
    assert torch.equal(h, want_h)
    # float32: a sum in another order; bf16: a rare last-bit tie on that
    torch.testing.assert_close(out, want, atol=1e-6 if dtype == torch.float32 else 0.02, rtol=1e-5)
    kernels.add_norm(h, None, weight, out, EPS)  # no residual: the norm alone
    torch.testing.assert_close(out, want, atol=1e-6 if dtype == torch.float32 else 0.02, rtol=1e-5)

    gate_up = (4 * torch.randn(7, 2 * 200)).to(dtype)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # exp's clamped ends and zero
    act = torch.empty(7, 200, dtype=dtype)
    kernels.silu_mul(gate_up, act)
    want_act = F.silu(gate_up[:, :200]) * gate_up[:, 200:]
    torch.testing.assert_close(act, want_act, atol=1e-6 if dtype == torch.float32 else 0.02, rtol=1e-5)


def _attend_reference(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norms: tuple[torch.Tensor, torch.Tensor] | None,
    keys: torch.Tensor,
    values: torch.Tensor,
    attention: torch.Tensor,
    heads: int,
    steps: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attend in torch operations, as transformers' layer does it (a causal mask over the steps)."""
    rows, kv_heads, _, dim = keys.shape
    column = attention.shape[1] - steps
    split = qkv.view(rows, steps, heads + 2 * kv_heads, dim)
    q, k, v = split[:, :, :heads], split[:, :, heads : heads + kv_heads], split[:, :, heads + kv_heads :]
    if norms is not None:
        q, k = _norm(q, norms[0]), _norm(k, norms[1])
    cos, sin = cos.view(rows, steps, 1, dim), sin.view(rows, steps, 1, dim)

    def rope(x: torch.Tensor) -> torch.Tensor:
        half = dim // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    keys, values = keys.clone(), values.clone()
    keys[:, :, column : column + steps], values[:, :, column : column + steps] = (
        rope(k).transpose(1, 2),
        v.transpose(1, 2),
    )
    query = (
        rope(q).view(rows, steps, kv_heads, heads // kv_heads, dim).permute(0, 2, 1, 3, 4)
    )  # r, kv, t, g, d
    seen_keys, seen_values = keys[:, :, : column + steps], values[:, :, : column + steps]
    scores = torch.einsum("rktgd,rkjd->rktgj", query, seen_keys).float() * dim**-0.5
    causal = torch.arange(column + steps)[None, :] <= column + torch.arange(steps)[:, None]  # [t, j]
    visible = (attention[:, None, :] != 0) & causal[None]  # [r, t, j]
    scores = scores.masked_fill(~visible[:, None, :, None, :], float("-inf"))
    weights = torch.softmax(scores, -1).to(values.dtype)
    out = torch.einsum("rktgj,rkjd->rtkgd", weights, seen_values)
    return out.reshape(rows * steps, heads * dim), keys, values


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 4),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 3),
    dim=st.sampled_from([8, 24, 64, 128]),  # 64 and 128: the kernel's constant-size paths
    column=st.integers(0, 40),
    steps=st.integers(1, 4),  # 1: a decode step; more: a prefill
    spare=st.integers(0, 5),
    head_norms=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_attend_equals_the_torch_step(
    kernels: DecodeKernels,
    rows: int,
    kv_heads: int,
    group: int,
    dim: int,
    column: int,
    steps: int,
    spare: int,
    head_norms: bool,
    dtype: torch.dtype,
    seed: int,
) -> None:
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype)

    heads = kv_heads * group
    qkv = randn(rows * steps, (heads + 2 * kv_heads) * dim)
    angles = torch.rand(rows * steps, dim // 2, generator=generator) * 6.3
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    norms = (randn(dim).abs() + 0.5, randn(dim).abs() + 0.5) if head_norms else None
    width = column + steps + spare
    keys, values = randn(rows, kv_heads, width, dim), randn(rows, kv_heads, width, dim)
    attention = (torch.rand(rows, column + steps, generator=generator) > 0.3).long()
    attention[:, column:] = 1  # a row's new tokens are real (each sees itself)
    want, want_keys, want_values = _attend_reference(
        qkv, cos, sin, norms, keys, values, attention, heads, steps
    )
    out = torch.empty(rows * steps, heads * dim, dtype=dtype)
    kernels.attend(
        qkv, (cos, sin), norms or (None, None), EPS, (keys, values), column, attention, out, heads, steps
    )
    assert torch.equal(values, want_values)
    if dtype == torch.float32:
        torch.testing.assert_close(keys, want_keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-4)
    else:  # bf16 rounds at the same places; the sums' order and exp differ in the last bits
        torch.testing.assert_close(keys.float(), want_keys.float(), atol=0.05, rtol=0.02)
        assert (out.float() - want.float()).abs().mean() < 0.01


def test_attend_refuses_buffers_that_do_not_fit(kernels: DecodeKernels) -> None:
    keys = values = torch.zeros(2, 1, 4, 8)
    out = torch.empty(2, 8)
    qkv, rotary = torch.zeros(2, 24), (torch.ones(2, 8), torch.zeros(2, 8))
    with pytest.raises(RuntimeError, match="column 4"):  # past the buffer's width
        kernels.attend(qkv, rotary, (None, None), EPS, (keys, values), 4, torch.ones(2, 5).long(), out, 1)
    with pytest.raises(RuntimeError, match="attention"):  # the mask's width is not column + steps
        kernels.attend(qkv, rotary, (None, None), EPS, (keys, values), 2, torch.ones(2, 2).long(), out, 1)
    with pytest.raises(RuntimeError, match="steps 2"):  # two steps need two rows of qkv a row
        kernels.attend(qkv, rotary, (None, None), EPS, (keys, values), 1, torch.ones(2, 3).long(), out, 1, 2)


def test_the_build_is_cached_per_source_compiler_and_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLLM_CACHE_DIR", str(tmp_path))
    first, reason = native_kernels.build()
    assert first is not None, reason
    assert first.path.parent == tmp_path / "kernels"
    built_at = first.path.stat().st_mtime_ns
    again, _ = native_kernels.build()  # found, not compiled again
    assert again is not None and again.path == first.path and first.path.stat().st_mtime_ns == built_at
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [first.path.name]  # no temporary left


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"RLLM_NATIVE_KERNELS": "0"}, "RLLM_NATIVE_KERNELS=0"),
        ({"RLLM_NATIVE_KERNELS": "flase"}, "must be 0 or 1, got 'flase'"),  # a typo: said, not read as on
        ({"CC": "/bin/false"}, "/bin/false failed"),  # a compiler that fails: its error, no library
    ],
)
def test_a_build_that_cannot_run_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], reason: str
) -> None:
    monkeypatch.setenv("RLLM_CACHE_DIR", str(tmp_path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    kernels, why = native_kernels.build()
    assert kernels is None and reason in why
    assert not list(tmp_path.rglob("*.so*"))  # nothing half-written


def test_no_compiler_leaves_torch_operations_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    native_kernels.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert native_kernels.load() is None
            assert native_kernels.load() is None  # once per process
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(lines) == 1 and "no C compiler" in lines[0] and "torch operations" in lines[0]
    finally:
        native_kernels.load.cache_clear()


def test_a_cache_folder_it_cannot_write_is_a_reason_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("RLLM_CACHE_DIR", str(blocked))
    kernels, why = native_kernels.build()
    assert kernels is None and str(blocked) in why
