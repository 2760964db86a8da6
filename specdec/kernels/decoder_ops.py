"""Fused element-wise ops of a Llama-family decoder layer: residual add + RMSNorm, RoPE + KV-cache write, SiLU-mul.

A decode step of a 7B model runs ~23 kernels per layer on the fused decoder; after the projections and attention,
the rest are small element-wise kernels of 2-3 us each (on the H200 ~1.0 ms of a 5.2 ms step in ~600 kernels).
Each op here replaces a group of them with one launch and the same arithmetic, rounding where the torch code
rounds (float32 results agree to float rounding; bfloat16 ones to within a unit in the last place):

================================ ====================================================== ==================
op                               replaces (torch reference)                             kernels: torch -> 1
================================ ====================================================== ==================
:func:`add_rms_norm`             ``h = x + r``; ``w * rms_norm(h.float()).to(dtype)``   5 (4 without ``r``)
:func:`rope_store`               RoPE of q and k, ``index_copy_`` of k and v to the cache 5
:func:`silu_mul`                 ``F.silu(gate) * up``                                    2
:func:`embed_concat`             a draft head's ``cat([embedding(ids), hidden], -1)``     2
================================ ====================================================== ==================

References:
    Zhang and Sennrich, "Root Mean Square Layer Normalization", arXiv 1910.07467; Su et al., "RoFormer",
    arXiv 2104.09864; Shazeer, "GLU Variants Improve Transformer", arXiv 2002.05202.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._dispatch import use_kernel
from ._triton import as_rows, jit, next_pow2, pdl_launch, pdl_start, tl
from .fp8 import _ONE_PASS_MAX as ROW_FP8_MAX  # the widest row rounded to float8 from one program's registers
from .fp8 import FP8_DTYPE, Fp8Rows, store_fp8_row

__all__ = ["add_rms_norm", "add_rms_norm_ref", "rope_store", "rope_store_ref", "silu_mul", "silu_mul_ref",
           "embed_concat", "embed_concat_ref", "table_rows", "table_rows_ref", "last_rows", "last_rows_ref",
           "decoder_inputs", "decoder_inputs_ref"]


# ---------------------------------------------------------------------------------------------- add + RMSNorm

def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for :func:`add_rms_norm` (HF's ``LlamaRMSNorm`` after the residual add).

    Args:
        x: Shape ``[..., H]``.
        residual: Shape ``[..., H]`` or ``None``.
        weight: Shape ``[H]``.
        eps: the norm's epsilon.

    Returns:
        ``(h, normed)``: ``h = x + residual`` (``x`` itself without a residual) and
        ``weight * rms_norm(h.float()).to(h.dtype)``, both ``[..., H]`` in ``x``'s dtype.
    """
    h = x if residual is None else x + residual
    return h, weight * F.rms_norm(h.float(), (h.shape[-1],), eps=eps).to(h.dtype)


@jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, out_ptr, s_ptr, H, eps, sx, sr, sh, so,
                         HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr, FP8: tl.constexpr,
                         PDL: tl.constexpr = False):
    """One program per row: ``h = x + r`` (rounded to the dtype, stored), then the norm of ``h``; ``FP8``: the
    normed row (in the dtype) rounded to float8, codes at ``out``, scale at ``s`` (:func:`store_fp8_row`)."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    inside = cols < H
    h = tl.load(x_ptr + row * sx + cols, mask=inside, other=0.0)
    if HAS_RESIDUAL:
        h = (h.to(tl.float32) + tl.load(r_ptr + row * sr + cols, mask=inside, other=0.0).to(tl.float32))
        h = h.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * sh + cols, h, mask=inside)
    hf = h.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / H + eps)
    normed = (hf * inv).to(h_ptr.dtype.element_ty).to(tl.float32)  # h, out: x's dtype (out float8 with FP8)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    if FP8:
        store_fp8_row((w * normed).to(h_ptr.dtype.element_ty).to(tl.float32), cols, inside, out_ptr + row * so,
                      s_ptr + row)
    else:
        tl.store(out_ptr + row * so + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=inside)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float, *, fp8_out: bool = False) -> tuple[torch.Tensor, torch.Tensor | Fp8Rows]:
    """The residual add and the RMSNorm after it, in one launch on CUDA (:func:`add_rms_norm_ref` elsewhere).

    .. math::
        h = x + r, \\qquad \\mathrm{out} = w \\odot \\mathrm{cast}\\Bigl(h / \\sqrt{\\tfrac1H \\sum_i h_i^2 +
            \\epsilon}\\Bigr)

    with the sum in float32 and ``h`` and the normalised value rounded to ``x``'s dtype as HF's modules do.

    Args:
        x: Shape ``[..., H]`` (float).
        residual: Shape ``[..., H]``, ``x``'s dtype, or ``None`` (no add: ``h = x``).
        weight: Shape ``[H]``, ``x``'s dtype.
        eps: epsilon.
        fp8_out: return ``normed`` rounded to float8 (:class:`~specdec.kernels.fp8.Fp8Rows`, the codes of
            ``quantize_fp8_rows(normed)``) for a float8 product to read, rounded in the same launch.

    Returns:
        ``(h, normed)``, both ``[..., H]`` in ``x``'s dtype (``h`` is ``x`` itself without a residual); with
        ``fp8_out`` ``normed`` is an ``Fp8Rows``.

    Raises:
        ValueError: mismatched shapes or dtypes.
    """
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"add_rms_norm: residual {tuple(residual.shape)} {residual.dtype} must match x "
                         f"{tuple(x.shape)} {x.dtype}")
    if weight.shape != (x.shape[-1],) or weight.dtype != x.dtype:
        raise ValueError(f"add_rms_norm: weight must have shape [H] = [{x.shape[-1]}] and x's dtype {x.dtype}, got "
                         f"{tuple(weight.shape)} {weight.dtype}")
    tensors = (x, weight) if residual is None else (x, residual, weight)
    if not use_kernel("add_rms_norm", *tensors):
        h, normed = add_rms_norm_ref(x, residual, weight, eps)
        return h, (Fp8Rows.of(normed) if fp8_out else normed)
    H = x.shape[-1]
    x2 = as_rows(x)
    r2 = as_rows(residual) if residual is not None else x2
    h = torch.empty_like(x2) if residual is not None else x2
    out = torch.empty(x2.shape, dtype=FP8_DTYPE if fp8_out else x.dtype, device=x.device)
    scale = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device) if fp8_out else out
    if x2.shape[0]:
        _add_rms_norm_kernel[(x2.shape[0],)](x2, r2, weight.contiguous(), h, out, scale, H, float(eps), x2.stride(0),
                                             r2.stride(0), h.stride(0), out.stride(0),
                                             HAS_RESIDUAL=residual is not None, BLOCK_H=next_pow2(H),
                                             FP8=fp8_out, num_warps=8 if H >= 2048 else 4, **pdl_launch())
    shape = x.shape
    normed = Fp8Rows(out.view(shape), scale.view(shape[:-1]), x.dtype) if fp8_out else out.view(shape)
    return (x if residual is None else h.view(shape)), normed


# ------------------------------------------------------------------------------------------- RoPE + KV store

def rope_store_ref(qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, keys: torch.Tensor,
                   values: torch.Tensor, slots: torch.Tensor, num_heads: int, *, signed: bool = True) -> torch.Tensor:
    """Reference for :func:`rope_store`.

    Args:
        qkv: Shape ``[B, M, nh + 2 nk, d]``: the fused projection's output per head (q heads, k heads, v heads).
        cos: Shape ``[B, M, 1, d]`` (or ``[B, M, d]``, or ``[B, 1, M, d]`` as :class:`specdec.nn.RotaryEmbedding`
            gives it): the RoPE table at the tokens' positions.
        sin_signed: like ``cos``, ``sin`` with its first half negated (``FusedDecoder``'s table); with
            ``signed=False`` the plain ``sin``.
        keys: Shape ``[B, nk, S, d]``, written in place at ``slots``.
        values: Shape ``[B, nk, S, d]``, written in place at ``slots``.
        slots: Shape ``[M]`` int64, the cache slot of each of the ``M`` tokens (the same for every row), or
            ``[B, M]``, one per row and token (two equal slots of a row keep either token's entry: a trash slot).
        num_heads: ``nh``.
        signed: whether ``sin_signed`` already has its first half negated.

    Returns:
        q after RoPE, Shape ``[B, nh, M, d]`` (a view).
    """
    nh = num_heads
    B, M, heads, d = qkv.shape
    nk = (heads - nh) // 2
    half = d // 2
    cos, sin_signed = cos.reshape(B, M, 1, d), sin_signed.reshape(B, M, 1, d)
    if not signed:  # -x_2 sin == x_2 (-sin): the same products, so the same rounding
        sin_signed = torch.cat((-sin_signed[..., :half], sin_signed[..., half:]), dim=-1)
    qk, v = qkv[:, :, :nh + nk], qkv[:, :, nh + nk:]
    qk = torch.addcmul(qk * cos, torch.cat((qk[..., half:], qk[..., :half]), dim=-1), sin_signed)
    k = qk[:, :, nh:].to(keys.dtype)
    if slots.dim() == 1:
        keys.index_copy_(2, slots, k.transpose(1, 2))
        values.index_copy_(2, slots, v.transpose(1, 2).to(values.dtype))
    else:  # keys[rows, :, slots] is [B, M, nk, d]: the advanced indices come first
        rows = torch.arange(B, device=slots.device)[:, None]
        keys[rows, :, slots] = k
        values[rows, :, slots] = v.to(values.dtype)
    return qk[:, :, :nh].transpose(1, 2)


@jit
def _rope_store_kernel(qkv_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, slot_ptr, q_ptr, M, NH, NK, D,
                       s_b, s_m, s_h, c_b, c_m, n_b, n_m, k_b, k_h, k_s, v_b, v_h, v_s, q_b, q_h, q_m, slot_b,
                       BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, SIGNED: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (row * token, block of ``BLOCK_H`` heads): its q heads rotated to ``q``, k heads rotated
    and v heads copied to the token's cache slot (each head's stores masked to its kind)."""
    pdl_start(PDL)
    bm = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # head index within [q; k; v]
    b = bm // M
    m = bm % M
    half = D // 2
    dims = tl.arange(0, BLOCK_D)
    d_in = dims < D
    live = (j < NH + 2 * NK)[:, None] & d_in[None, :]
    rows = qkv_ptr + b * s_b + m * s_m + j[:, None] * s_h
    x = tl.load(rows + dims[None, :], mask=live, other=0.0)
    swapped = tl.load(rows + tl.where(dims < half, dims + half, dims - half)[None, :], mask=live, other=0.0)
    c = tl.load(cos_ptr + b * c_b + m * c_m + dims, mask=d_in, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + b * n_b + m * n_m + dims, mask=d_in, other=0.0).to(tl.float32)[None, :]
    if not SIGNED:  # a plain sin table: negate its first half (exact)
        s = tl.where((dims < half)[None, :], -s, s)
    scaled = (x.to(tl.float32) * c).to(x.dtype)  # x * cos, rounded as torch does
    y = (scaled.to(tl.float32) + swapped.to(tl.float32) * s).to(x.dtype)  # addcmul: one rounding
    slot = tl.load(slot_ptr + b * slot_b + m)
    is_q = (j < NH)[:, None] & live
    is_k = ((j >= NH) & (j < NH + NK))[:, None] & live
    is_v = (j >= NH + NK)[:, None] & live
    tl.store(q_ptr + b * q_b + j[:, None] * q_h + m * q_m + dims[None, :], y, mask=is_q)
    tl.store(k_ptr + b * k_b + (j - NH)[:, None] * k_h + slot * k_s + dims[None, :], y.to(k_ptr.dtype.element_ty),
             mask=is_k)
    tl.store(v_ptr + b * v_b + (j - NH - NK)[:, None] * v_h + slot * v_s + dims[None, :],
             x.to(v_ptr.dtype.element_ty), mask=is_v)


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor, slots: torch.Tensor, num_heads: int, *, signed: bool = True) -> torch.Tensor:
    """RoPE on the q and k heads of a fused projection, k and v written to their cache slots, q returned: one launch
    on CUDA (:func:`rope_store_ref` elsewhere).

    RoPE in HF's half-split convention: ``x cos + rotate_half(x) sin`` computed as ``x cos + [x_2, x_1] sin_signed``
    (``sin_signed``: the first half of ``sin`` negated), rounded as the reference rounds.

    Args:
        qkv: Shape ``[B, M, nh + 2 nk, d]`` (unit stride along ``d``).
        cos: Shape ``[B, M, 1, d]``, ``[B, M, d]`` or ``[B, 1, M, d]`` (contiguous).
        sin_signed: like ``cos`` (``signed=False``: the plain ``sin``).
        keys: Shape ``[B, nk, S, d]`` (unit stride along ``d``), written at ``slots``.
        values: Shape ``[B, nk, S, d]``, written at ``slots``.
        slots: Shape ``[M]`` int64 (every slot below ``S``; no two equal), or ``[B, M]``, per row (two equal
            slots of a row keep either token's entry: a trash slot).
        num_heads: ``nh``, the query heads.
        signed: whether ``sin_signed`` has its first half negated (``False``: negated here, exactly).

    Returns:
        q after RoPE, Shape ``[B, nh, M, d]`` (on CUDA a new contiguous tensor; the reference returns a view).

    Raises:
        ValueError: shapes that do not fit together.
    """
    B, M, heads, d = qkv.shape
    nh = num_heads
    nk = (heads - nh) // 2
    if nk < 1 or nh + 2 * nk != heads:
        raise ValueError(f"rope_store: qkv's {heads} heads must be nh + 2 * nk with nh = {nh} query heads")
    if keys.shape != values.shape or tuple(keys.shape[:2]) != (B, nk) or keys.shape[3] != d:
        raise ValueError(f"rope_store: keys/values must have shape [B, nk, S, d] = [{B}, {nk}, S, {d}], got "
                         f"{tuple(keys.shape)} / {tuple(values.shape)}")
    if tuple(slots.shape) not in ((M,), (B, M)):
        raise ValueError(f"rope_store: slots must have shape [M] = [{M}] or [B, M] = [{B}, {M}], got "
                         f"{tuple(slots.shape)}")
    if cos.numel() != B * M * d or sin_signed.numel() != B * M * d:
        raise ValueError(f"rope_store: cos/sin_signed must hold [B, M, d] = [{B}, {M}, {d}] values")
    if not use_kernel("rope_store", qkv, cos, sin_signed, keys, values, slots):
        return rope_store_ref(qkv, cos, sin_signed, keys, values, slots, nh, signed=signed)
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    cos, sin_signed = cos.reshape(B, M, d), sin_signed.reshape(B, M, d)
    if cos.stride(-1) != 1 or sin_signed.stride(-1) != 1:
        cos, sin_signed = cos.contiguous(), sin_signed.contiguous()
    if keys.stride(-1) != 1 or values.stride(-1) != 1:
        raise ValueError("rope_store: the cache tensors need unit stride along d")
    if slots.stride(-1) != 1:
        slots = slots.contiguous()
    q = torch.empty(B, nh, M, d, dtype=qkv.dtype, device=qkv.device)
    if B * M:
        block_d = next_pow2(d)
        block_h = max(1, min(next_pow2(heads), 2048 // block_d))  # ~2k elements per program (16 heads of 128)
        _rope_store_kernel[(B * M, -(-heads // block_h))](
            qkv, cos, sin_signed, keys, values, slots, q, M, nh, nk, d,
            qkv.stride(0), qkv.stride(1), qkv.stride(2), cos.stride(0), cos.stride(1), sin_signed.stride(0),
            sin_signed.stride(1), keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0),
            values.stride(1), values.stride(2), q.stride(0), q.stride(1), q.stride(2),
            slots.stride(0) if slots.dim() == 2 else 0, BLOCK_H=block_h, BLOCK_D=block_d, SIGNED=signed, **pdl_launch(),
        )
    return q


# ------------------------------------------------------------------------------------------------- SiLU-mul

def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """Reference for :func:`silu_mul`: ``F.silu(gate) * up`` with ``gate, up = gate_up.chunk(2, -1)``.

    Args:
        gate_up: Shape ``[..., 2 I]``.

    Returns:
        Shape ``[..., I]``.
    """
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@jit
def _silu_mul_kernel(gu_ptr, out_ptr, s_ptr, inter, s_in, s_out, BLOCK: tl.constexpr, FP8: tl.constexpr,
                     PDL: tl.constexpr = False):
    """Program ``(row, block of columns)``: ``silu(gate) * up``, rounded to the dtype; ``FP8`` (one block holds
    the row): the row rounded to float8, codes at ``out``, scale at ``s``."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < inter
    gate = tl.load(gu_ptr + row * s_in + cols, mask=inside, other=0.0)
    up = tl.load(gu_ptr + row * s_in + inter + cols, mask=inside, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # F.silu, rounded to the dtype
    val = (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
    if FP8:
        store_fp8_row(val.to(tl.float32), cols, inside, out_ptr + row * s_out, s_ptr + row)
    else:
        tl.store(out_ptr + row * s_out + cols, val, mask=inside)


def silu_mul(gate_up: torch.Tensor, *, fp8_out: bool = False) -> torch.Tensor | Fp8Rows:
    """SwiGLU's activation on a fused ``[gate; up]`` projection: ``F.silu(gate) * up`` in one launch on CUDA
    (:func:`silu_mul_ref` elsewhere).

    Args:
        gate_up: Shape ``[..., 2 I]`` (gate first).
        fp8_out: return the result rounded to float8 (:class:`~specdec.kernels.fp8.Fp8Rows`, the codes of
            ``quantize_fp8_rows(silu_mul(gate_up))``) for a float8 ``down_proj``: one program per row then
            (``I`` up to 16,384; wider rows take a second launch).

    Returns:
        Shape ``[..., I]`` in ``gate_up``'s dtype (an ``Fp8Rows`` of that shape with ``fp8_out``).
    """
    if gate_up.shape[-1] % 2:
        raise ValueError(f"silu_mul: the last dim must be 2 I (gate then up), got {gate_up.shape[-1]}")
    inter = gate_up.shape[-1] // 2
    kernel = use_kernel("silu_mul", gate_up)
    if not kernel or (fp8_out and next_pow2(inter) > ROW_FP8_MAX):  # a row too wide: the rounding's own launch
        out = silu_mul(gate_up) if kernel else silu_mul_ref(gate_up)
        return Fp8Rows.of(out) if fp8_out else out
    gu = as_rows(gate_up)
    out = torch.empty(gu.shape[0], inter, dtype=FP8_DTYPE if fp8_out else gate_up.dtype, device=gate_up.device)
    scale = torch.empty(gu.shape[0], dtype=torch.float32, device=gate_up.device) if fp8_out else out
    block = next_pow2(inter) if fp8_out else min(1024, next_pow2(inter))
    if gu.shape[0]:
        _silu_mul_kernel[(gu.shape[0], -(-inter // block))](gu, out, scale, inter, gu.stride(0), out.stride(0),
                                                           BLOCK=block, FP8=fp8_out,
                                                           num_warps=8 if block > 4096 else 4, **pdl_launch())
    lead = tuple(gate_up.shape[:-1])
    return Fp8Rows(out.view(*lead, inter), scale.view(lead), gate_up.dtype) if fp8_out else out.view(*lead, inter)


# ---------------------------------------------------------------------------------------------- embed + concat

def embed_concat_ref(ids: torch.Tensor, table: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Reference for :func:`embed_concat`: ``cat([F.embedding(ids, table).to(hidden.dtype), hidden], -1)``.

    Args:
        ids: Shape ``[...]`` int64, rows of ``table``.
        table: Shape ``[V, E]``.
        hidden: Shape ``[..., H]``.

    Returns:
        Shape ``[..., E + H]`` in ``hidden``'s dtype.
    """
    return torch.cat([F.embedding(ids, table).to(hidden.dtype), hidden], dim=-1)


@jit
def _embed_concat_kernel(id_ptr, table_ptr, hid_ptr, out_ptr, s_ptr, E, H, s_table, s_hid, s_out,
                         BLOCK: tl.constexpr, FP8: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (row, block of output columns): columns below ``E`` from the token's embedding row, the
    rest from the row of ``hidden``; ``FP8`` (one block holds the row): the row rounded to float8, codes at
    ``out``, scale at ``s``."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    token = tl.load(id_ptr + row)
    emb = tl.load(table_ptr + token * s_table + cols, mask=cols < E, other=0.0)
    hid = tl.load(hid_ptr + row * s_hid + (cols - E), mask=(cols >= E) & (cols < E + H), other=0.0)
    if FP8:
        val = tl.where(cols < E, emb.to(hid_ptr.dtype.element_ty), hid).to(tl.float32)
        store_fp8_row(val, cols, cols < E + H, out_ptr + row * s_out, s_ptr + row)
    else:
        val = tl.where(cols < E, emb.to(out_ptr.dtype.element_ty), hid.to(out_ptr.dtype.element_ty))
        tl.store(out_ptr + row * s_out + cols, val, mask=cols < E + H)


def embed_concat(ids: torch.Tensor, table: torch.Tensor, hidden: torch.Tensor, *,
                 fp8_out: bool = False) -> torch.Tensor | Fp8Rows:
    """A draft head's input: each token's embedding followed by its conditioning hidden state, in one launch on
    CUDA (:func:`embed_concat_ref` elsewhere). EAGLE-1's ``fc`` reads it (``fc(cat(e(x), f))``).

    Args:
        ids: Shape ``[...]`` int64, rows of ``table`` (``0 <= id < V``: not checked on the device).
        table: Shape ``[V, E]``, the embedding matrix (unit last stride).
        hidden: Shape ``[..., H]`` (same leading shape as ``ids``).
        fp8_out: return the rows rounded to float8 (:class:`~specdec.kernels.fp8.Fp8Rows`, the codes of
            ``quantize_fp8_rows(embed_concat(...))``) for a float8 ``fc``: one program per row then (``E + H`` up
            to 16,384; wider rows take a second launch).

    Returns:
        Shape ``[..., E + H]`` in ``hidden``'s dtype (no gradient: inference only); an ``Fp8Rows`` of that shape
        with ``fp8_out``.
    """
    if tuple(hidden.shape[:-1]) != tuple(ids.shape) or table.dim() != 2:
        raise ValueError(f"embed_concat: need ids [...], table [V, E] and hidden [..., H] with the ids' leading "
                         f"shape, got {tuple(ids.shape)}, {tuple(table.shape)} and {tuple(hidden.shape)}")
    E, H = table.shape[1], hidden.shape[-1]
    kernel = table.stride(-1) == 1 and use_kernel("embed_concat", ids, table, hidden)
    if not kernel or (fp8_out and next_pow2(E + H) > ROW_FP8_MAX):  # a row too wide: the rounding's own launch
        out = embed_concat(ids, table, hidden) if kernel else embed_concat_ref(ids, table, hidden)
        return Fp8Rows.of(out) if fp8_out else out
    flat_ids = ids.reshape(-1)
    hid = as_rows(hidden)
    out = torch.empty(hid.shape[0], E + H, dtype=FP8_DTYPE if fp8_out else hidden.dtype, device=hidden.device)
    scale = torch.empty(hid.shape[0], dtype=torch.float32, device=hidden.device) if fp8_out else out
    block = next_pow2(E + H) if fp8_out else min(1024, next_pow2(E + H))
    if hid.shape[0]:
        _embed_concat_kernel[(hid.shape[0], -(-(E + H) // block))](flat_ids, table, hid, out, scale, E, H,
                                                                  table.stride(0), hid.stride(0), out.stride(0),
                                                                  BLOCK=block, FP8=fp8_out,
                                                                  num_warps=8 if block > 4096 else 4, **pdl_launch())
    if fp8_out:
        return Fp8Rows(out.view(*ids.shape, E + H), scale.view(ids.shape), hidden.dtype)
    return out.view(*ids.shape, E + H)


def table_rows_ref(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Reference for :func:`table_rows` (same arguments and result): a clamp and a gather."""
    _check_table_rows(table, index)
    return table[index.clamp(0, table.shape[0] - 1)]


def _check_table_rows(table: torch.Tensor, index: torch.Tensor) -> None:
    if table.dim() < 1 or index.dtype.is_floating_point or index.dtype == torch.bool or table.device != index.device:
        raise ValueError(f"table_rows: a table [N, ...] and an integer index on its device, got table "
                         f"{tuple(table.shape)} on {table.device}, index {index.dtype} on {index.device}")


@jit
def _clamped_row(table_ptr, index_ptr, r, N, row_stride, out_ptr, W, BLOCK: tl.constexpr):
    """``out[r] = table[clamp(index[r], 0, N - 1)]``: one row of ``W`` contiguous elements, ``BLOCK`` at a time."""
    row = tl.minimum(tl.maximum(tl.load(index_ptr + r), 0), N - 1).to(tl.int64)
    for base in range(0, W, BLOCK):
        cols = base + tl.arange(0, BLOCK)
        tl.store(out_ptr + r.to(tl.int64) * W + cols, tl.load(table_ptr + row * row_stride + cols, mask=cols < W),
                 mask=cols < W)


@jit
def _table_rows_kernel(table_ptr, index_ptr, out_ptr, N, W, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Program ``r``: ``out[r] = table[clamp(index[r], 0, N - 1)]`` (rows of ``W`` contiguous elements)."""
    pdl_start(PDL)
    _clamped_row(table_ptr, index_ptr, tl.program_id(0), N, W, out_ptr, W, BLOCK)


def table_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows of ``table`` at ``index`` clamped into ``[0, N)``: ``table[index.clamp(0, N - 1)]`` in one launch on CUDA
    (the reference's clamp and gather are two). The EAGLE drafter reads its RoPE rows so (a padded entry's stale
    position never indexes past the table).

    Args:
        table: Shape ``[N, ...]``.
        index: Shape any, integer.

    Returns:
        Shape ``[*index.shape, *table.shape[1:]]``, ``table``'s dtype.

    Example:
        >>> table_rows(torch.arange(6.0).view(3, 2), torch.tensor([[2, -1], [7, 1]])).tolist()
        [[[4.0, 5.0], [0.0, 1.0]], [[4.0, 5.0], [2.0, 3.0]]]
    """
    if not use_kernel("table_rows", table, index):
        return table_rows_ref(table, index)
    _check_table_rows(table, index)
    rows = table.reshape(table.shape[0], -1)
    rows = rows if rows.is_contiguous() else rows.contiguous()
    flat = index.reshape(-1)
    out = torch.empty(flat.numel(), rows.shape[1], dtype=table.dtype, device=table.device)
    if flat.numel() and rows.shape[1] and table.shape[0]:
        _table_rows_kernel[(flat.numel(),)](rows, flat, out, table.shape[0], rows.shape[1],
                                            BLOCK=min(1024, next_pow2(rows.shape[1])), num_warps=1, **pdl_launch())
    return out.view(*index.shape, *table.shape[1:])


def last_rows_ref(x: torch.Tensor, last: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Reference for :func:`last_rows` (same arguments and result): a clamp, a gather, a compare and a ``where``."""
    _check_last_rows(x, last, fallback)
    B, _, H = x.shape
    picked = x.gather(1, last.clamp(min=0)[:, None, None].expand(B, 1, H))[:, 0]
    return torch.where((last >= 0)[:, None], picked, fallback.to(picked.dtype))


def _check_last_rows(x, last, fallback) -> None:
    if x.dim() != 3 or tuple(last.shape) != (x.shape[0],) or tuple(fallback.shape) != (x.shape[0], x.shape[2]) \
            or last.dtype.is_floating_point:
        raise ValueError(f"last_rows: x [B, M, H], last [B] integer and fallback [B, H]; got x {tuple(x.shape)}, "
                         f"last {tuple(last.shape)} {last.dtype}, fallback {tuple(fallback.shape)}")


@jit
def _last_rows_kernel(x_ptr, last_ptr, fb_ptr, out_ptr, M, H, sxb, sxm, sfb, BLOCK: tl.constexpr,
                      PDL: tl.constexpr = False):
    """Program ``b``: ``out[b] = x[b, last[b]]`` if ``last[b] >= 0``, else ``fallback[b]`` (already in ``x``'s
    dtype)."""
    pdl_start(PDL)
    b = tl.program_id(0)
    last = tl.load(last_ptr + b)
    row = tl.minimum(tl.maximum(last, 0), M - 1).to(tl.int64)
    for base in range(0, H, BLOCK):
        cols = base + tl.arange(0, BLOCK)
        inside = cols < H
        take = (cols * 0 + last) >= 0  # the row's choice, as a block
        picked = tl.load(x_ptr + b.to(tl.int64) * sxb + row * sxm + cols, mask=inside & take)
        kept = tl.load(fb_ptr + b.to(tl.int64) * sfb + cols, mask=inside & ~take)
        tl.store(out_ptr + b.to(tl.int64) * H + cols, tl.where(take, picked, kept), mask=inside)


def last_rows(x: torch.Tensor, last: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Each row's entry ``last[b]`` of ``x``, or ``fallback[b]`` where ``last[b] < 0``, in one launch on CUDA (the
    reference's clamp, gather, compare and ``where`` are four). The EAGLE drafter's update keeps so the head output
    of each row's last real entry (a row with none keeps its previous one).

    Args:
        x: Shape ``[B, M, H]``.
        last: Shape ``[B]`` integer, ``-1``: none (``< M``).
        fallback: Shape ``[B, H]`` (cast to ``x``'s dtype).

    Returns:
        Shape ``[B, H]``, ``x``'s dtype.

    Example:
        >>> last_rows(torch.arange(8.0).view(2, 2, 2), torch.tensor([1, -1]), torch.full((2, 2), -5.0)).tolist()
        [[2.0, 3.0], [-5.0, -5.0]]
    """
    if not use_kernel("last_rows", x, last, fallback):
        return last_rows_ref(x, last, fallback)
    _check_last_rows(x, last, fallback)
    B, M, H = x.shape
    x = x if x.stride(2) == 1 else x.contiguous()
    fallback = fallback.to(x.dtype)  # torch's rounding (a launch only where the dtypes differ)
    fallback = fallback if fallback.stride(1) == 1 else fallback.contiguous()
    out = torch.empty(B, H, dtype=x.dtype, device=x.device)
    if B and H and M:
        _last_rows_kernel[(B,)](x, last, fallback, out, M, H, x.stride(0), x.stride(1), fallback.stride(0),
                                BLOCK=min(1024, next_pow2(H)), num_warps=4, **pdl_launch())
    elif B and H:
        out.copy_(fallback)
    return out


# ---------------------------------------------------------------------------------------------- decoder inputs

def decoder_inputs_ref(tokens: torch.Tensor, positions: torch.Tensor, embed: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor, slots: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Reference for :func:`decoder_inputs` (same arguments and result): three clamps and gathers, a max and an add.
    """
    _check_decoder_inputs(tokens, positions, embed, cos, sin, slots)
    h = embed[tokens.clamp(0, embed.shape[0] - 1)]
    index = positions.clamp(0, cos.shape[0] - 1)
    kv_end = None if slots is None else slots.amax(0, keepdim=True) + 1
    return h, cos[index], sin[index], kv_end


def _check_decoder_inputs(tokens, positions, embed, cos, sin, slots) -> None:
    integer = (torch.int32, torch.int64)
    if (tokens.dtype not in integer or positions.dtype not in integer or tokens.shape != positions.shape
            or embed.dim() != 2 or cos.dim() != 2 or cos.shape != sin.shape
            or (slots is not None and (slots.dim() != 1 or slots.dtype not in integer or not slots.numel()))):
        raise ValueError(
            f"decoder_inputs: tokens and positions [B, M] integer, embed [V, H], cos and sin [P, d] alike, slots [S] "
            f"integer (or None); got tokens {tuple(tokens.shape)} {tokens.dtype}, positions {tuple(positions.shape)} "
            f"{positions.dtype}, embed {tuple(embed.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}, slots "
            f"{None if slots is None else (tuple(slots.shape), slots.dtype)}")


@jit
def _decoder_inputs_kernel(tok_ptr, pos_ptr, emb_ptr, cos_ptr, sin_ptr, slot_ptr, h_ptr, c_ptr, s_ptr, end_ptr,
                           V, P, H, D, S, s_emb, s_cos, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_S: tl.constexpr, HAS_SLOTS: tl.constexpr, PDL: tl.constexpr = False):
    """Program ``r`` (a token): its embedding row and its RoPE rows (ids and positions clamped into the tables);
    program 0 also ``max(slots) + 1``."""
    pdl_start(PDL)
    r = tl.program_id(0)
    _clamped_row(emb_ptr, tok_ptr, r, V, s_emb, h_ptr, H, BLOCK_H)
    _clamped_row(cos_ptr, pos_ptr, r, P, s_cos, c_ptr, D, BLOCK_D)
    _clamped_row(sin_ptr, pos_ptr, r, P, s_cos, s_ptr, D, BLOCK_D)
    if HAS_SLOTS:
        if r == 0:
            k = tl.arange(0, BLOCK_S)
            first = tl.load(slot_ptr)
            tl.store(end_ptr, tl.max(tl.load(slot_ptr + k, mask=k < S, other=first), 0) + 1)


def decoder_inputs(tokens: torch.Tensor, positions: torch.Tensor, embed: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, slots: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A decoder forward's inputs in one launch on CUDA: the token embeddings, the RoPE rows at the positions, and
    the end of the written slots (the fused decoder's verify forward: six torch launches with the ids' clamp).

    Ids and positions are clamped into their tables (an id past the vocabulary reads the last row; the fast path
    flags such drafts and never commits them).

    Args:
        tokens: Shape ``[B, M]`` integer.
        positions: Shape ``[B, M]`` integer.
        embed: Shape ``[V, H]``, the embedding table (its rows contiguous).
        cos, sin: Shape ``[P, d]`` each, the RoPE tables (alike strides).
        slots: Shape ``[S]`` integer, the forward's write slots, or ``None``.

    Returns:
        ``(h [B, M, H], cos [B, M, d], sin [B, M, d], kv_end)``: ``kv_end = slots.max() + 1`` as Shape ``[1]`` (the
        key bound of :func:`~specdec.kernels.tree_attention`), ``None`` without ``slots``.

    Example:
        >>> table = torch.arange(6.0).view(3, 2)
        >>> h, c, s, end = decoder_inputs(torch.tensor([[2, 9]]), torch.tensor([[0, 1]]), table, table, -table,
        ...                               torch.tensor([4, 5]))
        >>> h.tolist(), c.tolist(), end.tolist()
        ([[[4.0, 5.0], [4.0, 5.0]]], [[[0.0, 1.0], [2.0, 3.0]]], [6])
    """
    if not use_kernel("decoder_inputs", embed, tokens, positions, cos, sin):
        return decoder_inputs_ref(tokens, positions, embed, cos, sin, slots)
    _check_decoder_inputs(tokens, positions, embed, cos, sin, slots)
    if embed.stride(1) != 1:
        embed = embed.contiguous()
    if cos.stride(1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    B, M = tokens.shape
    (V, H), (P, D) = embed.shape, cos.shape
    tokens, positions = tokens.contiguous(), positions.contiguous()
    h = torch.empty(B, M, H, dtype=embed.dtype, device=embed.device)
    c = torch.empty(B, M, D, dtype=cos.dtype, device=cos.device)
    s = torch.empty(B, M, D, dtype=sin.dtype, device=sin.device)
    end = None if slots is None else torch.empty(1, dtype=slots.dtype, device=slots.device)
    if B * M:
        S = 0 if slots is None else slots.shape[0]
        slot_arg = tokens if slots is None else slots.contiguous()
        _decoder_inputs_kernel[(B * M,)](tokens, positions, embed, cos, sin, slot_arg, h, c, s,
                                         tokens if end is None else end, V, P, H, D, max(S, 1), embed.stride(0),
                                         cos.stride(0), BLOCK_H=min(1024, next_pow2(H)), BLOCK_D=next_pow2(D),
                                         BLOCK_S=next_pow2(max(S, 1)), HAS_SLOTS=slots is not None, num_warps=4,
                                         **pdl_launch())
    elif end is not None:
        end.copy_(slots.amax(0, keepdim=True) + 1)
    return h, c, s, end
