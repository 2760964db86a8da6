"""A linear layer for a few rows (decode steps): ``y = x @ W^T + b`` read as one pass over ``W``.

A decode step of a large model multiplies one token's (or a few tokens') activations by every weight matrix: the
work is a matrix-vector product bound by reading ``W``. cuBLAS picks general GEMM kernels for these shapes that do
not always stream ``W`` at the memory's bandwidth; this kernel does nothing else. Each program owns ``BLOCK_N``
output features, walks the ``K`` input features in chunks of ``BLOCK_K`` (coalesced loads along ``W``'s rows),
multiplies every one of the ``M <= 16`` input rows in float32 and writes ``BLOCK_N`` outputs per row.

Used by :class:`specdec.fused.FusedDecoder` for one-row forwards on CUDA (:data:`DECODER_GEMV_ROWS`: the plain
decode step of the fast path at batch 1); the reference is ``F.linear``. Results equal ``F.linear``'s up to float
rounding (the summation order differs): greedy decoding on bfloat16 may pick another token where two logits tie
within rounding, as any change of kernel may.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._dispatch import use_kernel
from ._triton import as_rows, jit, next_pow2, pdl_launch, pdl_start, tl

__all__ = ["GEMV_MAX_ROWS", "DECODER_GEMV_ROWS", "linear_rows", "linear_rows_ref", "gemv_config"]

#: The most rows (``x``'s leading dims flattened) the kernel takes; larger inputs run ``F.linear``.
GEMV_MAX_ROWS = 16

#: Rows up to which :class:`specdec.fused.FusedDecoder` uses the kernel by default: one. Measured on the H200
#: (bf16, the 7B shape's matrices, CUDA-graph replays): for one row the kernel streamed the weights at 3.6-4.4 TB/s
#: against cuBLAS's 3.2-4.0; for 4 and 16 rows it was 1.5-8x slower than cuBLAS.
DECODER_GEMV_ROWS = 1


def linear_rows_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Reference for :func:`linear_rows`: ``F.linear(x, weight, bias)``.

    Args:
        x: Shape ``[..., K]``.
        weight: Shape ``[N, K]``.
        bias: Shape ``[N]`` or ``None``.

    Returns:
        Shape ``[..., N]`` in ``x``'s dtype.
    """
    return F.linear(x, weight, bias)


def gemv_config(rows: int, n: int, k: int) -> tuple[int, int, int]:
    """``(BLOCK_N, BLOCK_K, num_warps)`` for ``rows`` rows of a ``[n, k]`` weight.

    One row (the measured case, H200, bf16, Llama-2-7B's matrices): 4 outputs x 1024 inputs per step for matrices
    of at least 2^25 elements, 8 x 512 below (3.8-4.4 TB/s, 0-28% faster than cuBLAS per matrix). More rows
    shrink ``BLOCK_K`` so the float32 partial products (``BLOCK_M x BLOCK_N x BLOCK_K``) stay in registers; on the
    H200 those were slower than cuBLAS (see :data:`DECODER_GEMV_ROWS`).
    """
    block_m = next_pow2(rows)
    if block_m == 1:
        big = n * k >= 1 << 25
        block_n = 4 if big or n < 2048 else 8
        return block_n, min(1024 if big else 512, next_pow2(k)), 4
    block_n = 4 if n >= 8192 or n < 2048 else 8
    block_k = max(32, min(512, next_pow2(k)) // block_m)
    num_warps = 4 if block_n * block_k * block_m <= 8192 else 8
    return block_n, block_k, num_warps


@jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PDL: tl.constexpr = False):
    """One program per ``BLOCK_N`` output features, every row: ``acc[m, n] += sum_k x[m, k] * w[n, k]``."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_in, m_in = n < N, m < M
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        k_in = k < K
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * stride_wn + k[None, :], mask=n_in[:, None] & k_in[None, :],
                    other=0.0)
        x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=m_in[:, None] & k_in[None, :], other=0.0)
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    out = tl.sum(acc, axis=2)
    if HAS_BIAS:
        out += tl.load(b_ptr + n, mask=n_in, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + m[:, None] * stride_ym + n[None, :], out.to(y_ptr.dtype.element_ty),
             mask=m_in[:, None] & n_in[None, :])


def check_linear(op: str, x, weight, bias) -> tuple[int, int, int]:
    """``(rows, N, K)`` of a linear call, or a ``ValueError`` naming ``op`` and the bad argument (shared by
    :func:`linear_rows` and :func:`specdec.kernels.linear_skinny`)."""
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or not x.dtype.is_floating_point:
        raise ValueError(f"{op}: x must be a float tensor of shape [..., K]")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"{op}: weight must have shape [N, K] with K = x.shape[-1] = {x.shape[-1]}, got "
                         f"{tuple(getattr(weight, 'shape', ()))}")
    if weight.dtype != x.dtype:
        raise ValueError(f"{op}: x ({x.dtype}) and weight ({weight.dtype}) must share a dtype (cast x)")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (weight.shape[0],)):
        raise ValueError(f"{op}: bias must have shape [N] = [{weight.shape[0]}] or be None")
    rows = x.numel() // max(x.shape[-1], 1)
    return rows, weight.shape[0], weight.shape[1]


def linear_operands(op: str, x, weight, bias):
    """:func:`check_linear`, then what a launcher passes: ``(x2 [rows, K] unit-stride, weight unit-stride along K,
    y [rows, N] uninitialised, rows, N, K)``."""
    rows, n, k = check_linear(op, x, weight, bias)
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    return as_rows(x), weight, torch.empty(rows, n, dtype=x.dtype, device=x.device), rows, n, k


def _linear_rows_triton(x, weight, bias, config=None) -> torch.Tensor:
    x2, weight, y, rows, n, k = linear_operands("linear_rows", x, weight, bias)
    if rows and n:
        block_n, block_k, num_warps = config or gemv_config(rows, n, k)
        _gemv_kernel[(_cdiv(n, block_n),)](
            x2, weight, bias if bias is not None else weight, y, rows, n, k, x2.stride(0), weight.stride(0),
            y.stride(0), HAS_BIAS=bias is not None, BLOCK_M=next_pow2(rows), BLOCK_N=block_n, BLOCK_K=block_k,
            num_warps=num_warps, **pdl_launch(),
        )
    return y.view(*x.shape[:-1], n)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def linear_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for inputs of at most :data:`GEMV_MAX_ROWS` rows, as one streaming pass over
    ``weight`` (the Triton kernel on CUDA, ``F.linear`` otherwise and for more rows).

    Args:
        x: Shape ``[..., K]``; its leading dims flattened are the rows ``M``.
        weight: Shape ``[N, K]``, ``x``'s dtype.
        bias: Shape ``[N]`` or ``None``.
        config: ``(BLOCK_N, BLOCK_K, num_warps)`` to force (benchmarks); default :func:`gemv_config`.

    Returns:
        Shape ``[..., N]`` in ``x``'s dtype (accumulated in float32).

    Raises:
        ValueError: mismatched shapes or dtypes, naming the argument.
    """
    rows, _, _ = check_linear("linear_rows", x, weight, bias)
    if rows > GEMV_MAX_ROWS or not use_kernel("linear_rows", x, weight):
        return linear_rows_ref(x, weight, bias)
    return _linear_rows_triton(x, weight, bias, config)
