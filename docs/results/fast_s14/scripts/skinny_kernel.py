"""Session 14, tried and not kept in the library: a linear layer for a verify bucket (16 to 64 rows),
``y = x @ W^T + b`` on tensor cores, one pass over ``W``.

A tree-verify forward of a large model multiplies a bucket of 16 to 64 token rows by every weight matrix. With so
few rows the work is still bound by reading ``W`` (a 64-row product does 64 multiply-adds per weight read), but
the rows are too many for :func:`~specdec.kernels.linear_rows` (a float32 product per row, no tensor cores) and too
few for cuBLAS's general kernels to stream ``W`` at the memory's bandwidth on every shape: on the H200 (bf16,
Llama-2-7B, 64 rows, session 13) cuBLAS read the ``o`` and ``down`` projections at 2.7 and 3.1 TB/s against 4.3.

Here each program owns ``BLOCK_N`` output features and one of ``SPLIT`` slices of the ``K`` inputs: it walks its
slice in ``BLOCK_K`` tiles, one ``tl.dot`` per tile of all the rows (``BLOCK_M``, 16 to 64) against the weight
tile, accumulating in float32. One slice: the program adds the bias and writes ``y``. More slices (when
``N / BLOCK_N`` programs cannot fill the GPU): each writes its float32 partial product and a second launch sums
the slices in a fixed order, adds the bias and rounds (deterministic: no atomics).

Reference: ``F.linear`` (:func:`linear_skinny_ref`). Results equal it up to float rounding (the summation order
differs); float32 inputs multiply in full float32 (no TF32).
"""
from __future__ import annotations

import torch

from specdec.kernels._dispatch import use_kernel
from specdec.kernels._triton import INTERPRETED, as_rows, jit, next_pow2, tl
from specdec.kernels.gemv import check_linear, linear_rows_ref

__all__ = ["SKINNY_MAX_ROWS", "linear_skinny", "linear_skinny_ref", "skinny_config"]

#: The most rows (``x``'s leading dims flattened) the kernel takes; larger inputs run ``F.linear``.
SKINNY_MAX_ROWS = 64


linear_skinny_ref = linear_rows_ref  # F.linear (this record shares the GEMV module's reference and checks)


def skinny_config(rows: int, n: int, k: int, sms: int = 132) -> tuple[int, int, int, int, int]:
    """``(BLOCK_N, BLOCK_K, SPLIT, num_warps, num_stages)`` for ``rows`` rows of a ``[n, k]`` weight.

    Enough programs to cover ``sms`` streaming multiprocessors about once: ``BLOCK_N`` outputs each (64, or 32
    for narrow matrices), the inputs split in two or four slices when the output blocks alone are fewer than the
    multiprocessors.

    Args:
        rows: ``M`` (at most :data:`SKINNY_MAX_ROWS`).
        n: ``N``, output features.
        k: ``K``, input features.
        sms: the device's multiprocessors.
    """
    block_n = 64 if n >= 64 * sms else 32
    blocks = -(-n // block_n)
    split = 1
    while blocks * split < sms and split < 4 and k // (split * 2) >= 512:
        split *= 2
    return block_n, 128, split, 4, 4


@jit
def _skinny_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, M, N, K, K_PER, sxm, swn, sym,
                   HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per (``BLOCK_N`` outputs, slice of ``K_PER`` inputs): ``acc = x[:, slice] @ w[n, slice]^T``;
    ``PARTIAL``: written in float32 to ``part[slice, m, n]``, else bias added and written to ``y``."""
    pid_n = tl.program_id(0)
    piece = tl.program_id(1)
    m = tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_in, n_in = m < M, n < N
    lo = piece * K_PER
    hi = tl.minimum(lo + K_PER, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(lo, hi, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        k_in = k < hi
        x = tl.load(x_ptr + m[:, None] * sxm + k[None, :], mask=m_in[:, None] & k_in[None, :], other=0.0)
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * swn + k[None, :], mask=n_in[:, None] & k_in[None, :],
                    other=0.0)
        if IEEE:
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    if PARTIAL:
        tl.store(part_ptr + (piece * M + m[:, None]) * N + n[None, :], acc, mask=m_in[:, None] & n_in[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=n_in, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + m[:, None] * sym + n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=m_in[:, None] & n_in[None, :])


@jit
def _skinny_sum_kernel(part_ptr, b_ptr, y_ptr, M, N, SPLIT, sym, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """One program per ``BLOCK`` outputs of one row: the slices' partial products summed in order, plus bias."""
    row = tl.program_id(0)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    n_in = n < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for piece in range(0, SPLIT):
        acc += tl.load(part_ptr + (piece * M + row) * N + n, mask=n_in, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_in, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * sym + n, acc.to(y_ptr.dtype.element_ty), mask=n_in)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def _linear_skinny_triton(x, weight, bias, config=None) -> torch.Tensor:
    rows, n, k = check_linear("linear_skinny", x, weight, bias)
    x2 = as_rows(x)
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if not (rows and n):
        return y.view(*x.shape[:-1], n)
    block_n, block_k, split, num_warps, num_stages = config or skinny_config(rows, n, k, _sms(x.device))
    k_per = _cdiv(_cdiv(k, split), block_k) * block_k  # each slice a whole number of tiles
    split = _cdiv(k, k_per)
    part = torch.empty(split, rows, n, dtype=torch.float32, device=x.device) if split > 1 else y
    dummy_bias = bias if bias is not None else weight
    _skinny_kernel[(-(-n // block_n), split)](
        x2, weight, dummy_bias, y, part, rows, n, k, k_per, x2.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, PARTIAL=split > 1, IEEE=x.dtype == torch.float32 or INTERPRETED,
        BLOCK_M=max(16, next_pow2(rows)), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
        num_stages=num_stages,
    )
    if split > 1:
        block = min(1024, next_pow2(n))
        _skinny_sum_kernel[(rows, -(-n // block))](part, dummy_bias, y, rows, n, split, y.stride(0),
                                                    HAS_BIAS=bias is not None, BLOCK=block)
    return y.view(*x.shape[:-1], n)


def linear_skinny(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for inputs of at most :data:`SKINNY_MAX_ROWS` rows, as one pass over
    ``weight`` on tensor cores (the Triton kernel on CUDA, ``F.linear`` otherwise and for more rows).

    Args:
        x: Shape ``[..., K]``; its leading dims flattened are the rows ``M``.
        weight: Shape ``[N, K]``, ``x``'s dtype.
        bias: Shape ``[N]`` or ``None``.
        config: ``(BLOCK_N, BLOCK_K, SPLIT, num_warps, num_stages)`` to force (benchmarks, tests); default
            :func:`skinny_config`.

    Returns:
        Shape ``[..., N]`` in ``x``'s dtype (accumulated in float32).

    Raises:
        ValueError: mismatched shapes or dtypes, naming the argument.

    Example:
        >>> x, w = torch.randn(3, 8), torch.randn(5, 8)
        >>> torch.allclose(linear_skinny(x, w), x @ w.T)
        True
    """
    rows, _, _ = check_linear("linear_skinny", x, weight, bias)
    if rows > SKINNY_MAX_ROWS or not use_kernel("linear_skinny", x, weight):
        return linear_skinny_ref(x, weight, bias)
    return _linear_skinny_triton(x, weight, bias, config)
