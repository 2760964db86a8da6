"""Attention of a few queries per row (a draft tree's nodes) over a static cache, split along the keys.

A verify forward on the fast path attends ``M`` tree nodes (up to a bucket of 64 or 128) per row and head to every
slot of the static cache under an additive mask (committed keys, the nodes' ancestors). SDPA's kernels give each
(row, head, block of queries) one program that walks all ``S`` keys alone: with the fixture's 5 heads that is five
programs for a whole GPU, and on the H200 cuDNN's kernel took 13.7 us per layer for the fixture's verify forward and
32.7 us per layer for Llama-2-7B's (64 nodes over ~1,200 slots; 1.24 ms of a 7.8 ms EAGLE-2 step). Here one
program per (row, head, chunk of keys, block of queries) walks its chunk in tiles of 32 or 64 keys, each tile's
scores one ``tl.dot`` for all the queries, keeping their softmax statistics (max ``m``, sum ``l``) and weighted
values online; a second launch merges the chunks (``o = sum_c e^{m_c - m} acc_c / sum_c e^{m_c - m} l_c``), as
flash-decoding does for one query.
Grouped-query attention reads each key/value head for the query heads it serves, without expanding the cache.

Reference: ``F.scaled_dot_product_attention`` under the additive mask (keys/values repeated for grouped-query
attention), which :func:`tree_attention_ref` is. Results equal it up to float rounding: float32 statistics; in
bf16 the probabilities are rounded to bf16 before the product with the values (as flash attention does); float32
inputs multiply in full float32 (no TF32), and so does the Triton interpreter (whose ``tl.dot`` misreads bf16).

Under ``torch.compile`` the kernels run as the custom op ``torch.ops.specdec.tree_attention`` (opaque to inductor),
so ``generate(fast="compile")`` keeps them.

References:
    Dao et al., "Flash-Decoding for long-context inference" (2023); Dao, "FlashAttention-2", arXiv 2307.08691;
    Miao et al., "SpecInfer", arXiv 2305.09781 (tree attention).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._dispatch import get_kernel_mode, triton_available, use_kernel
from ._triton import INTERPRETED, jit, next_pow2, tl

__all__ = ["TREE_ATTENTION_MAX_M", "tree_attention", "tree_attention_ref", "tree_attention_split"]

#: The most queries per row the kernels take (a verify bucket); longer forwards (a prefill) run the reference.
TREE_ATTENTION_MAX_M = 128


def check_inputs(op: str, q, k, v, mask) -> tuple[int, int, int, int, int, int]:
    """``(B, H, H_kv, M, S, d)`` of an attention call over a cache, or a ``ValueError`` naming ``op`` and the bad
    argument (shared by :func:`tree_attention` and :func:`~specdec.kernels.decode_attention`)."""
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError(f"{op}: q must have shape [B, H, M, d], got {tuple(getattr(q, 'shape', ()))}")
    B, H, M, d = q.shape
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or t.shape[0] != B or t.shape[3] != d:
            raise ValueError(f"{op}: {name} must have shape [B, H_kv, S, d] = [{B}, H_kv, S, {d}], got "
                             f"{tuple(getattr(t, 'shape', ()))}")
    if k.shape != v.shape:
        raise ValueError(f"{op}: k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape")
    Hkv, S = k.shape[1], k.shape[2]
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"{op}: query heads ({H}) must be a multiple of key/value heads ({Hkv})")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[0] not in (1, B) \
            or tuple(mask.shape[2:]) != (M, S):
        raise ValueError(f"{op}: mask must be additive with shape [B, 1, M, S] = [{B}, 1, {M}, {S}] "
                         f"(0 = may attend, a large negative value = hidden), got "
                         f"{tuple(getattr(mask, 'shape', ()))}")
    if not mask.dtype.is_floating_point:
        raise ValueError(f"{op}: mask must be a float (additive) mask; turn a boolean one into "
                         "torch.where(mask, 0.0, torch.finfo(dtype).min)")
    return B, H, Hkv, M, S, d


def sdpa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   scale: float | None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` under the additive mask, key/value heads repeated for grouped-query
    attention (inputs already checked): the reference of both attention kernels."""
    (B, Hkv, S, d), H = k.shape, q.shape[1]
    if Hkv != H:
        k = k[:, :, None].expand(B, Hkv, H // Hkv, S, d).reshape(B, H, S, d)
        v = v[:, :, None].expand(B, Hkv, H // Hkv, S, d).reshape(B, H, S, d)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), scale=scale)


def tree_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                       scale: float | None = None) -> torch.Tensor:
    """Reference for :func:`tree_attention`: ``F.scaled_dot_product_attention`` under the additive mask.

    Args:
        q: Shape ``[B, H, M, d]``.
        k: Shape ``[B, H_kv, S, d]`` (``H`` a multiple of ``H_kv``).
        v: Shape ``[B, H_kv, S, d]``.
        mask: Shape ``[B, 1, M, S]`` (or ``[1, 1, M, S]``), additive, float.
        scale: softmax scale (default ``d ** -0.5``).

    Returns:
        Shape ``[B, H, M, d]`` in ``q``'s dtype.
    """
    check_inputs("tree_attention", q, k, v, mask)
    return sdpa_reference(q, k, v, mask, scale)


def tree_attention_split(programs: int, keys: int) -> int:
    """Keys per program (a multiple of 32): enough chunks for about 256 programs in all (``programs`` = rows x heads
    x query blocks), fewer when the keys run out. Each program walks its chunk in tiles of 32 or 64 keys; every
    chunk adds ``M x d`` float32 partial sums to write and merge, so the chunks are no smaller than needed."""
    splits = max(1, min(-(-256 // max(programs, 1)), -(-keys // 32)))
    per = -(-keys // splits)
    return -(-per // 32) * 32


@jit
def _tree_split_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, H, group, M, S, D, NS, CHUNK, scale,
                       sqb, sqh, sqm, sqd, skb, skh, sks, skd, svb, svh, svs, svd, smb, smm, sms,
                       BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr):
    """One program per (row * head, chunk of ``CHUNK`` keys, block of queries), walking its chunk in tiles of
    ``BLOCK_S`` keys with an online softmax: per query, the chunk's max score, sum of exponentials and weighted
    values, written at ``[row * head, chunk, query]``."""
    bh = tl.program_id(0)
    chunk = tl.program_id(1)
    qb = tl.program_id(2)
    b = bh // H
    h = bh % H
    kvh = h // group
    rows = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    r_in = rows < M
    dims = tl.arange(0, BLOCK_D)
    d_in = dims < D
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :] * sqd,
                mask=r_in[:, None] & d_in[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, CHUNK, BLOCK_S):
        s = chunk * CHUNK + start + tl.arange(0, BLOCK_S)
        s_in = s < S
        keys_t = tl.load(k_ptr + b * skb + kvh * skh + s[None, :] * sks + dims[:, None] * skd,
                         mask=d_in[:, None] & s_in[None, :], other=0.0)  # [BLOCK_D, BLOCK_S]
        if IEEE:
            scores = tl.dot(q.to(tl.float32), keys_t.to(tl.float32), input_precision="ieee")
        else:
            scores = tl.dot(q, keys_t)
        scores = scores * scale + tl.load(mask_ptr + b * smb + rows[:, None] * smm + s[None, :] * sms,
                                          mask=r_in[:, None] & s_in[None, :], other=0.0).to(tl.float32)
        scores = tl.where(s_in[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # keys hidden by -inf only so far: p = 0, l = 0
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        values = tl.load(v_ptr + b * svb + kvh * svh + s[:, None] * svs + dims[None, :] * svd,
                         mask=s_in[:, None] & d_in[None, :], other=0.0)  # [BLOCK_S, BLOCK_D]
        if IEEE:
            part = tl.dot(p, values.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(p.to(values.dtype), values)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + part
        m_i = m_new
    out = (bh * NS + chunk) * M + rows
    tl.store(m_ptr + out, m_i, mask=r_in)
    tl.store(l_ptr + out, l_i, mask=r_in)
    tl.store(acc_ptr + out[:, None] * D + dims[None, :], acc, mask=r_in[:, None] & d_in[None, :])


@jit
def _tree_merge_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, H, M, D, NS, sob, soh, som, sod,
                       BLOCK_NS: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (row * head, query): the chunks' statistics merged into the softmax-weighted sum."""
    bh = tl.program_id(0)
    row = tl.program_id(1)
    b = bh // H
    h = bh % H
    c = tl.arange(0, BLOCK_NS)
    c_in = c < NS
    dims = tl.arange(0, BLOCK_D)
    d_in = dims < D
    at = (bh * NS + c) * M + row
    m = tl.load(m_ptr + at, mask=c_in, other=float("-inf"))
    top = tl.max(m, axis=0)
    w = tl.where(c_in & (m > float("-inf")), tl.exp(m - top), 0.0)
    denom = tl.sum(w * tl.load(l_ptr + at, mask=c_in, other=0.0), axis=0)
    acc = tl.load(acc_ptr + at[:, None] * D + dims[None, :], mask=c_in[:, None] & d_in[None, :], other=0.0)
    o = tl.sum(w[:, None] * acc, axis=0) / denom
    tl.store(o_ptr + b * sob + h * soh + row * som + dims * sod, o.to(o_ptr.dtype.element_ty), mask=d_in)


def _tree_attention_triton(q, k, v, mask, scale, block_s=None) -> torch.Tensor:
    B, H, Hkv, M, S, d = check_inputs("tree_attention", q, k, v, mask)
    scale = d ** -0.5 if scale is None else float(scale)
    block_m = max(16, min(64, next_pow2(M)))
    query_blocks = -(-M // block_m)
    chunk = block_s or tree_attention_split(B * H * query_blocks, S)
    num_splits = -(-S // chunk)
    dev = q.device
    m = torch.empty(B * H, num_splits, M, dtype=torch.float32, device=dev)
    l_sum = torch.empty(B * H, num_splits, M, dtype=torch.float32, device=dev)
    acc = torch.empty(B * H, num_splits, M, d, dtype=torch.float32, device=dev)
    o = torch.empty(B, H, M, d, dtype=q.dtype, device=dev)
    if B == 0 or H == 0 or M == 0:
        return o
    smb = mask.stride(0) if mask.shape[0] > 1 else 0
    block_d = max(16, next_pow2(d))
    _tree_split_kernel[(B * H, num_splits, query_blocks)](
        q, k, v, mask, m, l_sum, acc, H, H // Hkv, M, S, d, num_splits, chunk, scale,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3), *k.stride(), *v.stride(), smb, mask.stride(2),
        mask.stride(3), BLOCK_M=block_m, BLOCK_S=64 if chunk % 64 == 0 else 32, BLOCK_D=block_d,
        IEEE=q.dtype == torch.float32 or INTERPRETED,  # the interpreter's dot reads bf16 as raw bits: float32
    )
    _tree_merge_kernel[(B * H, M)](m, l_sum, acc, o, H, M, d, num_splits, *o.stride(),
                                   BLOCK_NS=next_pow2(num_splits), BLOCK_D=block_d)
    return o


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   scale: float | None = None, *, block_s: int | None = None) -> torch.Tensor:
    """Attention of a verify bucket: ``M`` tree nodes per row and head over the ``S`` cached keys, under an
    additive mask (each node sees the committed keys, its ancestors and itself).

    .. math::
        O_{bh} = \\mathrm{softmax}\\bigl(\\mathrm{scale}\\; Q_{bh} K_{b,g(h)}^\\top + A_b\\bigr) V_{b,g(h)}
        \\in \\mathbb{R}^{M \\times d}, \\qquad g(h) = \\lfloor h H_{kv} / H \\rfloor

    Dispatch: the split-key Triton kernels (two launches) when the tensors are on CUDA, triton imports and
    ``M <=`` :data:`TREE_ATTENTION_MAX_M` (inside ``torch.compile`` too, as the custom op
    ``torch.ops.specdec.tree_attention``); :func:`tree_attention_ref` otherwise, and whenever a gradient is
    needed (the kernels have no backward: training runs SDPA).

    Args:
        q: Shape ``[B, H, M, d]`` (any strides).
        k: Shape ``[B, H_kv, S, d]`` (the static cache's keys; any strides).
        v: Shape ``[B, H_kv, S, d]``.
        mask: Shape ``[B, 1, M, S]`` (or ``[1, 1, M, S]``), additive float: 0 where a key may be attended, a large
            negative value (``torch.finfo(dtype).min`` or ``-inf``) where not. Every query must see at least one
            key.
        scale: softmax scale (default ``d ** -0.5``).
        block_s: keys per program to force, a multiple of 32 (tests, benchmarks); default
            :func:`tree_attention_split`.

    Returns:
        Shape ``[B, H, M, d]`` in ``q``'s dtype.

    Raises:
        ValueError: shapes that do not match, or a boolean mask, naming the argument.
    """
    check_inputs("tree_attention", q, k, v, mask)
    if q.shape[2] > TREE_ATTENTION_MAX_M or (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))):
        return tree_attention_ref(q, k, v, mask, scale)  # long forwards; training (the kernels have no backward)
    if get_kernel_mode() == "auto":
        on_cuda = all(t.is_cuda for t in (q, k, v, mask)) and triton_available()
        if on_cuda and torch.compiler.is_compiling():  # an opaque op for inductor
            return torch.ops.specdec.tree_attention(q, k, v, mask, scale)
        if on_cuda:  # eagerly (and inside CUDA graphs) the launcher itself: no dispatcher on the hot path
            return _tree_attention_triton(q, k, v, mask, scale, block_s)
        return tree_attention_ref(q, k, v, mask, scale)
    if use_kernel("tree_attention", q, k, v, mask):  # forced: the kernel (under the interpreter on CPU)
        return _tree_attention_triton(q, k, v, mask, scale, block_s)
    return tree_attention_ref(q, k, v, mask, scale)


if triton_available():
    @torch.library.custom_op("specdec::tree_attention", mutates_args=())
    def _tree_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                           scale: float | None) -> torch.Tensor:
        return _tree_attention_triton(q, k, v, mask, scale)

    @_tree_attention_op.register_fake
    def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None) -> torch.Tensor:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
