"""Attention: grouped-query projections with RoPE, masked SDPA, and attention over a preallocated KV cache.

The attention *computation* is a callable ``attend(q, k, v) -> o`` chosen per layer by the caller, so the same
layer runs causally, under a custom mask, over a KV cache, or inside a training-time unroll::

    attend_for_layer = cached_attention(cache, slots, mask)   # or uncached_attention(mask), or your own
    o = attend_for_layer(i)(q, k, v)                          # q [B, h, T, d], k/v [B, h_kv, T, d] -> [B, h, T, d]

An ``attend`` may also carry ``attend.rotate_store(qkv, cos, sin, num_heads) -> o``: the same attention from the
fused projection ``qkv [B, T, h + 2 h_kv, d]`` before RoPE, which :class:`Attention` calls on its fused inference
path (:mod:`specdec.nn.inference`); :func:`cached_attention` 's does RoPE and the cache writes in one launch.

This module is also the one place that says which SDPA backends masked attention may use
(:func:`masked_sdpa_backends`, :func:`masked_sdpa_kernel`); the heads and :mod:`specdec.adapter` both use it.

References:
    Vaswani et al., "Attention Is All You Need", arXiv 1706.03762; Ainslie et al., "GQA", arXiv 2305.13245.
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..kernels.decoder_ops import rope_store
from ..kernels.tree_attention import TREE_ATTENTION_MAX_M, tree_attention
from ..masks import to_aligned_additive_mask
from .inference import apply_linear, fused_inference, fused_linear, inference_linear
from .linear import zero_linear
from .rope import apply_rotary

__all__ = [
    "AttendFn",
    "Attention",
    "KVCache",
    "cached_attention",
    "masked_attention",
    "uncached_attention",
    "masked_sdpa_backends",
    "masked_sdpa_kernel",
    "fixed_shape_attention",
    "use_tree_attention",
]

# attend(q, k, v) -> o with q [B, h, T, d], k/v [B, h_kv, T, d] (RoPE applied), o [B, h, T, d]
AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


_FIXED_SHAPES = [0]  # > 0 inside fixed_shape_attention()
_TREE_KERNEL = [True]  # masked_attention of a few queries on specdec.kernels.tree_attention (on CUDA)


def use_tree_attention(enabled: bool) -> bool:
    """Whether :func:`masked_attention` of 2 to :data:`~specdec.kernels.TREE_ATTENTION_MAX_M` queries under a mask
    runs :func:`specdec.kernels.tree_attention` (on CUDA) instead of SDPA; returns the previous setting.
    :func:`specdec.fused.decode_kernels` (``tree_attention=``) sets it with the fused decoders' setting.

    Args:
        enabled: the new setting.

    Returns:
        The setting that was in force.
    """
    previous, _TREE_KERNEL[0] = _TREE_KERNEL[0], bool(enabled)
    return previous


@contextlib.contextmanager
def fixed_shape_attention():
    """Within the block, masked attention may use cuDNN's SDPA too, first (see :func:`masked_sdpa_backends`).

    For code whose shapes never change after the block: :func:`specdec.graphs.capture_graph` wraps its warm-up
    runs and its capture in it (a captured graph replays one shape, so cuDNN's per-shape plan is built once, at
    capture, and compiled code traced there keeps the choice). Nested blocks are fine.

    Example:
        >>> with fixed_shape_attention():                                   # doctest: +SKIP
        ...     graph = capture_graph(step, inputs)
    """
    _FIXED_SHAPES[0] += 1
    try:
        yield
    finally:
        _FIXED_SHAPES[0] -= 1


def masked_sdpa_backends() -> list[SDPBackend]:
    """The SDPA backends attention under a custom mask may use, in order of preference.

    Outside :func:`fixed_shape_attention`: flash, memory-efficient, math; never cuDNN. With a custom mask PyTorch
    may pick its cuDNN backend, which builds a new execution plan for every new shape: about 13 ms of CPU per
    attention call, measured on an H200 with torch 2.11. Eager speculative decoding changes the key length (and
    the tree width) every step, so every call would pay it. The memory-efficient kernel takes arbitrary masks
    without a per-shape plan.

    Inside :func:`fixed_shape_attention` (captured steps): cuDNN first, then the same three. For one query over a
    few hundred keys the memory-efficient kernel is latency-bound (34 us per call on the H200 for the fixture's
    plain step, against 6 us for cuDNN's), and a captured step's shape is fixed, so the plan is built once.

    Returns:
        The allowed backends, in order of preference (applied by :func:`masked_sdpa_kernel`).
    """
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    if _FIXED_SHAPES[0]:
        return [SDPBackend.CUDNN_ATTENTION, *backends]
    return backends


# Whether this torch's sdpa_kernel takes set_priority (the list's order as the order of preference); read once
# here, outside any code dynamo traces.
_TAKES_PRIORITY = "set_priority" in inspect.signature(sdpa_kernel).parameters


def masked_sdpa_kernel():
    """A context manager that restricts SDPA to :func:`masked_sdpa_backends`, in their order (for HF models too).

    Returns:
        ``torch.nn.attention.sdpa_kernel(masked_sdpa_backends(), set_priority=True)`` (without ``set_priority``
        on a torch that lacks it).

    Example:
        >>> with masked_sdpa_kernel():                                   # doctest: +SKIP
        ...     out = model(input_ids=ids, attention_mask=mask4d)
    """
    if _TAKES_PRIORITY:
        return sdpa_kernel(masked_sdpa_backends(), set_priority=True)
    return sdpa_kernel(masked_sdpa_backends())


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention under a boolean mask (``None``: causal), on :func:`masked_sdpa_backends`.

    .. math::
        o = \\mathrm{softmax}(q k^\\top / \\sqrt{d} + M) v, \\qquad
        M_{ts} = 0 \\text{ if mask}_{ts} \\text{ else } -\\infty

    Args:
        q: Shape ``[B, h, T, d]``.
        k: Shape ``[B, h_kv, S, d]`` (``h`` a multiple of ``h_kv``: grouped-query attention).
        v: Shape ``[B, h_kv, S, d]``.
        mask: Shape ``[B, 1, T, S]`` bool, True = may attend; ``None`` = causal (``S = T``). Every row must see
            at least one key.

    Returns:
        Shape ``[B, h, T, d]``.

    References:
        arXiv 1706.03762; GQA arXiv 2305.13245.
    """
    gqa = q.shape[1] != k.shape[1]
    if mask is not None and mask.dtype == torch.bool and q.is_cuda:
        mask = to_aligned_additive_mask(mask, q.dtype)  # else SDPA converts and pads it in every call
    if mask is not None and q.is_cuda and _TREE_KERNEL[0] and 1 < q.shape[2] <= TREE_ATTENTION_MAX_M:
        return tree_attention(q, k, v, mask)
    with masked_sdpa_kernel():
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def uncached_attention(mask: torch.Tensor | None = None) -> Callable[[int], AttendFn]:
    """Per-layer attention without a cache: every layer runs :func:`masked_attention` under ``mask``.

    Args:
        mask: Shape ``[B, 1, T, T]`` bool, True = may attend; ``None`` = causal.

    Returns:
        ``layer -> attend(q, k, v)``.
    """
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return masked_attention(q, k, v, mask)

    return lambda layer: attend


class KVCache(NamedTuple):
    """Preallocated keys and values of a stack of attention layers (written in place, slot by slot).

    Slot ``s`` of a row holds whatever entry the caller wrote there; which slots are real is the caller's
    business (it passes the mask).

    Attributes:
        keys: Shape ``[L, B, h_kv, C, d]`` (RoPE applied).
        values: Shape ``[L, B, h_kv, C, d]``.
    """

    keys: torch.Tensor
    values: torch.Tensor

    @classmethod
    def zeros(cls, num_layers: int, batch_size: int, num_kv_heads: int, capacity: int, head_dim: int,
              device=None, dtype=None) -> KVCache:
        """A zeroed cache.

        Args:
            num_layers, batch_size, num_kv_heads, capacity, head_dim: ``L, B, h_kv, C, d``.
            device, dtype: where and how to allocate.

        Returns:
            A :class:`KVCache` with ``capacity`` slots per row.
        """
        shape = (num_layers, batch_size, num_kv_heads, capacity, head_dim)
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))

    @property
    def capacity(self) -> int:
        """``C``: slots per row."""
        return self.keys.shape[3]


