"""Session 20, tried and not kept in the library (see docs/fast_path.md, session 20): a linear layer with float8
weights for a few rows: ``y = (x @ W8^T) * scale + b``, one pass over ``W8`` (session 14's skinny kernel, the
weights read as float8).

A draft head's forward at batch 1 multiplies a handful of rows (the tree's frontier, the accepted tokens) by every
weight matrix of one decoder layer, ``fc`` and the ``lm_head``: its time is the time to read those weights. Stored
as float8 (e4m3) with one float32 scale per output feature, they are half the bytes of bfloat16 ones. Drafts are
proposals that the target verifies, so a drafter on rounded weights stays **lossless**: only its drafts (and
hence tau) can change. The target's weights are never touched.

Each program owns ``BLOCK_N`` output features and one of ``SPLIT`` slices of the ``K`` inputs; it walks the slice in
``BLOCK_K`` tiles, converts the weight tile from float8 to the activations' dtype (exact: every e4m3 value is a
bfloat16 / float16 / float32 value) and multiplies all rows at once on tensor cores, accumulating in float32.
The scale multiplies the accumulated sum. One slice: the program adds the bias and writes ``y``; more slices (when
the output blocks alone cannot fill the GPU): each writes its float32 partial product and a second launch sums the
slices in a fixed order (deterministic: no atomics).

Reference: :func:`linear_fp8_ref` (the same product in float32 with torch ops). Results equal it up to float
rounding (the summation order differs).
"""
from __future__ import annotations

import os
import sys

import torch

from specdec.kernels._dispatch import use_kernel
from specdec.kernels._triton import INTERPRETED, as_rows, jit, next_pow2, tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fast_s14", "scripts"))
from skinny_kernel import _cdiv, _skinny_sum_kernel, _sms  # noqa: E402  (session 14's record: the same sum)

__all__ = ["FP8_DTYPE", "FP8_MAX_ROWS", "quantize_fp8", "dequantize_fp8", "linear_fp8", "linear_fp8_ref",
           "fp8_linear_config"]

#: The float8 format of the weights: e4m3 (3 mantissa bits, largest finite 448).
FP8_DTYPE = torch.float8_e4m3fn

#: The most rows (``x``'s leading dims flattened) the kernel takes; more run :func:`linear_fp8_ref`.
FP8_MAX_ROWS = 64

