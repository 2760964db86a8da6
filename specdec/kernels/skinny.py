"""A linear layer for a few dozen rows on tensor cores: ``y = x @ W^T + b`` for the fast path's draft and verify
forwards (2 to 64 rows), streamed as one pass over ``W``.

A speculative step multiplies a handful of rows by every weight matrix: the draft head's tree levels (the top-k
frontier, 10 rows), the head's update over the accepted tokens (up to depth + 1 rows) and the target's verify
forward (the tree, 61 rows at batch 1). Such products are still bound by reading ``W`` (64 rows of bfloat16 do 64
multiply-adds per weight read, under a third of what the H200's tensor cores sustain per byte of its memory), but
cuBLAS's kernels for them do not stream ``W`` at the memory's bandwidth. This kernel computes ``y^T = W x^T``: each
program owns ``BLOCK_N`` output features (the tensor-core tile's long side) and all ``M <= BLOCK_M`` rows (the short
side), walks ``K`` in ``BLOCK_K`` chunks through a software pipeline of ``num_stages`` loads in flight, and
accumulates in float32. With ``SPLIT_K > 1`` the programs also split ``K`` (more programs for matrices with few
outputs) and a second launch sums their float32 partials, adds the bias and casts.

The reference is ``F.linear``; results equal it up to float rounding (the summation order differs), as for
:func:`specdec.kernels.linear_rows`.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ._dispatch import use_kernel
from ._triton import jit, next_pow2, pdl_launch, pdl_start, pdl_wait, prefetch_launch, prefetch_rows_l2, tl
from .gemv import check_linear, linear_operands

__all__ = ["SKINNY_MAX_ROWS", "SKINNY_MIN_ROWS", "SKINNY_DTYPES", "SKINNY_DEFAULT_ROWS", "SkinnyConfig",
           "linear_skinny", "linear_skinny_ref", "skinny_config"]

#: The most rows (``x``'s leading dims flattened) the kernel takes; larger inputs run ``F.linear``.
SKINNY_MAX_ROWS = 64

#: The dtypes the kernel takes; float32 runs ``F.linear`` (tensor cores would round it to tf32).
SKINNY_DTYPES = (torch.bfloat16, torch.float16)

#: Rows up to which the fused inference paths use the kernel by default (:func:`specdec.nn.use_skinny_linear`,
#: :func:`specdec.fused.decode_kernels` ``skinny_rows=``): a draft head's tree levels and updates.
SKINNY_DEFAULT_ROWS = 16

#: The fewest rows the kernel takes (a tensor-core tile is at least 16 wide; one row is
#: :func:`specdec.kernels.linear_rows`'s case).
SKINNY_MIN_ROWS = 2


class SkinnyConfig(tuple):
    """``(BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages)`` of one launch (a plain tuple subclass, hashable)."""

    __slots__ = ()

    def __new__(cls, block_n: int, block_k: int, split_k: int, num_warps: int, num_stages: int):
        return super().__new__(cls, (int(block_n), int(block_k), int(split_k), int(num_warps), int(num_stages)))


def linear_skinny_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Reference for :func:`linear_skinny`, same arguments and shapes (``x [..., K]``, ``weight [N, K]``, ``bias [N]``
    or ``None`` -> ``[..., N]``): ``F.linear(x, weight, bias)``."""
    return F.linear(x, weight, bias)


