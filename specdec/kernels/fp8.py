"""A linear layer on float8 weights for a draft head: ``y ~= x @ W^T + b`` with ``W`` stored as float8 e4m3, the
rows rounded to float8 too, both multiplied on the H200's float8 tensor cores.

A draft head's forward at batch 1 (a tree level of 10 rows, an update over a few accepted tokens) is the time to
read its weights: at the Llama-2-7B shape one EAGLE-1 head forward reads 538 MB in bfloat16, six per EAGLE-2 step.
Stored as float8 they are half the bytes. A drafter on rounded weights stays **lossless**: the target verifies
every draft, so only the drafts (hence tau) can change; the target's weights are never touched.

Two launches per call:

1. :func:`quantize_fp8_rows`: each row of ``x`` scaled by ``448 / max|x_row|`` and rounded to the nearest e4m3
   value (ties to even); the scale ``max|x_row| / 448`` kept in float32 (all-zero rows: scale 1);
2. the product: each program owns ``BLOCK_N`` output features and all of a block of up to 64 rows, walks ``K`` in
   ``BLOCK_K`` chunks (float8 tiles straight from memory into the tensor cores, ``num_stages`` loads in flight),
   accumulates in float32 and scales by ``w_scale[n] * x_scale[m]`` once at the end, then adds the bias. For
   matrices with few output blocks ``K`` is split in two and a third launch sums the halves in a fixed order.

Session 20 multiplied bf16 rows by float8 weights converted in registers (1.6-2.5 TB/s of float8 bytes); rounding
the rows in the product's own loop, from a first pass over them (L2 reads by every program) or chunk by chunk (a
conversion and a rescale per chunk), were slower than this separate launch (session 23, ``docs/results/fast_s23``).

The references are :func:`quantize_fp8_rows_ref` and :func:`linear_fp8_ref`: the same rounding with torch ops and
the product of the rounded values in float32. The kernels equal them up to the summation order.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ._dispatch import use_kernel
from ._triton import as_rows, jit, next_pow2, pdl_launch, pdl_start, pdl_wait, prefetch_launch, prefetch_rows_l2, tl
from .skinny import skinny_accumulate, skinny_store, split_outputs  # the skinny kernel's loop and sums

__all__ = ["FP8_DTYPE", "FP8_MAX", "quantize_fp8_rows", "quantize_fp8_rows_ref", "dequantize_fp8",
           "linear_fp8", "linear_fp8_ref", "fp8_linear_config", "Fp8Rows", "linear_fp8_rows", "linear_fp8_rows_ref",
           "store_fp8_row"]

#: The float8 format: e4m3 without infinities (3 mantissa bits, largest finite 448).
FP8_DTYPE = torch.float8_e4m3fn

#: The largest finite :data:`FP8_DTYPE` value; a row's largest entry is scaled to it.
FP8_MAX = 448.0

_ROW_BLOCK = 64  # the product's rows per program (a tensor-core tile's short side, at most)
_ONE_PASS_MAX = 16384  # rows up to this width are rounded from registers (read once)


def _check_rows(op: str, x) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or not x.dtype.is_floating_point or x.dtype == FP8_DTYPE:
        raise ValueError(f"{op}: x must be a float tensor of shape [..., K] (bfloat16, float16 or float32), got "
                         f"{getattr(x, 'dtype', type(x))}")


def quantize_fp8_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for :func:`quantize_fp8_rows`, same arguments and results (torch ops)."""
    _check_rows("quantize_fp8_rows", x)
    xf = x.detach().float()
    amax = xf.abs().amax(dim=-1) if x.shape[-1] else xf.new_zeros(x.shape[:-1])
    if not bool(torch.isfinite(amax).all()):
        raise ValueError("quantize_fp8_rows: x holds inf or nan; quantize finite values")
    # Each float32 operation is done in float64 and rounded once to float32: the correctly rounded float32 result
    # (double rounding is innocuous for *, / at these precisions), so the same on every device and equal to the
    # kernel's IEEE division and product, whatever a backend does with a division by a Python scalar.
    nonzero = amax > 0
    top = torch.where(nonzero, amax, 1.0).double()
    inv = torch.where(nonzero, (FP8_MAX / top).float(), 1.0)
    scale = torch.where(nonzero, (top / FP8_MAX).float(), 1.0)
    q = (xf.double() * inv.double()[..., None]).float().clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


