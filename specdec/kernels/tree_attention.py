"""Attention of a few queries per row (a draft tree's nodes) over a static cache, split along the keys.

A verify forward on the fast path attends ``M`` tree nodes (up to a bucket of 64 or 128) per row and head to every
slot of the static cache under an additive mask (committed keys, the nodes' ancestors). SDPA's kernels give each
(row, head, block of queries) one program that walks all ``S`` keys alone: with the fixture's 5 heads that is five
programs for a whole GPU, and on the H200 cuDNN's kernel took 13.7 us per layer for the fixture's verify forward and
32.7 us per layer for Llama-2-7B's (64 nodes over ~1,200 slots; 1.24 ms of a 7.8 ms EAGLE-2 step). Here one
program per (row, head, chunk of keys, block of queries) walks its chunk in tiles of 32 to 128 keys, each tile's
scores one ``tl.dot`` for all the queries, keeping their softmax statistics (max ``m``, sum ``l``) and weighted
values online; a second launch merges the chunks (``o = sum_c e^{m_c - m} acc_c / sum_c e^{m_c - m} l_c``), as
flash-decoding does for one query. When (row, head, block of 32 queries) programs alone fill the GPU (a 7B model's
32 heads, a 64-node bucket and 4 rows or more), each walks all the keys and writes its output: no partial sums,
one launch (:func:`tree_attention_plan`). ``kv_end``, a device tensor, bounds the keys each row may see: the fast
path passes the end of its write slots, so the unused end of the static cache (about half of it in a 7B verify
forward) is neither read nor split over, without a host sync.
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

import os

import torch
import torch.nn.functional as F

from ._dispatch import get_kernel_mode, triton_available, use_kernel
from ._triton import INTERPRETED, jit, next_pow2, pdl_launch, pdl_start, tl

__all__ = ["TREE_ATTENTION_MAX_M", "tree_attention", "tree_attention_launch", "tree_attention_plan",
           "tree_attention_ref", "tree_attention_split", "use_fused_tree_merge"]

#: The most queries per row the kernels take (a verify bucket); longer forwards (a prefill) run the reference.
TREE_ATTENTION_MAX_M = 128

#: The fewest rows x heads at which reading one mask row for a shared prefix (``prefix_end``) pays (session 24,
#: H200; see :func:`tree_attention_shares_prefix`).
TREE_ATTENTION_PREFIX_MIN_ROWS_HEADS = 128


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
                       scale: float | None = None, *, kv_end: torch.Tensor | None = None,
                       prefix_end: torch.Tensor | None = None, visible_end: torch.Tensor | None = None,
                       kv_start: torch.Tensor | None = None) -> torch.Tensor:
    """Reference for :func:`tree_attention`: ``F.scaled_dot_product_attention`` under the additive mask.

    Args:
        q: Shape ``[B, H, M, d]``.
        k: Shape ``[B, H_kv, S, d]`` (``H`` a multiple of ``H_kv``).
        v: Shape ``[B, H_kv, S, d]``.
        mask: Shape ``[B, 1, M, S]`` (or ``[1, 1, M, S]``), additive, float.
        scale: softmax scale (default ``d ** -0.5``).
        kv_end: Shape ``[B]`` or ``[1]`` integer: keys at or past ``kv_end[b]`` hidden too.
        prefix_end: Shape ``[B]`` or ``[1]`` integer: keys below ``prefix_end[b]`` masked for every query as for
            query 0 (:func:`tree_attention`).
        visible_end: Shape ``[B]`` or ``[1]`` integer: keys below ``visible_end[b]`` seen by every query, whatever
            the mask says there (:func:`tree_attention`).
        kv_start: Shape ``[B]`` or ``[1]`` integer: keys below ``kv_start[b]`` hidden too.

    Returns:
        Shape ``[B, H, M, d]`` in ``q``'s dtype.
    """
    check_inputs("tree_attention", q, k, v, mask)
    _check_bounds(q.shape[0], q.device, kv_end, prefix_end, visible_end, kv_start)
    mask = _share_prefix(mask, prefix_end, q.shape[0])
    mask = _show_prefix(mask, visible_end, q.shape[0])
    return sdpa_reference(q, k, v, _hide_past_end(mask, kv_end, q.shape[0], kv_start), scale)


# The merge of the chunks inside the split kernel (FUSED: one launch instead of two); off unless asked for
# (use_fused_tree_merge / SPECDEC_TREE_FUSED_MERGE=1) until timed on the GPU. The counters: per device, int32 zeros
# that every fused launch leaves at zero.
_FUSED_MERGE = [os.environ.get("SPECDEC_TREE_FUSED_MERGE", "0") not in ("", "0")]
_COUNTERS: dict = {}
_KEPT: list = []  # every counter tensor made: never freed (graphs keep their addresses)


def use_fused_tree_merge(on: bool) -> None:
    """Merge the key chunks' partial sums inside the split kernel (its last program per block of queries, counted
    with an atomic) instead of in a second launch: one launch per split call instead of two. Off by default (also
    ``SPECDEC_TREE_FUSED_MERGE=1``); a captured step keeps the choice of its capture. Launches that run at the same
    time on several streams of one device share the counters: do not turn it on for them.

    Args:
        on: merge inside the split kernel from now on.
    """
    _FUSED_MERGE[0] = bool(on)


def _merge_counters(device: torch.device, n: int) -> torch.Tensor | None:
    """``n`` zeroed int32 counters on ``device`` (kept and grown), or ``None`` when they would have to be allocated
    while a CUDA graph is being captured (the call then merges in a second launch)."""
    key = (device.type, device.index)
    held = _COUNTERS.get(key)
    if held is None or held.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        held = _COUNTERS[key] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _KEPT.append(held)
    return held


def tree_attention_split(programs: int, keys: int) -> int:
    """Keys per program (a multiple of 32): enough chunks for about 256 programs in all (``programs`` = rows x heads
    x query blocks), fewer when the keys run out. Each program walks its chunk in tiles of 32 to 128 keys; every
    chunk adds ``M x d`` float32 partial sums to write and merge, so the chunks are no smaller than needed."""
    splits = max(1, min(-(-256 // max(programs, 1)), -(-keys // 32)))
    per = -(-keys // splits)
    return -(-per // 32) * 32


@jit
def _tree_tile(q, m_i, l_i, acc, start, bound, k_ptr, v_ptr, mask_ptr, b, kvh, rows, r_in, dims, d_in, scale,
               skb, skh, sks, skd, svb, svh, svs, svd, smb, smm, sms, BLOCK_S: tl.constexpr, IEEE: tl.constexpr,
               SHARED: tl.constexpr):
    """One tile of ``BLOCK_S`` keys from ``start`` (those at or past ``bound`` hidden, not read) folded into the
    online softmax ``(m_i, l_i, acc)`` of the queries ``rows``. ``SHARED``: 0, the mask's ``[BLOCK_M, BLOCK_S]``
    tile; 1, query 0's row for every query (one ``[BLOCK_S]`` read); 2, no mask (every key below ``bound`` seen
    by every query)."""
    s = start + tl.arange(0, BLOCK_S)
    s_in = s < bound
    keys_t = tl.load(k_ptr + b * skb + kvh * skh + s[None, :] * sks + dims[:, None] * skd,
                     mask=d_in[:, None] & s_in[None, :], other=0.0)  # [BLOCK_D, BLOCK_S]
    if IEEE:
        scores = tl.dot(q.to(tl.float32), keys_t.to(tl.float32), input_precision="ieee")
    else:
        scores = tl.dot(q, keys_t)
    if SHARED == 2:
        scores = scores * scale
    elif SHARED == 1:
        scores = scores * scale + tl.load(mask_ptr + b * smb + s * sms, mask=s_in, other=0.0).to(tl.float32)[None, :]
    else:
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
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + part


@jit
def _tree_split_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, end_ptr, pre_ptr, start_ptr, m_ptr, l_ptr, acc_ptr, o_ptr,
                       cnt_ptr, H, group, M, S, D, NS, scale, sqb, sqh, sqm, sqd, skb, skh, sks, skd, svb, svh, svs,
                       svd, smb, smm, sms, seb, spb, ssb, sob, soh, som, sod, BLOCK_M: tl.constexpr,
                       BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr, HAS_END: tl.constexpr,
                       HAS_START: tl.constexpr, PREFIX: tl.constexpr, DIRECT: tl.constexpr,
                       FUSED: tl.constexpr = False, PDL: tl.constexpr = False):
    """One program per (row * head, chunk of keys, block of queries): the row's keys from ``start`` to ``end``
    (``end`` read from ``end_ptr`` on the device, else ``S``; ``start`` from ``start_ptr`` with ``HAS_START``, else
    0) cut into ``NS`` chunks, this program's walked in tiles of ``BLOCK_S`` keys with an online softmax.
    ``PREFIX`` 1: the keys below ``pre_ptr[b]`` take query 0's mask row (:func:`tree_attention`'s ``prefix_end``),
    walked apart from the others; 2: they are seen by every query, no mask read (``visible_end``). ``DIRECT`` (one
    chunk): the normalised output, written to ``o``; else the chunk's max score, sum of exponentials and weighted
    values per query, at ``[row * head, chunk, query]``, for the merge. ``FUSED``: the merge too, by the program
    that finishes its (row * head, block of queries) last (a counter per block at ``cnt_ptr``, counted up with an
    acquire-release atomic after the partial sums are written, and set back to 0 by that program)."""
    pdl_start(PDL)
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
    if HAS_END:  # keys at or past the row's end are hidden without being read (the unused end of a static cache)
        end = tl.maximum(tl.minimum(tl.load(end_ptr + b * seb).to(tl.int32), S), 0)
    else:
        end = S
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if HAS_START:  # keys below the row's start are hidden without being read (a left-padded prompt's padding)
        begin = tl.minimum(tl.maximum(tl.load(start_ptr + b * ssb).to(tl.int32), 0), end)
    else:
        begin = 0
    per = tl.cdiv(tl.cdiv(end - begin, NS), 16) * 16  # every chunk used, whatever the bounds; last tile partly masked
    lo = begin + chunk * per
    hi = tl.minimum(lo + per, end)
    mid = lo
    if PREFIX:  # the shared prefix's keys first: one mask row (or none) for every query
        mid = tl.minimum(tl.maximum(tl.load(pre_ptr + b * spb).to(tl.int32), lo), hi)
        for start in range(lo, mid, BLOCK_S):
            m_i, l_i, acc = _tree_tile(q, m_i, l_i, acc, start, mid, k_ptr, v_ptr, mask_ptr, b, kvh, rows, r_in,
                                       dims, d_in, scale, skb, skh, sks, skd, svb, svh, svs, svd, smb, smm, sms,
                                       BLOCK_S, IEEE, PREFIX)
    for start in range(mid, hi, BLOCK_S):
        m_i, l_i, acc = _tree_tile(q, m_i, l_i, acc, start, hi, k_ptr, v_ptr, mask_ptr, b, kvh, rows, r_in,
                                   dims, d_in, scale, skb, skh, sks, skd, svb, svh, svs, svd, smb, smm, sms,
                                   BLOCK_S, IEEE, 0)
    if DIRECT:  # a query that sees no key at all (a bucket's padding) gets zeros, not 0 / 0
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptr + b * sob + h * soh + rows[:, None] * som + dims[None, :] * sod, o.to(o_ptr.dtype.element_ty),
                 mask=r_in[:, None] & d_in[None, :])
    else:
        out = (bh * NS + chunk) * M + rows
        tl.store(m_ptr + out, m_i, mask=r_in)
        tl.store(l_ptr + out, l_i, mask=r_in)
        seen = r_in & (m_i > float("-inf"))  # a chunk a query saw nothing of: the merge reads its m only
        tl.store(acc_ptr + out[:, None] * D + dims[None, :], acc, mask=seen[:, None] & d_in[None, :])
        if FUSED:  # the last program of this block of queries merges every chunk's partial sums
            counter = cnt_ptr + bh * tl.num_programs(2) + qb
            if tl.atomic_add(counter, 1, sem="acq_rel") == NS - 1:
                _merge_rows(m_ptr, l_ptr, acc_ptr, o_ptr, b, h, bh, rows, r_in, dims, d_in, M, D, NS, sob, soh,
                            som, sod, BLOCK_M, BLOCK_D)
                tl.atomic_xchg(counter, 0, sem="relaxed")  # ready for the next launch (a graph's next replay)


@jit
def _merge_rows(m_ptr, l_ptr, acc_ptr, o_ptr, b, h, bh, rows, r_in, dims, d_in, M, D, NS, sob, soh, som, sod,
                BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """The chunks' partial sums of the queries ``rows`` merged into their output (an online rescaling, chunk by
    chunk): the merge kernel's work for one block of queries, inside the split kernel's last program."""
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_M], tl.float32)
    total = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for c in range(NS):
        at = (bh * NS + c) * M + rows
        m = tl.load(m_ptr + at, mask=r_in, other=float("-inf"), cache_modifier=".cg")
        seen = r_in & (m > float("-inf"))  # chunks hidden from a query wrote no partial sums
        new_top = tl.maximum(top, m)
        safe = tl.where(new_top > float("-inf"), new_top, 0.0)
        keep = tl.exp(top - safe)
        w = tl.where(seen, tl.exp(m - safe), 0.0)
        denom = denom * keep + w * tl.load(l_ptr + at, mask=seen, other=0.0, cache_modifier=".cg")
        total = total * keep[:, None] + w[:, None] * tl.load(acc_ptr + at[:, None] * D + dims[None, :],
                                                             mask=seen[:, None] & d_in[None, :], other=0.0,
                                                             cache_modifier=".cg")
        top = new_top
    # a query that sees no key at all (a bucket's padding) gets zeros, not 0 / 0
    o = total / tl.where(denom > 0, denom, 1.0)[:, None]
    tl.store(o_ptr + b * sob + h * soh + rows[:, None] * som + dims[None, :] * sod, o.to(o_ptr.dtype.element_ty),
             mask=r_in[:, None] & d_in[None, :])


@jit
def _tree_merge_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, H, M, D, NS, sob, soh, som, sod,
                       BLOCK_NS: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (row * head, query): the chunks' statistics merged into the softmax-weighted sum."""
    pdl_start(PDL)
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
    seen = c_in & (m > float("-inf"))  # chunks hidden from this query wrote no partial sums
    w = tl.where(seen, tl.exp(m - top), 0.0)
    denom = tl.sum(w * tl.load(l_ptr + at, mask=seen, other=0.0), axis=0)
    acc = tl.load(acc_ptr + at[:, None] * D + dims[None, :], mask=seen[:, None] & d_in[None, :], other=0.0)
    # a query that sees no key at all (a bucket's padding) gets zeros, not 0 / 0
    o = tl.sum(w[:, None] * acc, axis=0) / tl.where(denom > 0, denom, 1.0)
    tl.store(o_ptr + b * sob + h * soh + row * som + dims * sod, o.to(o_ptr.dtype.element_ty), mask=d_in)