def cached_attention(cache: KVCache, slots: torch.Tensor, mask: torch.Tensor,
                     kv_length: int | None = None) -> Callable[[int], AttendFn]:
    """Per-layer attention over a KV cache: write this call's keys/values at ``slots``, then attend under ``mask``.

    Args:
        cache: the :class:`KVCache` (written in place).
        slots: Shape ``[B, T]`` int64, the slot each entry's key and value go to.
        mask: Shape ``[B, 1, T, kv_length]`` bool, True = may attend, over slots ``0..kv_length-1`` *after*
            this call's writes (an entry usually sees itself).
        kv_length: attend over slots ``[0, kv_length)`` (default: the whole cache).

    Returns:
        ``layer -> attend(q, k, v)``.
    """
    kv_length = cache.capacity if kv_length is None else kv_length

    def for_layer(layer: int) -> AttendFn:
        keys, values = cache.keys[layer], cache.values[layer]

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # keys[rows, :, slots] is [B, T, h_kv, d]: the advanced indices come first (rows made here: the fused
            # path's rotate_store needs none, so a captured head forward carries no arange for it)
            rows = torch.arange(slots.shape[0], device=slots.device)[:, None]
            keys[rows, :, slots] = rearrange(k, "b h t d -> b t h d").to(keys.dtype)
            values[rows, :, slots] = rearrange(v, "b h t d -> b t h d").to(values.dtype)
            return masked_attention(q, keys[:, :, :kv_length].to(q.dtype), values[:, :, :kv_length].to(q.dtype),
                                    mask)

        def rotate_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int) -> torch.Tensor:
            if keys.dtype != qkv.dtype:  # a cache in another dtype: the plain path
                return attend(*split_rotate(qkv, cos, sin, num_heads))
            q = rope_store(qkv, cos, sin, keys, values, slots, num_heads, signed=False)
            return masked_attention(q, keys[:, :, :kv_length], values[:, :, :kv_length], mask)

        attend.rotate_store = rotate_store
        return attend

    return for_layer