@jit
def _round_e4m3(v):
    """``v`` (float32, ``|v| <= 448``) rounded to the nearest e4m3 value, ties to even, still float32: exactly
    representable, so the cast that follows rounds nothing (and the interpreter's cast, which mishandles a carry
    into the exponent, is never asked to). The sign is kept, of zeros too."""
    bits = v.to(tl.int32, bitcast=True)
    a = tl.abs(v)
    abits = a.to(tl.int32, bitcast=True)
    lsb = (abits >> 20) & 1  # the last kept mantissa bit: ties go to even
    normal = ((abits + 0x7FFFF + lsb) & ~0xFFFFF).to(tl.float32, bitcast=True)
    # subnormals: multiples of 2^-9 (1.5 * 2^23 added and taken away rounds to an integer, ties to even)
    tiny = ((a * 512.0 + 12582912.0) - 12582912.0) * (1.0 / 512.0)
    r = tl.minimum(tl.where(a < 0.015625, tiny, normal), 448.0)
    return tl.where(bits < 0, -r, r)


@jit
def _row_scale(top, s_ptr):
    """A row's float8 scale from its largest magnitude ``top``: ``top / 448`` stored at ``s_ptr`` (1 for an all-zero
    row); returns the factor ``448 / top`` its entries are multiplied by before rounding."""
    nonzero = top > 0
    tl.store(s_ptr, tl.where(nonzero, tl.math.div_rn(top, tl.full((), 448.0, tl.float32)), 1.0))
    return tl.where(nonzero, tl.math.div_rn(tl.full((), 448.0, tl.float32), tl.where(nonzero, top, 1.0)), 1.0)


@jit
def store_fp8_row(v, offs, inside, q_row_ptr, s_ptr):
    """Row ``v`` (float32 in registers, zero outside ``inside``) rounded as :func:`quantize_fp8_rows` rounds it: the
    codes stored at ``q_row_ptr + offs``, the scale at ``s_ptr``. For kernels that produce a row a float8 product
    reads next (:class:`Fp8Rows`): the rounding then costs no launch of its own."""
    inv = _row_scale(tl.max(tl.abs(v), axis=0), s_ptr)
    tl.store(q_row_ptr + offs, _round_e4m3(v * inv).to(q_row_ptr.dtype.element_ty), mask=inside)


