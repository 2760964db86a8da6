"""A linear layer on 4-bit weights for a draft head: ``y ~= x @ W^T + b`` with ``W`` stored as 4-bit codes (one
float32 scale per ``group`` inputs of a row), the rows rounded to float8 as :func:`~specdec.kernels.linear_fp8`
rounds them, the product on the float8 tensor cores with **no conversion of the codes**.

A draft head's forward at batch 1 is the time to read its weights (:mod:`specdec.kernels.fp8`): 4-bit codes are
half the float8 head's bytes. Sessions 24 and 41 converted codes to bfloat16 in registers and lost to float8 (147.6
against 103.4 us for the Llama-2-7B EAGLE head's six matrices). The trick that keeps the float8 tensor cores: a
code read as an e4m3 byte is a float8 number. Here a code is a sign (bit 3) and a magnitude ``0..7``; moved to the
byte's sign bit and low bits, the byte is e4m3's subnormal ``±m * 2^-9`` exactly. So a program loads a tile of
bytes, splits each byte into its two codes (four bytes at a time in inline PTX on the GPU), and multiplies the
code tiles against the float8 rows as they are; the scales (stored times ``2^9``) multiply each group's partial
product once. Session 45 measured the prototype (``docs/results/fast_s45``): a 7B head level's six products 107.9
-> 78.9 us on an H100 at 128 inputs per scale.

**The layout** (:func:`pack_int4`). A row's ``K`` inputs are cut in chunks of ``2 * group``; byte ``j`` of a chunk
holds input ``j`` in its low half and input ``group + j`` in its high half, so a ``[BLOCK_N, group]`` byte tile
splits into the chunk's two groups with one mask and one shift, and needs no interleaving. A ``K`` that is not a
multiple of ``2 * group`` is padded with zero weights to the next one (``K_pad``); the kernel reads no input past
``K``.

**Rounding.** Each group's scale is ``s = max|w| / 7``, each weight ``round(w / s)`` (ties to even) clamped to
``[-7, 7]``: 15 levels, symmetric. Smaller groups keep more of a head's drafts (session 46, an EAGLE-1 head of the
fixture, EAGLE-2 tau: 2.684 unrounded, 2.669 float8, 2.589 / 2.596 / 2.646 at 128 / 64 / 32 inputs per scale) and
take more scales and smaller products per chunk.

**Lossless, drafts changed**, as for float8 heads: only the drafter is rounded.

The references are :func:`linear_int4_ref` / :func:`linear_int4_rows_ref`: the rows rounded by
:func:`~specdec.kernels.quantize_fp8_rows_ref`, the weights of :func:`unpack_int4`, the product in float64, the
bias added, cast once. The kernel equals them up to the summation order.

References:
    Dettmers & Zettlemoyer, "The case for 4-bit precision", arXiv 2212.09720 (group-wise 4-bit weights);
    Micikevicius et al., "FP8 Formats for Deep Learning", arXiv 2209.05433 (e4m3 and its subnormals).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ._dispatch import use_kernel
from ._triton import as_rows, jit, next_pow2, pdl_start, pdl_wait, prefetch_launch, prefetch_rows_l2, tl
from .fp8 import FP8_DTYPE, Fp8Rows, _check_fp8_rows, flat_rows, quantize_fp8_rows, quantize_fp8_rows_ref
from .skinny import skinny_store, split_outputs

__all__ = ["INT4_GROUPS", "Int4Weight", "pack_int4", "unpack_int4", "padded_width", "int4_linear_config", "linear_int4",
           "linear_int4_ref", "linear_int4_rows", "linear_int4_rows_ref"]

#: The group sizes (inputs per scale) :func:`pack_int4` takes; a tensor-core product needs at least 32 inputs.
INT4_GROUPS = (32, 64, 128)

_ROW_BLOCK = 64  # the product's rows per program (a tensor-core tile's short side, at most)
_SCALE_UNIT = 512.0  # a code read as e4m3 is code * 2^-9; the stored scales carry the 2^9


class Int4Weight(NamedTuple):
    """A 4-bit weight ``[N, K]`` (see the module for the layout).

    Attributes:
        codes: Shape ``[N, K_pad / 2]`` ``uint8``, two sign-magnitude codes per byte (``K_pad``: ``K`` rounded up to
            a multiple of ``2 * group``, the padding zeros).
        scales: Shape ``[K_pad / group, N]`` float32, each group's scale times ``2^9`` (a group's ``N`` scales
            contiguous).
        group: inputs per scale, one of :data:`INT4_GROUPS`.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    group: int