def tree_attention_plan(rows_heads: int, queries: int, keys: int) -> tuple[int, int]:
    """``(BLOCK_M, num_splits)``: queries per program and chunks of keys per row and head (the first two fields of
    :func:`tree_attention_launch`, which also picks the tile and the launch's warps and stages).

    Args:
        rows_heads: ``B x H``.
        queries: ``M``.
        keys: ``S``.

    Returns:
        ``(BLOCK_M, num_splits)``; one split means one launch.
    """
    return tree_attention_launch(rows_heads, queries, keys)[:2]


def tree_attention_shares_prefix(rows_heads: int, queries: int) -> bool:
    """Whether a caller that knows a shared prefix should pass ``prefix_end`` to :func:`tree_attention`: where
    ``rows_heads`` (``B x H``) is at least :data:`TREE_ATTENTION_PREFIX_MIN_ROWS_HEADS`.

    Measured on the H200 (session 24, ``docs/results/fast_s24``; Llama-2-7B's verify, 64 queries over 573 live of
    1,216 slots, keys L2-cold), us per layer, without -> with it: batch 16 87.0 -> 65.9; batch 4 28.2 -> 26.6;
    batch 1 15.8 -> 16.9 (the two loops cost more than the mask tiles they save with 128 programs), so not there.
    The same holds for ``visible_end`` (session 25, ``docs/results/fast_s25``): batch 16 54.7, batch 4 21.5, batch
    1 16.0 against 15.6 without.
    """
    return rows_heads >= TREE_ATTENTION_PREFIX_MIN_ROWS_HEADS and 1 < queries <= TREE_ATTENTION_MAX_M


