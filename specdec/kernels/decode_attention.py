"""Attention of one query per row over a static cache, split along the keys (flash-decoding).

A decode step attends one new query per row and head to every slot of the static cache. SDPA's kernels give each
(row, head) one program that walks all ``S`` keys alone: on the H200, for Llama-2-7B's 32 heads over ~700 slots,
29 us per layer for 11 MB of keys and values (memory-efficient kernel; cuDNN's took about as long inside captured
steps), i.e. ~0.9 ms of a 5.2 ms decode step. This op splits the keys into ``BLOCK_S`` chunks, one program per
(row, head, chunk): each computes its chunk's softmax statistics (max ``m``, sum ``l``) and weighted values, and a
second launch merges the chunks (``o = sum_c e^{m_c - m} acc_c / sum_c e^{m_c - m} l_c``). Grouped-query attention
reads each key/value head once per query head it serves, without expanding the cache.

Reference: ``F.scaled_dot_product_attention`` with the additive mask (keys/values repeated for grouped-query
attention), which :func:`decode_attention_ref` is. Results equal it up to float rounding (float32 statistics).

References:
    Dao et al., "Flash-Decoding for long-context inference" (2023); Dao, "FlashAttention-2", arXiv 2307.08691.
"""
from __future__ import annotations

import torch

from ._dispatch import use_kernel
from ._triton import jit, next_pow2, pdl_launch, pdl_start, tl
from .tree_attention import _tree_merge_kernel, check_inputs, sdpa_reference

__all__ = ["decode_attention", "decode_attention_ref", "decode_split"]


def _check(q, k, v, mask) -> tuple[int, int, int, int, int]:
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[2] != 1:
        raise ValueError(f"decode_attention: q must have shape [B, H, 1, d] (one query per row and head), got "
                         f"{tuple(getattr(q, 'shape', ()))}; use specdec.kernels.tree_attention for longer queries")
    B, H, Hkv, _, S, d = check_inputs("decode_attention", q, k, v, mask)
    return B, H, Hkv, S, d


def decode_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                         scale: float | None = None) -> torch.Tensor:
    """Reference for :func:`decode_attention`: ``F.scaled_dot_product_attention`` under the additive mask.

    Args:
        q: Shape ``[B, H, 1, d]``.
        k: Shape ``[B, H_kv, S, d]`` (``H`` a multiple of ``H_kv``).
        v: Shape ``[B, H_kv, S, d]``.
        mask: Shape ``[B, 1, 1, S]`` (or ``[1, 1, 1, S]``), additive, float.
        scale: softmax scale (default ``d ** -0.5``).

    Returns:
        Shape ``[B, H, 1, d]`` in ``q``'s dtype.
    """
    _check(q, k, v, mask)
    return sdpa_reference(q, k, v, mask, scale)