_E4M3_MAX = 448.0


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Round a weight matrix to float8 e4m3 with one scale per output feature (row).

    ``scale[n] = max_k |W[n, k]| / 448`` (1 for an all-zero row) and ``W8[n, k] = round(W[n, k] / scale[n])``, so
    every row uses the format's whole range; ``W8 * scale`` approximates ``W`` within e4m3's rounding (relative
    error at most 2^-4 per entry, less for a row's largest entries).

    Args:
        weight: Shape ``[N, K]``, any float dtype.

    Returns:
        ``(w8, scale)``: Shape ``[N, K]`` :data:`FP8_DTYPE` and Shape ``[N]`` float32, on ``weight``'s device.

    Raises:
        ValueError: ``weight`` not a 2-D float tensor, or not finite.

    Example:
        >>> w = torch.randn(4, 8)
        >>> w8, scale = quantize_fp8(w)
        >>> bool(((dequantize_fp8(w8, scale) - w).abs() <= w.abs() / 16 + 1e-6).all())
        True
    """
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.dtype.is_floating_point:
        raise ValueError(f"quantize_fp8: weight must be a 2-D float tensor [N, K], got "
                         f"{getattr(weight, 'dtype', type(weight))} of shape {tuple(getattr(weight, 'shape', ()))}")
    w = weight.detach().float()
    if not bool(torch.isfinite(w).all()):
        raise ValueError("quantize_fp8: weight holds inf or nan; quantize a finite weight")
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / _E4M3_MAX, torch.ones_like(amax))
    w8 = (w / scale[:, None]).clamp(-_E4M3_MAX, _E4M3_MAX).to(FP8_DTYPE)
    return w8, scale


def dequantize_fp8(w8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``W8 * scale`` as a ``dtype`` matrix (the weight :func:`quantize_fp8` rounded to).

    Args:
        w8: Shape ``[N, K]`` :data:`FP8_DTYPE`.
        scale: Shape ``[N]`` float32.
        dtype: the result's dtype.

    Returns:
        Shape ``[N, K]``.
    """
    return (w8.float() * scale.float()[:, None]).to(dtype)


def linear_fp8_ref(x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
    """Reference for :func:`linear_fp8`: ``(x @ W8^T) * scale + b`` in float32, rounded to ``x``'s dtype once.

    Args:
        x: Shape ``[..., K]``.
        w8: Shape ``[N, K]`` :data:`FP8_DTYPE`.
        scale: Shape ``[N]`` float32.
        bias: Shape ``[N]`` or ``None``.

    Returns:
        Shape ``[..., N]`` in ``x``'s dtype.
    """
    y = torch.matmul(x.float(), w8.float().t()) * scale.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def fp8_linear_config(rows: int, n: int, k: int, sms: int = 132) -> tuple[int, int, int, int, int]:
    """``(BLOCK_N, BLOCK_K, SPLIT, num_warps, num_stages)`` for ``rows`` rows of an ``[n, k]`` float8 weight.

    Enough programs to cover the ``sms`` multiprocessors about once: ``BLOCK_N`` outputs each (64, or 32 for
    narrow matrices) and the inputs cut in up to four slices while the output blocks alone are too few.

    Args:
        rows: ``M``.
        n: ``N``, output features.
        k: ``K``, input features.
        sms: the device's multiprocessors.
    """
    block_n = 64 if n >= 64 * sms else 32
    blocks = -(-n // block_n)
    split = 1
    while blocks * split < sms and split < 4 and k // (split * 2) >= 1024:
        split *= 2
    return block_n, 256, split, 4, 4


@jit
def _fp8_linear_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, M, N, K, K_PER, sxm, swn, sym,
                       HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP: tl.constexpr):
    """One program per (``BLOCK_N`` outputs, slice of ``K_PER`` inputs): ``acc = x[:, slice] @ w8[n, slice]^T``,
    times ``scale[n]``; ``PARTIAL``: written in float32 to ``part[slice, m, n]``, else bias added and written.
    ``SWAP``: the product is formed as ``w8 @ x^T`` (the weight tile the left operand, outputs along the tensor
    cores' long side), then transposed."""
    pid_n = tl.program_id(0)
    piece = tl.program_id(1)
    m = tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_in, n_in = m < M, n < N
    lo = piece * K_PER
    hi = tl.minimum(lo + K_PER, K)
    if SWAP:
        acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(lo, hi, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        k_in = k < hi
        x = tl.load(x_ptr + m[:, None] * sxm + k[None, :], mask=m_in[:, None] & k_in[None, :], other=0.0)
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * swn + k[None, :], mask=n_in[:, None] & k_in[None, :],
                    other=0.0)
        if SWAP:
            if IEEE:
                acc_t = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), acc_t, input_precision="ieee")
            else:
                acc_t = tl.dot(w.to(x.dtype), tl.trans(x), acc_t)
        elif IEEE:
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
    if SWAP:
        acc = tl.trans(acc_t)
    acc = acc * tl.load(s_ptr + n, mask=n_in, other=0.0)[None, :]
    if PARTIAL:
        tl.store(part_ptr + (piece * M + m[:, None]) * N + n[None, :], acc, mask=m_in[:, None] & n_in[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=n_in, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + m[:, None] * sym + n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=m_in[:, None] & n_in[None, :])


def _check(x, w8, scale, bias) -> tuple[int, int, int]:
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or not x.dtype.is_floating_point:
        raise ValueError("linear_fp8: x must be a float tensor of shape [..., K]")
    if not isinstance(w8, torch.Tensor) or w8.dim() != 2 or w8.shape[1] != x.shape[-1]:
        raise ValueError(f"linear_fp8: w8 must have shape [N, K] with K = x.shape[-1] = {x.shape[-1]}, got "
                         f"{tuple(getattr(w8, 'shape', ()))}")
    if w8.dtype != FP8_DTYPE:
        raise ValueError(f"linear_fp8: w8 must be {FP8_DTYPE} (quantize_fp8 makes it), got {w8.dtype}")
    if not isinstance(scale, torch.Tensor) or tuple(scale.shape) != (w8.shape[0],) or scale.dtype != torch.float32:
        raise ValueError(f"linear_fp8: scale must be float32 of shape [N] = [{w8.shape[0]}] (quantize_fp8 makes it)")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (w8.shape[0],)):
        raise ValueError(f"linear_fp8: bias must have shape [N] = [{w8.shape[0]}] or be None")
    rows = x.numel() // max(x.shape[-1], 1)
    return rows, w8.shape[0], w8.shape[1]