def split_rotate(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys and values of a fused projection, RoPE applied to queries and keys.

    Args:
        qkv: Shape ``[B, T, h + 2 h_kv, d]``.
        cos: Shape ``[B, 1, T, d]``.
        sin: Shape ``[B, 1, T, d]``.
        num_heads: ``h``.

    Returns:
        ``(q [B, h, T, d], k [B, h_kv, T, d], v [B, h_kv, T, d])``.
    """
    nk = (qkv.shape[2] - num_heads) // 2
    q, k, v = (t.transpose(1, 2) for t in qkv.split([num_heads, nk, nk], dim=2))
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


class Attention(nn.Module):
    """Grouped-query attention projections with RoPE; the attention itself is the caller's ``attend``.

    .. math::
        o = W_o \\,\\mathrm{attend}(\\mathrm{RoPE}(W_q x), \\mathrm{RoPE}(W_k x), W_v x)

    Args:
        in_features: width the projections read (``H``, or ``2H`` for EAGLE-3's fused input).
        hidden_size: output width ``H``.
        num_heads: query heads ``h``.
        num_kv_heads: key/value heads ``h_kv`` (``h`` a multiple of it).
        head_dim: ``d``.
        bias: q/k/v projections have biases (Qwen2-style); ``o_proj`` never does.

    References:
        arXiv 1706.03762; GQA arXiv 2305.13245; HF ``LlamaAttention`` (parameter names).
    """

    def __init__(self, in_features: int, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 *, bias: bool = False):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = zero_linear(in_features, num_heads * head_dim, bias=bias)
        self.k_proj = zero_linear(in_features, num_kv_heads * head_dim, bias=bias)
        self.v_proj = zero_linear(in_features, num_kv_heads * head_dim, bias=bias)
        self.o_proj = zero_linear(num_heads * head_dim, hidden_size, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Queries, keys and values, split into heads, RoPE applied to queries and keys.

        Args:
            x: Shape ``[B, T, in_features]``.
            cos: Shape ``[B, 1, T, d]``.
            sin: Shape ``[B, 1, T, d]``.

        Returns:
            ``(q [B, h, T, d], k [B, h_kv, T, d], v [B, h_kv, T, d])``.
        """
        d = self.head_dim
        q = rearrange(self.q_proj(x), "b t (h d) -> b h t d", d=d)
        k = rearrange(self.k_proj(x), "b t (h d) -> b h t d", d=d)
        v = rearrange(self.v_proj(x), "b t (h d) -> b h t d", d=d)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """Merge the heads and project back.

        Args:
            o: Shape ``[B, h, T, d]``.

        Returns:
            Shape ``[B, T, H]``.
        """
        return apply_linear(self.o_proj, rearrange(o, "b h t d -> b t (h d)"))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        """``output(attend(*project(x, cos, sin)))`` (on the fused inference path one ``[q; k; v]`` projection, and
        ``attend.rotate_store`` where the attention has one).

        Args:
            x: Shape ``[B, T, in_features]``.
            cos: Shape ``[B, 1, T, d]``.
            sin: Shape ``[B, 1, T, d]``.
            attend: the attention computation (see the module docstring).

        Returns:
            Shape ``[B, T, H]``.
        """
        if not fused_inference(x):
            return self.output(attend(*self.project(x, cos, sin)))
        B, T, _ = x.shape
        nh, nk, d = self.num_heads, self.num_kv_heads, self.head_dim
        weight, bias = fused_linear(self, ("q_proj", "k_proj", "v_proj"))
        qkv = inference_linear(x, weight, bias).view(B, T, nh + 2 * nk, d)
        rotate_store = getattr(attend, "rotate_store", None)
        if rotate_store is not None:
            return self.output(rotate_store(qkv, cos, sin, nh))
        return self.output(attend(*split_rotate(qkv, cos, sin, nh)))