@jit
def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr,
                       PDL: tl.constexpr = False):
    """Program ``m``: ``amax = max_k |x[m, k]|``, ``q[m] = round(x[m] * 448 / amax)``, ``s[m] = amax / 448``.
    ``ONE_PASS`` (``K <= BLOCK``): the row is read once and kept in registers; else read twice, ``BLOCK`` at a
    time."""
    pdl_start(PDL)
    m = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    if ONE_PASS:
        x_row = tl.load(x_ptr + m * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
        store_fp8_row(x_row, offs, offs < K, q_ptr + m * K, s_ptr + m)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, K, BLOCK):
            x = tl.load(x_ptr + m * stride_xm + start + offs, mask=start + offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        top = tl.max(amax, axis=0)
        inv = _row_scale(top, s_ptr + m)
        for start in range(0, K, BLOCK):
            k = start + offs
            x = tl.load(x_ptr + m * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
            tl.store(q_ptr + m * K + k, _round_e4m3(x * inv).to(q_ptr.dtype.element_ty), mask=k < K)


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Round each row of ``x`` to float8 e4m3 with its own scale: ``x ~= q * scale[..., None]``.

    ``scale = max_k |x[..., k]| / 448`` (1 for an all-zero row) and ``q = round(x * 448 / max|x|)`` to the nearest
    e4m3 value (ties to even), so every row uses the format's whole range; the relative error of an entry is at
    most 2^-4 (less for a row's largest entries; entries below ``2^-9 * scale`` round to zero). One launch on CUDA
    (:func:`quantize_fp8_rows_ref` elsewhere). Also what a weight is stored as (one scale per output feature).

    Args:
        x: Shape ``[..., K]``, bfloat16 / float16 / float32, finite.

    Returns:
        ``(q, scale)``: Shape ``[..., K]`` :data:`FP8_DTYPE` (contiguous) and Shape ``[...]`` float32.

    Raises:
        ValueError: ``x`` not a float tensor (or already float8); on the reference path also inf / nan.

    Example:
        >>> w = torch.randn(4, 8)
        >>> q, scale = quantize_fp8_rows(w)
        >>> bool(((dequantize_fp8(q, scale) - w).abs() <= w.abs() / 16 + 1e-6).all())
        True
    """
    _check_rows("quantize_fp8_rows", x)
    if not use_kernel("quantize_fp8_rows", x) or x.numel() == 0:
        return quantize_fp8_rows_ref(x)
    x2 = as_rows(x)
    rows, k = x2.shape
    q = torch.empty(rows, k, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(rows, dtype=torch.float32, device=x.device)
    block = max(16, next_pow2(k))
    one_pass = block <= _ONE_PASS_MAX
    _quant_rows_kernel[(rows,)](x2, q, scale, k, x2.stride(0), BLOCK=block if one_pass else 4096, ONE_PASS=one_pass,
                                num_warps=8 if block > 4096 else 4, **pdl_launch())
    return q.view(x.shape), scale.view(x.shape[:-1])


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale[..., None]`` as ``dtype`` (what :func:`quantize_fp8_rows` rounded to).

    Args:
        q: Shape ``[..., K]`` :data:`FP8_DTYPE`.
        scale: Shape ``[...]`` float32.
        dtype: the result's dtype.

    Returns:
        Shape ``[..., K]``.
    """
    return (q.float() * scale.float()[..., None]).to(dtype)


def _check_linear(x, w8, w_scale, bias) -> tuple[int, int, int]:
    _check_rows("linear_fp8", x)
    if not isinstance(w8, torch.Tensor) or w8.dim() != 2 or w8.shape[1] != x.shape[-1]:
        raise ValueError(f"linear_fp8: w8 must have shape [N, K] with K = x.shape[-1] = {x.shape[-1]}, got "
                         f"{tuple(getattr(w8, 'shape', ()))}")
    if w8.dtype != FP8_DTYPE:
        raise ValueError(f"linear_fp8: w8 must be {FP8_DTYPE} (quantize_fp8_rows(weight) makes it), got {w8.dtype}")
    n = w8.shape[0]
    if not isinstance(w_scale, torch.Tensor) or tuple(w_scale.shape) != (n,) or w_scale.dtype != torch.float32:
        raise ValueError(f"linear_fp8: w_scale must be float32 of shape [N] = [{n}] (quantize_fp8_rows(weight) makes "
                         f"it), got {getattr(w_scale, 'dtype', type(w_scale))} {tuple(getattr(w_scale, 'shape', ()))}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,)):
        raise ValueError(f"linear_fp8: bias must have shape [N] = [{n}] or be None")
    return x.numel() // max(x.shape[-1], 1), n, w8.shape[1]


def linear_fp8_ref(x: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
    """Reference for :func:`linear_fp8`, same arguments and shapes: the rows rounded by
    :func:`quantize_fp8_rows_ref`, the rounded product in float32, the bias added, cast to ``x``'s dtype once."""
    _check_linear(x, w8, w_scale, bias)
    return linear_fp8_rows_ref(Fp8Rows(*quantize_fp8_rows_ref(x), x.dtype), w8, w_scale, bias)


def fp8_linear_config(rows: int, n: int, k: int) -> tuple[int, int, int, int, int]:
    """``(BLOCK_N, BLOCK_K, SPLIT, num_warps, num_stages)`` for ``rows`` rows of an ``[n, k]`` float8 weight.

    From the session 23 sweep on the H200 (the Llama-2-7B EAGLE head's six matrices, 10 rows, weights cycled past
    L2; ``docs/results/fast_s23``): 64 outputs per program, 256-wide chunks, 5 loads in flight; ``K`` split in two
    where the output blocks are under 100 and ``K`` is a multiple of 512 of at least 8,192 (the head's ``fc``).
    Session 26's sweep of the same matrices as a chain of dependent launches (7 and 10 rows, ``docs/results/fast_s26``,
    ``scripts/fp8_sweep.py``): 3 loads in flight for the wide matrices of 12,288 to 24,576 rows (``[q; k; v]`` 17.6
    -> 17.1 us, ``[gate; up]`` 28.0 -> 26.3; ``down_proj`` needs its 5: 25.0 against 18.6; so does a full 32,000-row
    ``lm_head``: 37.2 against 36.4) and ``K`` split in two where the output blocks
    make one partial wave of 100 to 132 programs (the FR-Spec ``lm_head`` of 8,192 rows: 14.7 -> 13.7 us; not for 64
    blocks, ``o_proj``: 10.0 against 9.4).
    """
    block_k = 256 if k % 256 == 0 else 128
    programs = -(-n // 64)
    one_wave = 100 <= programs <= 132 and k % 512 == 0
    split = 2 if (programs < 100 and k >= 8192 and k % 512 == 0) or one_wave else 1
    return 64, block_k, split, 4, 3 if 12288 <= n <= 24576 else 5


@jit
def _linear_fp8_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, o_ptr, c_ptr, M, N, K, K_PER, stride_wn, stride_ys,
                       HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, FIXUP: tl.constexpr, EVEN_K: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr = 0,
                       PDL: tl.constexpr = False):
    """Program ``(pid_n, pid_k, pid_m)``: ``acc[n, m] = sum_{k in split pid_k} w8[n, k] q[m, k]`` over rows
    ``pid_m * BLOCK_M ...`` (the skinny kernel's loop on float8 operands), times ``ws[n] * xs[m]``; written as
    ``y[m, n]`` (plus the bias, cast) when ``SPLIT == 1``, else as float32 partials ``y[pid_k, m, n]``. ``q`` is
    ``[M, K]`` contiguous."""
    pdl_start(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_in, m_in = n < N, m < M
    if PREFETCH > 0:  # the split's first weight bytes of each row into L2 while the kernels before this one run
        prefetch_rows_l2(w_ptr + n.to(tl.int64) * stride_wn + pid_k * K_PER,
                         tl.where(n_in, tl.minimum(K_PER, K - pid_k * K_PER), 0), PREFETCH)
    pdl_wait(PDL)
    acc = skinny_accumulate(w_ptr, x_ptr, n, m, n_in, m_in, pid_k * K_PER, K, K_PER, stride_wn, K, EVEN_K, BLOCK_M,
                            BLOCK_N, BLOCK_K)
    acc = acc * tl.load(ws_ptr + n, mask=n_in, other=0.0)[:, None] * tl.load(xs_ptr + m, mask=m_in, other=0.0)[None, :]
    tile = tl.program_id(0) + tl.num_programs(0) * tl.program_id(2)
    skinny_store(acc, b_ptr, y_ptr, o_ptr, c_ptr, tile, n, m, n_in, m_in, pid_k, N, stride_ys, HAS_BIAS, SPLIT, FIXUP)


def _linear_fp8_triton(x, w8, w_scale, bias, config=None) -> torch.Tensor:
    rows, n, k = _check_linear(x, w8, w_scale, bias)
    q, x_scale = quantize_fp8_rows(as_rows(x)) if rows and n else (None, None)
    return _fp8_product(q, x_scale, w8, w_scale, bias, x.dtype, rows, n, k, config).view(*x.shape[:-1], n)


def _fp8_product(q, x_scale, w8, w_scale, bias, dtype, rows, n, k, config=None) -> torch.Tensor:
    """``[rows, n]`` in ``dtype``: the float8 rows ``q [rows, k]`` (contiguous) times the weight, on the kernels."""
    y = torch.empty(rows, n, dtype=dtype, device=w8.device)
    if rows and n:
        w8 = w8 if w8.stride(-1) == 1 else w8.contiguous()
        block_n, block_k, split, num_warps, num_stages = config or fp8_linear_config(rows, n, k)
        k_per = -(-k // (split * block_k)) * block_k
        block_m = min(_ROW_BLOCK, max(16, next_pow2(rows)))
        grid = (-(-n // block_n), split, -(-rows // block_m))
        out = split_outputs(y, split, grid[0] * grid[2])
        b = bias if bias is not None else w_scale
        _linear_fp8_kernel[grid](
            q, x_scale, w8, w_scale, b, out.target, y, out.counter_arg, rows, n, k, k_per, w8.stride(0), out.stride,
            HAS_BIAS=bias is not None, SPLIT=split, FIXUP=out.fixup, EVEN_K=k % (split * block_k) == 0,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
            **prefetch_launch(w8),
        )
        out.finish(b, bias is not None)
    return y


def linear_fp8(x: torch.Tensor | Fp8Rows, w8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
               *, config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """``x @ (w8 * w_scale)^T + bias`` with ``x``'s rows rounded to float8 (:func:`quantize_fp8_rows`), on float8
    tensor cores (the Triton kernels on CUDA; :func:`linear_fp8_ref` elsewhere). Not ``F.linear``'s result: both
    operands are rounded (for a drafter's weights; see the module).

    Args:
        x: Shape ``[..., K]`` bfloat16 / float16 / float32 (any number of rows; a forward of up to 64 rows reads
            ``w8`` once, more rows once per 64), or those rows rounded already (:class:`Fp8Rows`: the product
            alone, :func:`linear_fp8_rows`).
        w8: Shape ``[N, K]`` :data:`FP8_DTYPE` (``quantize_fp8_rows(weight)[0]``).
        w_scale: Shape ``[N]`` float32 (``quantize_fp8_rows(weight)[1]``).
        bias: Shape ``[N]`` or ``None`` (added in float32).
        config: ``(BLOCK_N, BLOCK_K, SPLIT, num_warps, num_stages)`` to force (benchmarks); default
            :func:`fp8_linear_config`.

    Returns:
        Shape ``[..., N]`` in ``x``'s dtype (accumulated in float32).

    Raises:
        ValueError: mismatched shapes or dtypes, naming the argument.
    """
    if isinstance(x, Fp8Rows):
        return linear_fp8_rows(x, w8, w_scale, bias, config=config)
    _check_linear(x, w8, w_scale, bias)
    if not use_kernel("linear_fp8", x, w8):
        return linear_fp8_ref(x, w8, w_scale, bias)
    return _linear_fp8_triton(x, w8, w_scale, bias, config)


class Fp8Rows(NamedTuple):
    """Rows already rounded to float8 (as :func:`quantize_fp8_rows` rounds them), for :func:`linear_fp8_rows`: what
    a kernel that produces the input of a float8 product may return instead of the rows themselves
    (``add_rms_norm``, ``silu_mul``, ``embed_concat`` with ``fp8_out=True``), so the rounding costs no launch.

    Attributes:
        q: Shape ``[..., K]`` :data:`FP8_DTYPE`, contiguous.
        scale: Shape ``[...]`` float32.
        dtype: the dtype of the rows they were rounded from (the product's output dtype).
    """

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype

    @classmethod
    def of(cls, x: torch.Tensor) -> Fp8Rows:
        """``x``'s rows rounded (:func:`quantize_fp8_rows`), ``x``'s dtype kept."""
        return cls(*quantize_fp8_rows(x), x.dtype)


def linear_fp8_rows_ref(rows: Fp8Rows, w8: torch.Tensor, w_scale: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """Reference for :func:`linear_fp8_rows`, same arguments and result: the product of the rounded values in
    float32, the bias added, cast to ``rows.dtype`` once (what :func:`linear_fp8_ref` does after rounding)."""
    _check_fp8_rows(rows)
    _check_linear(torch.empty(0, rows.q.shape[-1], dtype=rows.dtype), w8, w_scale, bias)
    y = torch.matmul(rows.q.float(), w8.float().t()) * (rows.scale[..., None] * w_scale.float())
    if bias is not None:
        y = y + bias.float()
    return y.to(rows.dtype)


def linear_fp8_rows(rows: Fp8Rows, w8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None, *,
                    config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """:func:`linear_fp8` on rows rounded already (``Fp8Rows``): the product's launch alone (the kernel on CUDA,
    :func:`linear_fp8_rows_ref` elsewhere). ``linear_fp8(x, ...) == linear_fp8_rows(Fp8Rows.of(x), ...)``.

    Args:
        rows: :class:`Fp8Rows` of shape ``[..., K]``.
        w8: Shape ``[N, K]`` :data:`FP8_DTYPE`.
        w_scale: Shape ``[N]`` float32.
        bias: Shape ``[N]`` or ``None``.
        config: as :func:`linear_fp8`'s.

    Returns:
        Shape ``[..., N]`` in ``rows.dtype``.

    Raises:
        ValueError: mismatched shapes or dtypes, naming the argument.
    """
    _check_fp8_rows(rows)
    k = rows.q.shape[-1]
    _check_linear(torch.empty(0, k, dtype=rows.dtype, device=rows.q.device), w8, w_scale, bias)
    n = w8.shape[0]
    if not use_kernel("linear_fp8", rows.q, w8):
        return linear_fp8_rows_ref(rows, w8, w_scale, bias)
    q, scale = flat_rows(rows)
    return _fp8_product(q, scale, w8, w_scale, bias, rows.dtype, q.shape[0], n, k, config).view(*rows.q.shape[:-1], n)


def flat_rows(rows: Fp8Rows) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` as a product kernel reads them: ``(q [count, K] contiguous, scale [count] contiguous)``."""
    q = rows.q.reshape(-1, rows.q.shape[-1])
    return (q if q.is_contiguous() else q.contiguous()), rows.scale.reshape(-1).contiguous()


def _check_fp8_rows(rows) -> None:
    if not isinstance(rows, Fp8Rows) or rows.q.dtype != FP8_DTYPE or rows.q.dim() < 1 \
            or rows.scale.dtype != torch.float32 or tuple(rows.scale.shape) != tuple(rows.q.shape[:-1]):
        raise ValueError("linear_fp8_rows: rows must be Fp8Rows(q [..., K] float8_e4m3fn, scale [...] float32, dtype) "
                         "as Fp8Rows.of(x) or a kernel's fp8_out=True makes them")