def _linear_fp8_triton(x, w8, scale, bias, config=None) -> torch.Tensor:
    rows, n, k = _check(x, w8, scale, bias)
    x2 = as_rows(x)
    if w8.stride(-1) != 1:
        w8 = w8.contiguous()
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if not (rows and n):
        return y.view(*x.shape[:-1], n)
    block_n, block_k, split, num_warps, num_stages, *rest = config or fp8_linear_config(rows, n, k, _sms(x.device))
    swap = bool(rest and rest[0])
    k_per = _cdiv(_cdiv(k, split), block_k) * block_k  # each slice a whole number of tiles
    split = _cdiv(k, k_per)
    part = torch.empty(split, rows, n, dtype=torch.float32, device=x.device) if split > 1 else y
    dummy_bias = bias if bias is not None else scale
    _fp8_linear_kernel[(_cdiv(n, block_n), split)](
        x2, w8, scale, dummy_bias, y, part, rows, n, k, k_per, x2.stride(0), w8.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, PARTIAL=split > 1, IEEE=x.dtype == torch.float32 or INTERPRETED,
        BLOCK_M=max(16, next_pow2(rows)), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
        num_stages=num_stages, SWAP=swap,
    )
    if split > 1:
        block = min(1024, next_pow2(n))
        _skinny_sum_kernel[(rows, _cdiv(n, block))](part, dummy_bias, y, rows, n, split, y.stride(0),
                                                    HAS_BIAS=bias is not None, BLOCK=block)
    return y.view(*x.shape[:-1], n)


def linear_fp8(x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None, *,
               config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """``(x @ W8^T) * scale + b`` for float8 weights (:func:`quantize_fp8`), as one pass over ``W8`` (the Triton
    kernel on CUDA for at most :data:`FP8_MAX_ROWS` rows, :func:`linear_fp8_ref` otherwise).

    Args:
        x: Shape ``[..., K]``; its leading dims flattened are the rows ``M``.
        w8: Shape ``[N, K]`` :data:`FP8_DTYPE`.
        scale: Shape ``[N]`` float32.
        bias: Shape ``[N]`` or ``None``.
        config: ``(BLOCK_N, BLOCK_K, SPLIT, num_warps, num_stages)`` to force (benchmarks, tests); default
            :func:`fp8_linear_config`.

    Returns:
        Shape ``[..., N]`` in ``x``'s dtype (accumulated in float32).

    Raises:
        ValueError: mismatched shapes or dtypes, naming the argument.

    Example:
        >>> w8, scale = quantize_fp8(torch.randn(5, 8))
        >>> x = torch.randn(3, 8)
        >>> torch.allclose(linear_fp8(x, w8, scale), x @ dequantize_fp8(w8, scale).T, atol=1e-5)
        True
    """
    rows, _, _ = _check(x, w8, scale, bias)
    if rows > FP8_MAX_ROWS or not use_kernel("linear_fp8", x, w8, scale):
        return linear_fp8_ref(x, w8, scale, bias)
    return _linear_fp8_triton(x, w8, scale, bias, config)