def skinny_config(rows: int, n: int, k: int) -> SkinnyConfig:
    """The launch configuration for ``rows`` rows of an ``[n, k]`` weight.

    Set from a sweep on the H200 (bf16, the Llama-2-7B shape's matrices and its EAGLE head's, 7 and 10 rows,
    CUDA-graph replays; ``docs/results/fast_s22``): 64 outputs per program, 128 inputs per load, 4 loads in flight;
    ``K`` split in two (a second, small launch sums the halves) for large matrices with fewer than 100 programs
    otherwise (a 4096 x 4096 ``o_proj``: 64 programs, about half the multiprocessors).
    """
    block_n, block_k = 64, 128
    programs = -(-n // block_n)
    split = 2 if programs < 100 and n * k >= 1 << 24 and k % (2 * block_k) == 0 else 1
    return SkinnyConfig(block_n, block_k, split, 4, 4)


@jit
def skinny_accumulate(w_ptr, x_ptr, n, m, n_in, m_in, k0, K, K_PER_SPLIT, stride_wn, stride_xm,
                      EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``acc[n, m] = sum_{k0 <= k < k0 + K_PER_SPLIT, k < K} w[n, k] * x[m, k]`` in float32 on tensor cores (``w``
    rows of ``stride_wn``, ``x`` rows of ``stride_xm``, both unit-stride along ``k``; ``BLOCK_K`` per load): the
    streaming loop of :func:`linear_skinny` and of :func:`specdec.kernels.linear_fp8` (float8 operands)."""
    kk = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + n[:, None].to(tl.int64) * stride_wn + (k0 + kk)[None, :]
    x_ptrs = x_ptr + m[None, :].to(tl.int64) * stride_xm + (k0 + kk)[:, None]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for start in range(0, K_PER_SPLIT, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs, mask=n_in[:, None], other=0.0)
            x = tl.load(x_ptrs, mask=m_in[None, :], other=0.0)
        else:
            k_in = (k0 + start + kk) < K
            w = tl.load(w_ptrs, mask=n_in[:, None] & k_in[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=k_in[:, None] & m_in[None, :], other=0.0)
        acc = tl.dot(w, x, acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    return acc


@jit
def skinny_store(acc, b_ptr, y_ptr, o_ptr, c_ptr, tile, n, m, n_in, m_in, pid_k, stride_ym, stride_ys,
                 HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, FIXUP: tl.constexpr):
    """``acc [n, m]`` written as ``y[m, n]`` (plus the bias, cast to ``y``'s dtype) when ``SPLIT == 1``, else as the
    float32 partial ``y[pid_k, m, n]``: summed by :func:`_skinny_reduce_kernel`, or with ``FIXUP`` by the tile's
    last program to finish (counted at ``c_ptr[tile]``, which it resets to 0) into ``o[m, n]``, in the reduce
    kernel's order and arithmetic (``sum_s p[s]``, then the bias, then the cast)."""
    out_mask = n_in[:, None] & m_in[None, :]
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=n_in, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptr + m[None, :] * stride_ym + n[:, None], acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        offs = m[None, :] * stride_ym + n[:, None]
        tl.store(y_ptr + pid_k * stride_ys + offs, acc, mask=out_mask)
        if FIXUP:
            tl.debug_barrier()  # every thread's partial stored before the count (released by the atomic)
            if tl.atomic_add(c_ptr + tile, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
                total = tl.zeros(acc.shape, dtype=tl.float32)
                for s in tl.static_range(SPLIT):
                    total += tl.load(y_ptr + s * stride_ys + offs, mask=out_mask, other=0.0, cache_modifier=".cg")
                if HAS_BIAS:
                    total += tl.load(b_ptr + n, mask=n_in, other=0.0).to(tl.float32)[:, None]
                tl.store(o_ptr + offs, total.to(o_ptr.dtype.element_ty), mask=out_mask)
                tl.atomic_xchg(c_ptr + tile, 0, sem="relaxed", scope="gpu")


#: Counters of the in-kernel sums of split products, per (device, stream): int32, zero between launches.
_COUNTERS: dict = {}
_COUNTER_SLOTS = 1 << 14
_FIXUP = [os.environ.get("SPECDEC_SPLIT_FIXUP", "0") not in ("", "0")]


def use_split_fixup(enabled: bool) -> bool:
    """Whether products with ``K`` split (:func:`linear_skinny`, :func:`~specdec.kernels.linear_fp8`,
    :func:`~specdec.kernels.linear_int4`) sum their partials inside the product's launch (each output tile's last
    program to finish sums them, in a fixed order) instead of in a second launch; returns the previous setting.
    The results are the same bits either way. Default off (``SPECDEC_SPLIT_FIXUP=1``: on): in the 7B EAGLE-2 step on
    an H100 it was no faster than the summing launch under programmatic dependent launch (session 46, call E: 7.34 /
    7.13 ms with the float8 / 4-bit head against 7.31 / 7.07 and 7.31 / 7.08 without; ``docs/results/fast_s46``). A
    captured graph keeps the choice it was captured with.

    The tiles count on a per-(device, stream) buffer that every such launch leaves zeroed: two launches that run
    at the same time on one stream's buffer (graphs captured on one stream and replayed concurrently on two) would
    mix their counts; replay such graphs on the stream order they were captured in, or turn this off.
    """
    if not isinstance(enabled, bool):
        raise ValueError(f"use_split_fixup: enabled must be True or False, got {enabled!r}")
    previous, _FIXUP[0] = _FIXUP[0], enabled
    return previous


def split_counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The zeroed ``int32`` counters for a launch of ``tiles`` output tiles that sums its split partials in-kernel,
    or ``None`` for the separate summing launch (:func:`use_split_fixup` off, or more tiles than the buffer has)."""
    if not _FIXUP[0] or tiles > _COUNTER_SLOTS:
        return None
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    counters = _COUNTERS.get(key)
    if counters is None:
        counters = _COUNTERS[key] = torch.zeros(_COUNTER_SLOTS, dtype=torch.int32, device=device)
    return counters


class SplitOutputs(NamedTuple):
    """Where a product launch with ``split`` parts of ``K`` writes (:func:`split_outputs`): ``target`` (``y`` itself,
    or the float32 partials ``[split, rows, n]``, ``stride`` apart) and ``counters`` (``None``: the summing launch)."""

    target: torch.Tensor
    counters: torch.Tensor | None
    y: torch.Tensor
    split: int
    stride: int

    @property
    def fixup(self) -> bool:
        """The kernel's ``FIXUP``: whether the launch sums its partials itself."""
        return self.counters is not None

    @property
    def counter_arg(self) -> torch.Tensor:
        """The kernel's counter pointer (``y`` when there are no counters: never read then)."""
        return self.y if self.counters is None else self.counters

    def finish(self, bias_ptr: torch.Tensor, has_bias: bool) -> None:
        """After the product's launch: sum the partials (plus the bias) into ``y`` in a second launch, unless the
        launch summed them itself or ``K`` was not split."""
        if self.split > 1 and self.counters is None:
            mn, n = self.y.numel(), self.y.shape[-1]
            _skinny_reduce_kernel[(-(-mn // 1024),)](self.target, bias_ptr, self.y, mn, n, mn, HAS_BIAS=has_bias,
                                                     SPLIT=self.split, BLOCK=1024, num_warps=4, **pdl_launch())


def split_outputs(y: torch.Tensor, split: int, tiles: int) -> SplitOutputs:
    """The :class:`SplitOutputs` of a product into ``y [rows, n]`` over ``tiles`` output tiles with ``K`` in
    ``split`` parts."""
    if split == 1:
        return SplitOutputs(y, None, y, 1, 0)
    target = torch.empty(split, *y.shape, dtype=torch.float32, device=y.device)
    return SplitOutputs(target, split_counters(y.device, tiles), y, split, y.numel())


@jit
def _skinny_kernel(x_ptr, w_ptr, b_ptr, y_ptr, o_ptr, c_ptr, M, N, K, K_PER_SPLIT, stride_xm, stride_wn, stride_ym,
                   stride_ys, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, SPLIT: tl.constexpr, FIXUP: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr = 0,
                   PDL: tl.constexpr = False):
    """Program ``(pid_n, pid_k)``: ``acc[n, m] = sum_{k in split pid_k} w[n, k] * x[m, k]``; written as ``y[m, n]``
    (cast, plus the bias) when ``SPLIT == 1``, else as float32 partials ``y[pid_k, m, n]`` (with ``FIXUP`` summed
    into ``o`` by the tile's last program: :func:`skinny_store`)."""
    pdl_start(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_in, m_in = n < N, m < M
    if PREFETCH > 0:  # the split's first weight bytes of each row into L2 while the kernels before this one run
        row_bytes = tl.minimum(K_PER_SPLIT, K - pid_k * K_PER_SPLIT) * w_ptr.dtype.element_ty.primitive_bitwidth // 8
        prefetch_rows_l2(w_ptr + n.to(tl.int64) * stride_wn + pid_k * K_PER_SPLIT, tl.where(n_in, row_bytes, 0),
                         PREFETCH)
    pdl_wait(PDL)
    acc = skinny_accumulate(w_ptr, x_ptr, n, m, n_in, m_in, pid_k * K_PER_SPLIT, K, K_PER_SPLIT, stride_wn, stride_xm,
                            EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
    skinny_store(acc, b_ptr, y_ptr, o_ptr, c_ptr, pid_n, n, m, n_in, m_in, pid_k, stride_ym, stride_ys, HAS_BIAS,
                 SPLIT, FIXUP)


@jit
def _skinny_reduce_kernel(p_ptr, b_ptr, y_ptr, MN, N, stride_ps, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                          BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """``y.flat[i] = sum_s p[s].flat[i] (+ b[i % N])``, cast to ``y``'s dtype."""
    pdl_start(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(p_ptr + s * stride_ps + i, mask=inside, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + i % N, mask=inside, other=0.0).to(tl.float32)
    tl.store(y_ptr + i, acc.to(y_ptr.dtype.element_ty), mask=inside)


def _linear_skinny_triton(x, weight, bias, config=None) -> torch.Tensor:
    x2, weight, y, rows, n, k = linear_operands("linear_skinny", x, weight, bias)
    if rows and n:
        block_n, block_k, split, num_warps, num_stages = config or skinny_config(rows, n, k)
        block_m = max(16, next_pow2(rows))
        k_per_split = -(-k // (split * block_k)) * block_k
        even_k = k % (split * block_k) == 0
        out = split_outputs(y, split, -(-n // block_n))
        b = bias if bias is not None else weight
        _skinny_kernel[(-(-n // block_n), split)](
            x2, weight, b, out.target, y, out.counter_arg, rows, n, k, k_per_split, x2.stride(0), weight.stride(0), n,
            out.stride, HAS_BIAS=bias is not None, EVEN_K=even_k, SPLIT=split, FIXUP=out.fixup, BLOCK_M=block_m,
            BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
            **prefetch_launch(weight, "SPECDEC_PREFETCH_VERIFY"),
        )
        out.finish(b, bias is not None)
    return y.view(*x.shape[:-1], n)


def linear_skinny(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for inputs of :data:`SKINNY_MIN_ROWS` to :data:`SKINNY_MAX_ROWS` rows on
    tensor cores, as one streaming pass over ``weight`` (the Triton kernel on CUDA for bfloat16 / float16;
    ``F.linear`` otherwise, for float32 and for other row counts).

    Args:
        x: Shape ``[..., K]``; its leading dims flattened are the rows ``M``.
        weight: Shape ``[N, K]``, ``x``'s dtype.
        bias: Shape ``[N]`` or ``None``.
        config: ``(BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages)`` to force (benchmarks); default
            :func:`skinny_config`.

    Returns:
        Shape ``[..., N]`` in ``x``'s dtype (accumulated in float32).

    Raises:
        ValueError: mismatched shapes or dtypes, naming the argument.
    """
    rows, _, _ = check_linear("linear_skinny", x, weight, bias)
    if (not SKINNY_MIN_ROWS <= rows <= SKINNY_MAX_ROWS or x.dtype not in SKINNY_DTYPES
            or not use_kernel("linear_skinny", x, weight)):
        return linear_skinny_ref(x, weight, bias)
    return _linear_skinny_triton(x, weight, bias, config)