def _check_group(op: str, group: int) -> None:
    if group not in INT4_GROUPS:
        raise ValueError(f"{op}: group must be one of {INT4_GROUPS} (inputs per scale), got {group!r}")


def padded_width(k: int, group: int) -> int:
    """``K_pad``: ``k`` rounded up to a multiple of ``2 * group`` (a chunk of two groups)."""
    return -(-k // (2 * group)) * 2 * group


def pack_int4(weight: torch.Tensor, group: int = 128) -> Int4Weight:
    """Round ``weight`` to 4-bit codes with one scale per ``group`` inputs of a row (see the module).

    Args:
        weight: Shape ``[N, K]`` float (finite), any ``K >= 1``.
        group: inputs per scale, one of :data:`INT4_GROUPS`.

    Returns:
        :class:`Int4Weight` on ``weight``'s device.

    Raises:
        ValueError: not a 2-D float tensor, empty, not finite, or a ``group`` not in :data:`INT4_GROUPS`.
    """
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.dtype.is_floating_point \
            or weight.dtype == FP8_DTYPE:
        raise ValueError(f"pack_int4: weight must be a 2-D float tensor [N, K], got "
                         f"{getattr(weight, 'dtype', type(weight))} {tuple(getattr(weight, 'shape', ()))}")
    n, k = weight.shape
    _check_group("pack_int4", group)
    if k == 0:
        raise ValueError("pack_int4: weight has no inputs (K = 0)")
    kp = padded_width(k, group)
    w = torch.nn.functional.pad(weight.detach().float(), (0, kp - k)).view(n, kp // group, group)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("pack_int4: weight holds inf or nan; round finite values")
    scale = w.abs().amax(-1) / 7
    v = torch.round(w / torch.where(scale > 0, scale, 1.0)[..., None]).clamp(-7, 7)
    nibble = torch.where(v < 0, 8 - v, v).to(torch.uint8).view(n, kp // (2 * group), 2, group)
    codes = (nibble[:, :, 0] | (nibble[:, :, 1] << 4)).reshape(n, kp // 2).contiguous()
    return Int4Weight(codes, (scale * _SCALE_UNIT).T.contiguous(), group)


def unpack_int4(weight: Int4Weight, k: int | None = None) -> torch.Tensor:
    """The float32 weight an :class:`Int4Weight` stands for (code times its group's scale): ``[N, K_pad]``, or its
    first ``k`` inputs ``[N, k]``."""
    codes, scales, group = weight
    n = codes.shape[0]
    chunks = codes.view(n, -1, group)
    nibble = torch.stack([chunks & 15, chunks >> 4], dim=2).reshape(n, -1).float()
    v = torch.where(nibble >= 8, 8 - nibble, nibble)
    return (v.view(n, -1, group) * (scales.T / _SCALE_UNIT)[..., None]).reshape(n, -1)[:, :k]


def _check_weight(op: str, k: int, weight, bias) -> int:
    if not isinstance(weight, Int4Weight) or weight.codes.dtype != torch.uint8 or weight.codes.dim() != 2 \
            or weight.scales.dtype != torch.float32:
        raise ValueError(f"{op}: weight must be an Int4Weight(codes [N, K/2] uint8, scales [K/group, N] float32, "
                         f"group) as pack_int4 makes it")
    n = weight.codes.shape[0]
    _check_group(op, weight.group)
    kp = padded_width(max(k, 1), weight.group)
    if weight.codes.shape[1] * 2 != kp or tuple(weight.scales.shape) != (kp // weight.group, n):
        raise ValueError(f"{op}: the rows have K={k} inputs but the weight's codes are {tuple(weight.codes.shape)} "
                         f"and scales {tuple(weight.scales.shape)} (expected [N, {kp // 2}] and "
                         f"[{kp // weight.group}, N] for K={k}: pack_int4 of an [N, {k}] weight)")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"{op}: bias must have shape [N] = [{n}] or be None, got {tuple(bias.shape)}")
    return n


def linear_int4_rows_ref(rows: Fp8Rows, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Reference for :func:`linear_int4_rows`, same arguments and result: the rounded rows times
    :func:`unpack_int4`'s weight in float64, the bias added, cast to ``rows.dtype`` once."""
    _check_fp8_rows(rows)
    _check_weight("linear_int4_rows", rows.q.shape[-1], weight, bias)
    x = rows.q.double() * rows.scale.double()[..., None]
    y = torch.matmul(x, unpack_int4(weight, rows.q.shape[-1]).double().t())
    if bias is not None:
        y = y + bias.double()
    return y.to(rows.dtype)


def linear_int4_ref(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Reference for :func:`linear_int4`, same arguments and result: ``x``'s rows rounded by
    :func:`~specdec.kernels.quantize_fp8_rows_ref`, then :func:`linear_int4_rows_ref`."""
    return linear_int4_rows_ref(Fp8Rows(*quantize_fp8_rows_ref(x), x.dtype), weight, bias)


def int4_linear_config(rows: int, n: int, k: int, group: int = 128) -> tuple[int, int, int, int, int]:
    """``(BLOCK_N, SPLIT, num_warps, num_stages, UNROLL)`` for ``rows`` rows of an ``[n, k]`` 4-bit weight.

    From session 45's sweep on an H100 (the Llama-2-7B EAGLE head's six matrices at 10 rows, a chain of dependent
    launches, ``docs/results/fast_s45/callC``; session 46 call B the same at 64 and 32 inputs per scale): 64 outputs
    per program, 3 loads in flight; ``K`` split (a second launch sums the partials in a fixed order) until there are
    about two programs per multiprocessor: in 2 for the fused ``[q; k; v]`` (192 output blocks), in 4 for
    ``o_proj``, ``down_proj``, ``fc`` and an 8,192-row ``lm_head``; not for ``[gate; up]`` (344 blocks). ``UNROLL``:
    chunks per step, so that a step reads 128 bytes of a weight row at any group size.
    """
    del rows
    programs = -(-n // 64)
    split = 1 if programs >= 256 else min(4, -(-264 // programs))
    return 64, max(1, min(split, -(-k // 256))), 4, 3, max(1, 128 // group)


@jit
def _nibbles(p, ASM: tl.constexpr):
    """Code bytes ``p`` -> their low and high codes as float8 (``±m * 2^-9``): a code's sign bit (bit 3) moved to
    the byte's top bit, its magnitude kept in the low three. ``ASM``: four bytes at a time in inline PTX."""
    if ASM:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b32 t, s, m; and.b32 s, $2, 0x08080808; shl.b32 s, s, 4; and.b32 m, $2, 0x07070707; "
            "or.b32 $0, m, s; shr.b32 t, $2, 4; and.b32 s, t, 0x08080808; shl.b32 s, s, 4; "
            "and.b32 m, t, 0x07070707; or.b32 $1, m, s; }",
            "=r,=r,r", [p], dtype=(tl.uint8, tl.uint8), is_pure=True, pack=4)
    else:
        lo = ((p & 8) << 4) | (p & 7)
        hi = (((p >> 4) & 8) << 4) | ((p >> 4) & 7)
    return lo.to(tl.float8e4nv, bitcast=True), hi.to(tl.float8e4nv, bitcast=True)


@jit
def _chunk_dots(c_ptrs, x_ptrs, s_ptrs, N, n_in, m_in, k_lo, K, GROUP: tl.constexpr, EVEN_K: tl.constexpr,
                ASM: tl.constexpr):
    """One chunk's two products, unscaled, and its two groups' scales: ``(dot(lo, q_lo), dot(hi, q_hi), s_lo,
    s_hi)``; ``k_lo [GROUP]``: the chunk's first group's input indices (inputs from ``K`` on read as zeros unless
    ``EVEN_K``)."""
    p = tl.load(c_ptrs, mask=n_in[:, None], other=0)
    if EVEN_K:
        x_lo = tl.load(x_ptrs, mask=m_in[None, :], other=0.0)
        x_hi = tl.load(x_ptrs + GROUP, mask=m_in[None, :], other=0.0)
    else:
        x_lo = tl.load(x_ptrs, mask=m_in[None, :] & (k_lo < K)[:, None], other=0.0)
        x_hi = tl.load(x_ptrs + GROUP, mask=m_in[None, :] & (k_lo + GROUP < K)[:, None], other=0.0)
    s_lo = tl.load(s_ptrs, mask=n_in, other=0.0)
    s_hi = tl.load(s_ptrs + N, mask=n_in, other=0.0)
    lo, hi = _nibbles(p, ASM)
    return tl.dot(lo, x_lo), tl.dot(hi, x_hi), s_lo[:, None], s_hi[:, None]


@jit
def _linear_int4_kernel(q_ptr, xs_ptr, c_ptr, s_ptr, b_ptr, y_ptr, o_ptr, cnt_ptr, M, N, K, CHUNKS_PER, stride_cn,
                        stride_ys, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, FIXUP: tl.constexpr,
                        GROUP: tl.constexpr, UNROLL: tl.constexpr,
                        EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ASM: tl.constexpr,
                        PREFETCH: tl.constexpr = 0, PDL: tl.constexpr = False):
    """Program ``(pid_n, pid_k, pid_m)``: ``acc[n, m] = sum_chunks s_lo[n] dot(lo, q_lo) + s_hi[n] dot(hi, q_hi)``
    over the chunks of split ``pid_k`` (``2 * GROUP`` inputs each; ``UNROLL`` of them a step, their products all
    issued before any is scaled, ``CHUNKS_PER`` a multiple of it), times the rows' scales; written as ``y[m, n]``
    (plus the bias, cast) when ``SPLIT == 1``, else as float32 partials ``y[pid_k, m, n]``. ``q`` is ``[M, K]``; the
    codes' rows hold ``cdiv(K, 2 * GROUP)`` chunks (``EVEN_K``: ``K`` fills them)."""
    pdl_start(PDL)
    pid_k = tl.program_id(1)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_in, m_in, jj = n < N, m < M, tl.arange(0, GROUP)
    c0 = pid_k * CHUNKS_PER
    c1 = tl.minimum(c0 + CHUNKS_PER, tl.cdiv(K, 2 * GROUP))  # the last split may be shorter
    if PREFETCH > 0:  # the split's first code bytes of each row into L2 while the kernels before this one run
        prefetch_rows_l2(c_ptr + n.to(tl.int64) * stride_cn + c0 * GROUP, tl.where(n_in, (c1 - c0) * GROUP, 0),
                         PREFETCH)
    pdl_wait(PDL)
    c_ptrs = c_ptr + n[:, None].to(tl.int64) * stride_cn + (c0 * GROUP + jj)[None, :]
    x_ptrs = q_ptr + m[None, :].to(tl.int64) * K + (c0 * 2 * GROUP + jj)[:, None]
    s_ptrs = s_ptr + 2 * c0 * N + n
    k_lo = c0 * 2 * GROUP + jj
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for _ in range(c0, c1, UNROLL):
        a0, b0, sa0, sb0 = _chunk_dots(c_ptrs, x_ptrs, s_ptrs, N, n_in, m_in, k_lo, K, GROUP, EVEN_K, ASM)
        if UNROLL == 1:
            acc = acc + sa0 * a0 + sb0 * b0
        else:
            a1, b1, sa1, sb1 = _chunk_dots(c_ptrs + GROUP, x_ptrs + 2 * GROUP, s_ptrs + 2 * N, N, n_in, m_in,
                                           k_lo + 2 * GROUP, K, GROUP, EVEN_K, ASM)
            if UNROLL == 2:
                acc = acc + sa0 * a0 + sb0 * b0 + sa1 * a1 + sb1 * b1
            else:  # 4
                a2, b2, sa2, sb2 = _chunk_dots(c_ptrs + 2 * GROUP, x_ptrs + 4 * GROUP, s_ptrs + 4 * N, N, n_in,
                                               m_in, k_lo + 4 * GROUP, K, GROUP, EVEN_K, ASM)
                a3, b3, sa3, sb3 = _chunk_dots(c_ptrs + 3 * GROUP, x_ptrs + 6 * GROUP, s_ptrs + 6 * N, N, n_in,
                                               m_in, k_lo + 6 * GROUP, K, GROUP, EVEN_K, ASM)
                acc = acc + sa0 * a0 + sb0 * b0 + sa1 * a1 + sb1 * b1 + sa2 * a2 + sb2 * b2 + sa3 * a3 + sb3 * b3
        c_ptrs += GROUP * UNROLL
        x_ptrs += 2 * GROUP * UNROLL
        s_ptrs += 2 * N * UNROLL
        k_lo += 2 * GROUP * UNROLL
    acc = acc * tl.load(xs_ptr + m, mask=m_in, other=0.0)[None, :]
    tile = tl.program_id(0) + tl.num_programs(0) * tl.program_id(2)
    skinny_store(acc, b_ptr, y_ptr, o_ptr, cnt_ptr, tile, n, m, n_in, m_in, pid_k, N, stride_ys, HAS_BIAS, SPLIT,
                 FIXUP)


def _int4_product(q, x_scale, weight: Int4Weight, bias, dtype, config=None) -> torch.Tensor:
    """``[rows, N]`` in ``dtype``: the float8 rows ``q [rows, K]`` (contiguous, scales ``x_scale [rows]``) times the
    4-bit weight, on the kernels."""
    rows, k = q.shape
    codes, scales, group = weight
    n = codes.shape[0]
    y = torch.empty(rows, n, dtype=dtype, device=q.device)
    if rows and n:
        block_n, split, num_warps, num_stages, unroll = config or int4_linear_config(rows, n, k, group)
        chunks = -(-k // (2 * group))
        unroll = unroll if chunks % unroll == 0 else 1  # every split a whole number of steps
        steps = chunks // unroll
        split = max(1, min(split, steps))
        per = -(-steps // split) * unroll
        split = -(-chunks // per)  # no empty split
        block_m = min(_ROW_BLOCK, max(16, next_pow2(rows)))
        grid = (-(-n // block_n), split, -(-rows // block_m))
        out = split_outputs(y, split, grid[0] * grid[2])
        b = bias if bias is not None else scales
        _linear_int4_kernel[grid](
            q, x_scale, codes, scales, b, out.target, y, out.counter_arg, rows, n, k, per, codes.stride(0), out.stride,
            HAS_BIAS=bias is not None, SPLIT=split, FIXUP=out.fixup, GROUP=group, UNROLL=unroll,
            EVEN_K=k % (2 * group) == 0, BLOCK_M=block_m, BLOCK_N=block_n, ASM=q.is_cuda, num_warps=num_warps,
            num_stages=num_stages, **prefetch_launch(codes),
        )
        out.finish(b, bias is not None)
    return y


def linear_int4_rows(rows: Fp8Rows, weight: Int4Weight, bias: torch.Tensor | None = None, *,
                     config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """:func:`linear_int4` on rows rounded to float8 already (:class:`~specdec.kernels.Fp8Rows`, e.g. from a
    kernel's ``fp8_out``): the product's launch alone (2 with ``K`` split). The kernel on CUDA,
    :func:`linear_int4_rows_ref` elsewhere.

    Args:
        rows: :class:`~specdec.kernels.Fp8Rows` of shape ``[..., K]``.
        weight: :class:`Int4Weight` of shape ``[N, K]``.
        bias: Shape ``[N]`` or ``None`` (added in float32).
        config: ``(BLOCK_N, SPLIT, num_warps, num_stages, UNROLL)`` to force (benchmarks); default
            :func:`int4_linear_config`.

    Returns:
        Shape ``[..., N]`` in ``rows.dtype``.

    Raises:
        ValueError: mismatched shapes or dtypes, naming the argument.
    """
    _check_fp8_rows(rows)
    k = rows.q.shape[-1]
    n = _check_weight("linear_int4_rows", k, weight, bias)
    if not use_kernel("linear_int4", rows.q, weight.codes):
        return linear_int4_rows_ref(rows, weight, bias)
    return _int4_product(*flat_rows(rows), weight, bias, rows.dtype, config).view(*rows.q.shape[:-1], n)


def linear_int4(x: torch.Tensor | Fp8Rows, weight: Int4Weight, bias: torch.Tensor | None = None, *,
                config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """``x @ unpack_int4(weight)^T + bias`` with ``x``'s rows rounded to float8
    (:func:`~specdec.kernels.quantize_fp8_rows`), on float8 tensor cores (the Triton kernels on CUDA;
    :func:`linear_int4_ref` elsewhere). Not ``F.linear``'s result: both operands are rounded (for a drafter's
    weights; see the module). A forward of up to 64 rows reads the codes once, more rows once per 64.

    Args:
        x: Shape ``[..., K]`` bfloat16 / float16 / float32, or those rows rounded already
            (:class:`~specdec.kernels.Fp8Rows`: :func:`linear_int4_rows`).
        weight: :class:`Int4Weight` of shape ``[N, K]`` (:func:`pack_int4`).
        bias: Shape ``[N]`` or ``None``.
        config: as :func:`linear_int4_rows`'s.

    Returns:
        Shape ``[..., N]`` in ``x``'s dtype (accumulated in float32).

    Raises:
        ValueError: mismatched shapes or dtypes, naming the argument.
    """
    if isinstance(x, Fp8Rows):
        return linear_int4_rows(x, weight, bias, config=config)
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or not x.dtype.is_floating_point or x.dtype == FP8_DTYPE:
        raise ValueError(f"linear_int4: x must be a float tensor [..., K] (bfloat16, float16 or float32), got "
                         f"{getattr(x, 'dtype', type(x))}")
    _check_weight("linear_int4", x.shape[-1], weight, bias)
    if not use_kernel("linear_int4", x, weight.codes):
        return linear_int4_ref(x, weight, bias)
    return linear_int4_rows(Fp8Rows(*quantize_fp8_rows(as_rows(x)), x.dtype), weight, bias,
                            config=config).view(*x.shape[:-1], weight.codes.shape[0])