def decode_split(batch_heads: int, keys: int) -> int:
    """``BLOCK_S``, keys per program: about 1,024 programs in all, 16 to 256 keys each."""
    return max(16, min(256, next_pow2(-(-keys * batch_heads // 1024))))


@jit
def _split_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, H, group, S, D, NS, scale,
                  sqb, sqh, sqd, skb, skh, sks, skd, svb, svh, svs, svd, smb, sms,
                  BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (row * head, chunk): the chunk's max score, sum of exponentials and weighted values."""
    pdl_start(PDL)
    bh = tl.program_id(0)
    chunk = tl.program_id(1)
    b = bh // H
    h = bh % H
    kvh = h // group
    dims = tl.arange(0, BLOCK_D)
    d_in = dims < D
    q = tl.load(q_ptr + b * sqb + h * sqh + dims * sqd, mask=d_in, other=0.0).to(tl.float32)
    s = chunk * BLOCK_S + tl.arange(0, BLOCK_S)
    s_in = s < S
    tile = s_in[:, None] & d_in[None, :]
    keys = tl.load(k_ptr + b * skb + kvh * skh + s[:, None] * sks + dims[None, :] * skd, mask=tile, other=0.0)
    scores = tl.sum(keys.to(tl.float32) * q[None, :], axis=1) * scale
    scores += tl.load(mask_ptr + b * smb + s * sms, mask=s_in, other=0.0).to(tl.float32)
    scores = tl.where(s_in, scores, float("-inf"))
    m = tl.max(scores, axis=0)
    p = tl.exp(scores - m)
    values = tl.load(v_ptr + b * svb + kvh * svh + s[:, None] * svs + dims[None, :] * svd, mask=tile, other=0.0)
    acc = tl.sum(p[:, None] * values.to(tl.float32), axis=0)
    out = bh * NS + chunk
    tl.store(m_ptr + out, m)
    tl.store(l_ptr + out, tl.sum(p, axis=0))
    tl.store(acc_ptr + out * D + dims, acc, mask=d_in)


def _decode_attention_triton(q, k, v, mask, scale, block_s=None) -> torch.Tensor:
    B, H, Hkv, S, d = _check(q, k, v, mask)
    scale = d ** -0.5 if scale is None else float(scale)
    block_s = block_s or decode_split(B * H, S)
    num_splits = -(-S // block_s)
    dev = q.device
    m = torch.empty(B * H, num_splits, dtype=torch.float32, device=dev)
    l_sum = torch.empty(B * H, num_splits, dtype=torch.float32, device=dev)
    acc = torch.empty(B * H, num_splits, d, dtype=torch.float32, device=dev)
    o = torch.empty(B, H, 1, d, dtype=q.dtype, device=dev)
    if B == 0 or H == 0:
        return o
    smb = mask.stride(0) if mask.shape[0] > 1 else 0
    _split_kernel[(B * H, num_splits)](
        q, k, v, mask, m, l_sum, acc, H, H // Hkv, S, d, num_splits, scale,
        q.stride(0), q.stride(1), q.stride(3), *k.stride(), *v.stride(), smb, mask.stride(3),
        BLOCK_S=block_s, BLOCK_D=next_pow2(d), **pdl_launch(),
    )
    # the merge is tree_attention's for one query: partial sums at [row * head, chunk, 0]
    _tree_merge_kernel[(B * H, 1)](m, l_sum, acc, o, H, 1, d, num_splits, *o.stride(),
                                   BLOCK_NS=next_pow2(num_splits), BLOCK_D=next_pow2(d), **pdl_launch())
    return o


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float | None = None, *, block_s: int | None = None) -> torch.Tensor:
    """Softmax attention of one query per row and head over ``S`` cached keys, under an additive mask.

    .. math::
        o_{bh} = \\sum_s \\mathrm{softmax}_s\\bigl(\\mathrm{scale}\\; q_{bh} \\cdot k_{b,g(h),s} + M_{bs}\\bigr)
            v_{b,g(h),s}, \\qquad g(h) = \\lfloor h H_{kv} / H \\rfloor

    Dispatch: the split-key Triton kernels (two launches) when the tensors are on CUDA and triton imports,
    :func:`decode_attention_ref` otherwise (and inside ``torch.compile``).

    Args:
        q: Shape ``[B, H, 1, d]`` (any strides).
        k: Shape ``[B, H_kv, S, d]`` (the static cache's keys; any strides).
        v: Shape ``[B, H_kv, S, d]``.
        mask: Shape ``[B, 1, 1, S]`` (or ``[1, 1, 1, S]``), additive float: 0 where a key may be attended, a large
            negative value (e.g. ``torch.finfo(dtype).min``) where not. Every row must see at least one key.
        scale: softmax scale (default ``d ** -0.5``).
        block_s: keys per program to force (tests, benchmarks); default :func:`decode_split`.

    Returns:
        Shape ``[B, H, 1, d]`` in ``q``'s dtype.

    Raises:
        ValueError: shapes that do not match, naming the argument.
    """
    if use_kernel("decode_attention", q, k, v, mask):
        return _decode_attention_triton(q, k, v, mask, scale, block_s)
    return decode_attention_ref(q, k, v, mask, scale)