def tree_attention_launch(rows_heads: int, queries: int, keys: int, head_dim: int = 128, *,
                          shared_prefix: bool = False, visible_prefix: bool = False) -> tuple[int, int, int, int, int]:
    """``(BLOCK_M, num_splits, BLOCK_S, num_warps, num_stages)`` of a call: queries per program, chunks of keys,
    keys per tile, and the launch's warps and software-pipelining stages.

    Measured on the H200 (bf16, a 1,216-slot cache of which 620 live, 128-wide heads unless said; sessions 13 and
    14's sweeps, ``docs/results/fast_s14``):

    - with ``visible_prefix``, at least 128 (row, head, block of 64 queries) programs: 64 queries per program,
      one launch, 32-key tiles, 4 warps, 3 stages (session 25, 573 live keys, no mask read below the bound:
      batch 4 21.5 us against 27.2 with ``prefix_end``; batch 16 54.7 against 66.5; at batch 1 16.0 against the
      plain 15.6, so the fast path does not pass it there);
    - at least 256 (row, head, block of 64 queries) programs (Llama-2-7B's 32 heads, a 64-node bucket, 8 rows or
      more): 64 queries per program over all the keys, one launch, no partial sums, 4 warps without pipelining
      (batch 16: 96 us; 130 with the default 3 stages; SDPA 152);
    - else at least 128 (row, head, block of 32 queries) programs (4 rows): 32 queries per program, one launch
      (29 us, SDPA 45);
    - else at least 96 (row, head, block of 16 queries) programs (batch 1 of the same): 32 queries per program,
      the keys in two chunks and a merge, 8 warps (14.5 us; 16 queries per program 15.4, one chunk 19; SDPA 34);
    - else (few heads, or an EAGLE head's 10-node level): all the queries of a row up to 32 per program, at most
      eight chunks (:func:`tree_attention_split`) and a merge, one stage; 128-key tiles and 8 warps for
      128-wide heads (a 7B head's level of 10 nodes over 600 keys: 8.5 us, was 11.5; the fixture's 5 heads of 64
      over 300 keys: 5.6 us, was 6.3).

    Args:
        rows_heads: ``B x H``.
        queries: ``M``.
        keys: ``S``.
        head_dim: ``d``.
        shared_prefix: the call passes ``prefix_end`` (:func:`tree_attention`): most tiles read one mask row.
        visible_prefix: the call passes ``visible_end``: most tiles read no mask.

    Returns:
        ``(BLOCK_M, num_splits, BLOCK_S, num_warps, num_stages)``.
    """
    if visible_prefix and rows_heads * -(-queries // 64) >= 128:  # 32-key tiles, 3 stages (batch 4: 21.5 us)
        return _row_block(queries), 1, 32, 4, 3
    if rows_heads * -(-queries // 64) >= 256:  # with a shared prefix: 32-key tiles, 3 stages (batch 16: 66 us)
        return (_row_block(queries), 1, 32, 4, 3) if shared_prefix else (_row_block(queries), 1, 64, 4, 1)
    if rows_heads * -(-queries // 32) >= 128:
        return 32, 1, 64, 4, 3
    if rows_heads * -(-queries // 16) >= 96:
        return 32, 2, 64, 8, 3
    block_m = min(32, _row_block(queries))
    programs = rows_heads * -(-queries // block_m)
    splits = min(8, -(-keys // tree_attention_split(programs, keys)))
    wide = head_dim >= 128
    return block_m, splits, 128 if wide else 64, 8 if wide else 4, 1


def _row_block(queries: int) -> int:
    """``BLOCK_M`` holding all of a row's queries (16 to 64)."""
    return max(16, min(64, next_pow2(queries)))


def _tree_attention_triton(q, k, v, mask, scale, block_s=None, *, kv_end=None, prefix_end=None, visible_end=None,
                           kv_start=None, block_m=None, num_splits=None, tile_s=None, num_warps=None,
                           num_stages=None, fused_merge=None) -> torch.Tensor:
    B, H, Hkv, M, S, d = check_inputs("tree_attention", q, k, v, mask)
    scale = d ** -0.5 if scale is None else float(scale)
    _check_bounds(B, q.device, kv_end, prefix_end, visible_end, kv_start)
    prefix = 1 if prefix_end is not None else 2 if visible_end is not None else 0
    bound = prefix_end if prefix_end is not None else visible_end
    plan = list(tree_attention_launch(B * H, M, S, d, shared_prefix=prefix == 1, visible_prefix=prefix == 2))
    if block_s is not None:  # keys per program forced: the split kernels, all queries per program
        plan[:2] = _row_block(M), -(-S // block_s)
    for i, forced in enumerate((block_m, num_splits, tile_s, num_warps, num_stages)):
        plan[i] = forced or plan[i]
    block_m, num_splits, tile_s, num_warps, num_stages = plan
    query_blocks = -(-M // block_m)
    dev = q.device
    o = _heads_last(B, H, M, d, q.dtype, dev)
    if B == 0 or H == 0 or M == 0:
        return o
    direct = num_splits == 1
    fused = not direct and (_FUSED_MERGE[0] if fused_merge is None else fused_merge)
    counters = _merge_counters(dev, B * H * query_blocks) if fused else None
    fused = counters is not None
    if direct:  # the output is written by the one launch: no partial sums (the kernel never reads these pointers)
        m = l_sum = acc = o
    else:
        m = torch.empty(B * H, num_splits, M, dtype=torch.float32, device=dev)
        l_sum = torch.empty(B * H, num_splits, M, dtype=torch.float32, device=dev)
        acc = torch.empty(B * H, num_splits, M, d, dtype=torch.float32, device=dev)
    smb = mask.stride(0) if mask.shape[0] > 1 else 0
    block_d = max(16, next_pow2(d))
    _tree_split_kernel[(B * H, num_splits, query_blocks)](
        q, k, v, mask, q if kv_end is None else kv_end, q if bound is None else bound,
        q if kv_start is None else kv_start, m, l_sum, acc, o, counters if fused else q, H,
        H // Hkv, M, S, d, num_splits, scale, q.stride(0), q.stride(1), q.stride(2), q.stride(3), *k.stride(),
        *v.stride(), smb, mask.stride(2), mask.stride(3), _row_stride(kv_end), _row_stride(bound),
        _row_stride(kv_start), *o.stride(),
        BLOCK_M=block_m, BLOCK_S=tile_s, BLOCK_D=block_d,
        IEEE=q.dtype == torch.float32 or INTERPRETED,  # the interpreter's dot reads bf16 as raw bits: float32
        HAS_END=kv_end is not None, HAS_START=kv_start is not None, PREFIX=prefix, DIRECT=direct, FUSED=fused,
        num_warps=num_warps, num_stages=num_stages, **pdl_launch(),
    )
    if not direct and not fused:
        _tree_merge_kernel[(B * H, M)](m, l_sum, acc, o, H, M, d, num_splits, *o.stride(),
                                       BLOCK_NS=next_pow2(num_splits), BLOCK_D=block_d, **pdl_launch())
    return o


def _heads_last(B: int, H: int, M: int, d: int, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised ``[B, H, M, d]`` output laid out as ``[B, M, H, d]`` (as SDPA's is): the caller's merge of
    the heads before ``o_proj`` (``o.transpose(1, 2).reshape(B, M, H * d)``) is then a view, not a copy."""
    return torch.empty(B, M, H, d, dtype=dtype, device=device).transpose(1, 2)


def _check_end(kv_end, B: int, device, name: str = "kv_end") -> None:
    if not isinstance(kv_end, torch.Tensor) or kv_end.dtype not in (torch.int32, torch.int64) \
            or kv_end.dim() != 1 or kv_end.shape[0] not in (1, B):
        raise ValueError(f"tree_attention: {name} must be an integer tensor of shape [B] = [{B}] or [1], got "
                         f"{getattr(kv_end, 'dtype', type(kv_end).__name__)} {tuple(getattr(kv_end, 'shape', ()))}")
    if kv_end.device != device:
        raise ValueError(f"tree_attention: {name} must be on {device} (a device tensor: no sync), got "
                         f"{kv_end.device}")


def _check_bounds(B: int, device, kv_end, prefix_end, visible_end, kv_start=None) -> None:
    """The optional per-row bounds' types, shapes and device; ``prefix_end`` and ``visible_end`` exclusive."""
    for name, bound in (("kv_end", kv_end), ("prefix_end", prefix_end), ("visible_end", visible_end),
                        ("kv_start", kv_start)):
        if bound is not None:
            _check_end(bound, B, device, name)
    if prefix_end is not None and visible_end is not None:
        raise ValueError("tree_attention: pass prefix_end (the prefix's keys masked as for query 0) or visible_end "
                         "(seen by every query), not both")


def _row_stride(bound: torch.Tensor | None) -> int:
    """A per-row bound's stride (0: one value for every row, or none)."""
    return 0 if bound is None or bound.numel() == 1 else bound.stride(0)


def _share_prefix(mask: torch.Tensor, prefix_end: torch.Tensor | None, batch: int) -> torch.Tensor:
    """``mask`` with every key below row ``b``'s ``prefix_end[b]`` masked for every query as for query 0: what the
    kernels read when given ``prefix_end``."""
    if prefix_end is None:
        return mask
    full = mask.expand(max(batch, mask.shape[0]), *mask.shape[1:])
    return torch.where(_keys_below(mask, prefix_end)[:, None, None], full[:, :, :1], full)


def _show_prefix(mask: torch.Tensor, visible_end: torch.Tensor | None, batch: int) -> torch.Tensor:
    """``mask`` with every key below row ``b``'s ``visible_end[b]`` seen by every query (0): what the kernels take
    when given ``visible_end`` (they read no mask there)."""
    if visible_end is None:
        return mask
    full = mask.expand(max(batch, mask.shape[0]), *mask.shape[1:])
    return full.masked_fill(_keys_below(mask, visible_end)[:, None, None], 0.0)


def _hide_past_end(mask: torch.Tensor, kv_end: torch.Tensor | None, batch: int,
                   kv_start: torch.Tensor | None = None) -> torch.Tensor:
    """``mask`` with every key at or past its row's ``kv_end`` (and below its ``kv_start``) hidden (``-inf``): what
    the kernels read."""
    for bound, below in ((kv_end, False), (kv_start, True)):
        if bound is not None:
            hide = _keys_below(mask, bound) == below
            mask = mask.expand(max(batch, mask.shape[0]), *mask.shape[1:]).masked_fill(hide[:, None, None],
                                                                                    float("-inf"))
    return mask


def _keys_below(mask: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """Shape ``[B or 1, S]`` bool: key ``s`` of row ``b`` lies below ``bound[b]``."""
    return torch.arange(mask.shape[-1], device=mask.device) < bound.to(mask.device)[:, None]


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   scale: float | None = None, *, kv_end: torch.Tensor | None = None,
                   prefix_end: torch.Tensor | None = None, visible_end: torch.Tensor | None = None,
                   kv_start: torch.Tensor | None = None, block_s: int | None = None) -> torch.Tensor:
    """Attention of a verify bucket: ``M`` tree nodes per row and head over the ``S`` cached keys, under an
    additive mask (each node sees the committed keys, its ancestors and itself).

    .. math::
        O_{bh} = \\mathrm{softmax}\\bigl(\\mathrm{scale}\\; Q_{bh} K_{b,g(h)}^\\top + A_b\\bigr) V_{b,g(h)}
        \\in \\mathbb{R}^{M \\times d}, \\qquad g(h) = \\lfloor h H_{kv} / H \\rfloor

    Dispatch: the split-key Triton kernels (two launches where the keys are split; one with
    :func:`use_fused_tree_merge`) when the tensors are on CUDA, triton imports and
    ``M <=`` :data:`TREE_ATTENTION_MAX_M` (inside ``torch.compile`` too, as the custom op
    ``torch.ops.specdec.tree_attention``); :func:`tree_attention_ref` otherwise, and whenever a gradient is
    needed (the kernels have no backward: training runs SDPA).

    Args:
        q: Shape ``[B, H, M, d]`` (any strides).
        k: Shape ``[B, H_kv, S, d]`` (the static cache's keys; any strides).
        v: Shape ``[B, H_kv, S, d]``.
        mask: Shape ``[B, 1, M, S]`` (or ``[1, 1, M, S]``), additive float: 0 where a key may be attended, a large
            negative value (``torch.finfo(dtype).min`` or ``-inf``) where not. A query should see at least one
            key; one that sees none under ``-inf`` (a bucket's padding) gets zeros where SDPA gives NaN.
        scale: softmax scale (default ``d ** -0.5``).
        kv_end: Shape ``[B]`` or ``[1]``, int32/int64, on ``q``'s device (optional): row ``b``'s keys at or past
            ``kv_end[b]`` are hidden whatever the mask says, and never read; the chunks split the keys below it
            (read on the device: no sync, so a captured step keeps it).
        prefix_end: Shape ``[B]`` or ``[1]``, int32/int64, on ``q``'s device (optional): row ``b``'s keys below
            ``prefix_end[b]`` are masked for *every* query as for query 0 (``mask[b, 0, k]``), and the kernels
            read one mask row for them instead of a tile per query block (a tile's read costs about as much as the
            rest of the tile's work at a 7B verify). Pass it where the queries share that prefix's mask, as a
            verify forward's tree nodes share the committed slots (the fast path passes its committed length);
            a query whose row differs (a bucket's padding node, which :func:`specdec.kernels.tree_mask` hides
            from the committed slots) then sees what query 0 sees there.
        visible_end: Shape ``[B]`` or ``[1]``, int32/int64, on ``q``'s device (optional; not with ``prefix_end``):
            row ``b``'s keys below ``visible_end[b]`` are seen by *every* query whatever the mask says, and the
            kernels read no mask for them. Pass it where the row's slots below it (from ``kv_start``, if given)
            all hold real tokens that every query sees (the fast path's committed slots of a dense row: no holes).
        kv_start: Shape ``[B]`` or ``[1]``, int32/int64, on ``q``'s device (optional): row ``b``'s keys below
            ``kv_start[b]`` are hidden whatever the mask says, and never read; the chunks split the keys from it
            to ``kv_end`` (a left-padded prompt's padding slots: the fast path passes it with ``visible_end``).
        block_s: keys per program to force, a multiple of 32 (tests, benchmarks: the split kernels with every
            query of a row in one program); default :func:`tree_attention_plan`.

    Returns:
        Shape ``[B, H, M, d]`` in ``q``'s dtype; from the kernels laid out as ``[B, M, H, d]`` (SDPA's layout), so
        that merging the heads (``o.transpose(1, 2).reshape(B, M, H * d)``) costs no copy.

    Raises:
        ValueError: shapes that do not match, a boolean mask or a bad ``kv_end``, naming the argument.
    """
    check_inputs("tree_attention", q, k, v, mask)
    bounds = dict(kv_end=kv_end, prefix_end=prefix_end, visible_end=visible_end, kv_start=kv_start)
    if q.shape[2] > TREE_ATTENTION_MAX_M or (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))):
        # long forwards; training (the kernels have no backward)
        return tree_attention_ref(q, k, v, mask, scale, **bounds)
    if get_kernel_mode() == "auto":
        on_cuda = all(t.is_cuda for t in (q, k, v, mask)) and triton_available()
        if on_cuda and torch.compiler.is_compiling():  # an opaque op for inductor
            return torch.ops.specdec.tree_attention(q, k, v, mask, scale, kv_end, prefix_end, visible_end, kv_start)
        if on_cuda:  # eagerly (and inside CUDA graphs) the launcher itself: no dispatcher on the hot path
            return _tree_attention_triton(q, k, v, mask, scale, block_s, **bounds)
        return tree_attention_ref(q, k, v, mask, scale, **bounds)
    if use_kernel("tree_attention", q, k, v, mask):  # forced: the kernel (under the interpreter on CPU)
        return _tree_attention_triton(q, k, v, mask, scale, block_s, **bounds)
    return tree_attention_ref(q, k, v, mask, scale, **bounds)

if triton_available():
    @torch.library.custom_op("specdec::tree_attention", mutates_args=())
    def _tree_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                           scale: float | None, kv_end: torch.Tensor | None = None,
                           prefix_end: torch.Tensor | None = None, visible_end: torch.Tensor | None = None,
                           kv_start: torch.Tensor | None = None) -> torch.Tensor:
        return _tree_attention_triton(q, k, v, mask, scale, kv_end=kv_end, prefix_end=prefix_end,
                                      visible_end=visible_end, kv_start=kv_start)

    @_tree_attention_op.register_fake
    def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None,
          kv_end: torch.Tensor | None = None, prefix_end: torch.Tensor | None = None,
          visible_end: torch.Tensor | None = None, kv_start: torch.Tensor | None = None) -> torch.Tensor:
        B, H, M, d = q.shape
        return _heads_last(B, H, M, d, q.dtype, q.device)
