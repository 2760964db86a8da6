"""Tree-attention mask fill: the additive 4-D mask of one tree forward (and the nodes' positions) in one launch.

What :meth:`specdec.adapter.ModelAdapter.forward` builds today, in about a dozen kernels (pointer doubling for the
ancestor matrix, concatenation, padding, conversion)::

    anc     = ancestor_matrix(parents)[:, -M:]                       # [B, M, P + M]
    visible = cat([committed_valid[:, None] & present[:, :, None], anc], -1)
    mask    = to_aligned_additive_mask(visible[:, None], dtype)      # [B, 1, M, Lc + P + M]

:func:`tree_mask` writes that final tensor directly: one program per (row, query node) walks up the node's
parents once and writes its mask row (committed prefix, pending forest, alignment padding), and optionally the
node's position ``lengths + depth``. Same storage layout (rows padded to ``alignment`` elements, a view of width
``Lc + P + M``), same values (``0`` visible, ``torch.finfo(dtype).min`` hidden), bit for bit.

The same family serves the draft heads: :func:`head_tree_mask` writes the mask of one tree level over a head's
fixed-capacity, slot-addressed cache (committed slots below each row's length, the tree policy's ancestor sets over
the scratch slots, nothing else), which the EAGLE drafter builds inside CUDA graphs.

References:
    - SpecInfer: Miao et al., arXiv 2305.09781 (topology-aware causal mask); EAGLE: Li et al., arXiv 2401.15077.
    - SGLang ``build_tree_kernel_efficient`` (FULL_MASK: prefix columns, then ancestors found by walking up).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..masks import to_aligned_additive_mask
from ..trees import ancestor_matrix
from ._dispatch import use_kernel
from ._triton import jit, next_pow2, pdl_launch, pdl_start, tl

__all__ = ["TreeMask", "tree_mask", "tree_mask_ref", "tree_mask_at", "tree_mask_at_ref", "head_tree_mask",
           "head_tree_mask_ref", "HeadUpdate", "head_update_mask", "head_update_mask_ref"]


class TreeMask(NamedTuple):
    """A tree forward's attention mask and, when asked for, its position ids.

    Attributes:
        mask: Shape ``[B, 1, M, Lc + P + M]`` in the requested floating dtype: ``0`` where attended,
            ``finfo(dtype).min`` elsewhere; ``stride(-2)`` a multiple of the alignment (unless ``out`` said
            otherwise).
        positions: Shape ``[B, M]`` int64, ``lengths + depth`` (depth within the pending forest: 0 for a node on
            the committed prefix and for absent nodes), or ``None`` when ``lengths`` was not given.
    """

    mask: torch.Tensor
    positions: torch.Tensor | None


# --------------------------------------------------------------------------------------------------------
# Checks shared by the kernel and the reference
# --------------------------------------------------------------------------------------------------------


def _check(committed_valid, parents, present, dtype, lengths, out, alignment) -> tuple[int, int, int, int]:
    if (not isinstance(committed_valid, torch.Tensor) or committed_valid.dim() != 2
            or committed_valid.dtype != torch.bool):
        raise ValueError("tree_mask: committed_valid must be a bool tensor of shape [B, Lc] "
                         "(CacheState.committed_valid)")
    batch, prefix = committed_valid.shape
    if not isinstance(parents, torch.Tensor) or parents.dim() != 2 or parents.shape[0] != batch:
        raise ValueError(
            f"tree_mask: parents must have shape [B, P + M] = [{batch}, ...] (the pending forest: earlier pending "
            f"slots, then the new nodes), got {tuple(getattr(parents, 'shape', ()))}"
        )
    if parents.dtype.is_floating_point or parents.dtype == torch.bool:
        raise ValueError(f"tree_mask: parents must hold int64 node indices, got {parents.dtype}")
    if not isinstance(present, torch.Tensor) or present.dim() != 2 or present.dtype != torch.bool:
        raise ValueError("tree_mask: present must be a bool tensor of shape [B, M] (which new nodes are real)")
    width, nodes = parents.shape[1], present.shape[1]
    if present.shape[0] != batch or nodes > width:
        raise ValueError(
            f"tree_mask: present has shape {tuple(present.shape)} but parents {tuple(parents.shape)}: present covers "
            f"the M new nodes, the last M columns of parents, so it needs [B, M] with M <= P + M"
        )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"tree_mask: dtype must be a floating dtype (the model's, for the additive mask), "
                         f"got {dtype!r}")
    if not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"tree_mask: alignment must be an int >= 1 (8 suits SDPA), got {alignment!r}")
    devices = {committed_valid.device, parents.device, present.device}
    if lengths is not None:
        if not isinstance(lengths, torch.Tensor) or tuple(lengths.shape) != (batch,):
            raise ValueError(f"tree_mask: lengths must have shape [B] = [{batch}] (CacheState.lengths)")
        devices.add(lengths.device)
    if out is not None:
        shape = (batch, 1, nodes, prefix + width)
        if tuple(out.shape) != shape or out.dtype != dtype or out.stride(-1) != 1:
            raise ValueError(
                f"tree_mask: out must be a {dtype} tensor of shape {shape} with unit last stride (e.g. "
                f"buffer[:B, :, :M, :Lc + P + M] of a preallocated buffer), got {out.dtype} {tuple(out.shape)} "
                f"strides {out.stride()}"
            )
        devices.add(out.device)
    if len(devices) > 1:
        raise ValueError(f"tree_mask: all tensors must be on one device, got {sorted(map(str, devices))}")
    return batch, prefix, width, nodes


# --------------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------------


def tree_mask_ref(
    committed_valid: torch.Tensor,
    parents: torch.Tensor,
    present: torch.Tensor,
    dtype: torch.dtype,
    *,
    lengths: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    alignment: int = 8,
) -> TreeMask:
    """Reference for :func:`tree_mask` (same signature and result): the adapter's torch code, verbatim.

    Args:
        committed_valid: Shape ``[B, Lc]`` bool, which committed cache slots hold real tokens.
        parents: Shape ``[B, P + M]`` int64, parent of every pending slot (``P`` earlier ones, then the ``M`` new
            nodes) as a pending index; ``-1`` for a slot on the committed prefix or an absent one.
        present: Shape ``[B, M]`` bool, which new nodes are real.
        dtype: floating dtype of the mask (the model's).
        lengths: Shape ``[B]`` int64, committed tokens per row; when given, positions are returned too.
        out: Shape ``[B, 1, M, Lc + P + M]``, optional destination (unit last stride).
        alignment: row stride multiple of a newly allocated mask.

    Returns:
        :class:`TreeMask`.
    """
    batch, _, _, nodes = _check(committed_valid, parents, present, dtype, lengths, out, alignment)
    anc = ancestor_matrix(parents)[:, parents.shape[1] - nodes:]
    prefix = committed_valid[:, None, :] & present[:, :, None]
    visible = torch.cat([prefix.expand(batch, nodes, -1), anc], 2)
    mask = to_aligned_additive_mask(visible[:, None], dtype, alignment)
    if out is not None:
        mask = out.copy_(mask)
    positions = None if lengths is None else lengths.long()[:, None] + anc.sum(-1) - 1
    return TreeMask(mask, positions)


# --------------------------------------------------------------------------------------------------------
# Kernel and launcher
# --------------------------------------------------------------------------------------------------------


@jit
def _tree_mask_kernel(
    valid_ptr, parents_ptr, present_ptr, lengths_ptr, out_ptr, positions_ptr, fill_ptr,
    prefix_len, num_pending, write_width,
    stride_vb, stride_vl, stride_pb, stride_pn, stride_rb, stride_rm, stride_ob, stride_oq,
    HAS_POSITIONS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    query = tl.program_id(0)  # new node q = pending slot num_pending + q
    row = tl.program_id(1)
    zero = tl.load(fill_ptr)
    hidden = tl.load(fill_ptr + 1)
    present = tl.load(present_ptr + row * stride_rb + query * stride_rm) != 0
    out_row = out_ptr + row * stride_ob + query * stride_oq

    # Committed prefix: visible iff the slot is valid and the node is real.
    for start in range(0, prefix_len, BLOCK_L):
        cols = start + tl.arange(0, BLOCK_L)
        inside = cols < prefix_len
        valid = tl.load(valid_ptr + row * stride_vb + cols * stride_vl, mask=inside, other=0) != 0
        tl.store(out_row + cols, tl.where(valid & present, zero, hidden), mask=inside)

    # Pending forest: walk up from the node, marking itself and each ancestor. Parents precede children, so the
    # walk stops at -1 (and, on malformed input, at a parent that does not precede its child).
    node = (num_pending + query).to(tl.int64)
    cols = tl.arange(0, BLOCK_T)
    seen = cols == node
    depth = query * 0
    current = node
    parent = tl.load(parents_ptr + row * stride_pb + current * stride_pn)
    while (parent >= 0) & (parent < current):
        seen = seen | (cols == parent)
        depth += 1
        current = parent
        parent = tl.load(parents_ptr + row * stride_pb + current * stride_pn)
    tl.store(out_row + prefix_len + cols, tl.where(seen, zero, hidden), mask=cols < write_width - prefix_len)

    if HAS_POSITIONS:
        tl.store(positions_ptr + row * tl.num_programs(0) + query, tl.load(lengths_ptr + row) + depth)


_FILL_CACHE: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _fill_values(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # [visible, hidden] in the mask's dtype, made once per (dtype, device): no host-to-device copy per call.
    key = (dtype, device)
    if key not in _FILL_CACHE:
        values = torch.zeros(2, dtype=dtype, device=device)
        values[1] = torch.finfo(dtype).min
        _FILL_CACHE[key] = values
    return _FILL_CACHE[key]


def _tree_mask_triton(committed_valid, parents, present, dtype, lengths, out, alignment) -> TreeMask:
    batch, prefix, width, nodes = _check(committed_valid, parents, present, dtype, lengths, out, alignment)
    device = committed_valid.device
    keys = prefix + width
    if out is None:
        padded = -(-keys // alignment) * alignment
        storage = torch.empty(batch, 1, nodes, padded, dtype=dtype, device=device)
        mask, write_width, tree_block = storage[..., :keys], padded, next_pow2(width + alignment - 1)
    else:
        mask, write_width, tree_block = out, keys, next_pow2(width)
    positions = torch.empty(batch, nodes, dtype=torch.long, device=device) if lengths is not None else None
    if batch and nodes:
        parents = parents.long()
        valid = committed_valid.view(torch.uint8) if prefix else present.view(torch.uint8)  # never read if Lc = 0
        _tree_mask_kernel[(nodes, batch)](
            valid, parents, present.view(torch.uint8),
            lengths.long() if lengths is not None else parents, mask,
            positions if positions is not None else parents, _fill_values(dtype, device),
            prefix, width - nodes, write_width,
            valid.stride(0), valid.stride(1), parents.stride(0), parents.stride(1),
            present.stride(0), present.stride(1), mask.stride(0), mask.stride(2),
            HAS_POSITIONS=positions is not None, BLOCK_L=512, BLOCK_T=tree_block, **pdl_launch(),
        )
    return TreeMask(mask, positions)


# --------------------------------------------------------------------------------------------------------
# Public op
# --------------------------------------------------------------------------------------------------------


def tree_mask(
    committed_valid: torch.Tensor,
    parents: torch.Tensor,
    present: torch.Tensor,
    dtype: torch.dtype,
    *,
    lengths: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    alignment: int = 8,
) -> TreeMask:
    """The additive attention mask of a tree forward over a ragged cache (and the nodes' positions), in one launch.

    Query ``q`` is new node ``P + q`` of the pending forest. Key ``k < Lc`` is committed slot ``k``; key ``Lc + j``
    is pending slot ``j``::

        visible[b, q, k]      = committed_valid[b, k] & present[b, q]            (k < Lc)
        visible[b, q, Lc + j] = j == P + q  or  j is an ancestor of P + q          (parents walked up to -1)
        mask = where(visible, 0, finfo(dtype).min),  rows padded to `alignment` elements
        positions[b, q] = lengths[b] + depth(P + q)                                (depth within the pending forest)

    An absent node (parent ``-1``, not present) sees only itself, so no row is empty. Equal, bit for bit, to
    ``to_aligned_additive_mask(cat([committed_valid & present, ancestor_matrix(parents)[:, -M:]])[:, None],
    dtype)`` as :meth:`specdec.adapter.ModelAdapter.forward` builds it.

    Dispatch: the Triton kernel when the tensors are on CUDA and triton imports, :func:`tree_mask_ref` otherwise
    (see :func:`specdec.kernels.kernel_mode`).

    Args:
        committed_valid: Shape ``[B, Lc]`` bool, which committed cache slots hold real tokens.
        parents: Shape ``[B, P + M]`` int64, parent of every pending slot (``P`` earlier ones, then the ``M`` new
            nodes) as a pending index; ``-1`` for a slot on the committed prefix or an absent one. Parents
            precede their children.
        present: Shape ``[B, M]`` bool, which new nodes are real.
        dtype: floating dtype of the mask (the model's).
        lengths: Shape ``[B]`` int64, committed tokens per row (``CacheState.lengths``); when given, the nodes'
            positions are returned too.
        out: Shape ``[B, 1, M, Lc + P + M]``, optional destination with unit last stride (a view of a
            preallocated buffer); only its ``Lc + P + M`` columns are written.
        alignment: row stride multiple of a newly allocated mask (8: SDPA's memory-efficient kernel takes it
            without copying).

    Returns:
        :class:`TreeMask` ``(mask [B, 1, M, Lc + P + M], positions [B, M] or None)``.

    Example:
        >>> m = tree_mask(torch.tensor([[False, True]]), torch.tensor([[-1, 0]]), torch.tensor([[True, True]]),
        ...               torch.float32, lengths=torch.tensor([1]))
        >>> (m.mask[0, 0] == 0).int().tolist(), m.positions.tolist()
        ([[0, 1, 1, 0], [0, 1, 1, 1]], [[1, 2]])

    References:
        SpecInfer arXiv 2305.09781; EAGLE arXiv 2401.15077; SGLang ``build_tree_kernel_efficient``.
    """
    tensors = [committed_valid, parents, present] + [t for t in (lengths, out) if t is not None]
    if use_kernel("tree_mask", *tensors):
        return _tree_mask_triton(committed_valid, parents, present, dtype, lengths, out, alignment)
    return tree_mask_ref(committed_valid, parents, present, dtype, lengths=lengths, out=out, alignment=alignment)


# --------------------------------------------------------------------------------------------------------
# The target's verify forward over a static cache, its first write slot on the device (inside a CUDA graph)
# --------------------------------------------------------------------------------------------------------


def _check_at(valid, parents, present, start, out) -> tuple[int, int, int]:
    if not isinstance(valid, torch.Tensor) or valid.dim() != 2 or valid.dtype != torch.bool:
        raise ValueError("tree_mask_at: valid must be a bool tensor of shape [B, C] (the static cache's valid "
                         "slots, StaticCacheState.valid)")
    batch = valid.shape[0]
    if not isinstance(parents, torch.Tensor) or parents.dim() != 2 or parents.shape[0] != batch \
            or parents.dtype != torch.long:
        raise ValueError(f"tree_mask_at: parents must be an int64 tensor of shape [B, M] = [{batch}, M] (each new "
                         f"node's parent among the M new nodes, -1 for none), got {getattr(parents, 'dtype', None)} "
                         f"{tuple(getattr(parents, 'shape', ()))}")
    nodes = parents.shape[1]
    if present is None:  # the root and every node with a parent
        present = parents
    elif not isinstance(present, torch.Tensor) or present.dtype != torch.bool or tuple(present.shape) != (batch, nodes):
        raise ValueError(f"tree_mask_at: present must be a bool tensor of shape [B, M] = [{batch}, {nodes}] (which "
                         f"new nodes are real), got {getattr(present, 'dtype', None)} "
                         f"{tuple(getattr(present, 'shape', ()))}")
    if not isinstance(start, torch.Tensor) or start.numel() != 1 or start.dtype != torch.long:
        raise ValueError("tree_mask_at: start must be a one-element int64 tensor (the first write slot, Lc: e.g. "
                         "slots[:1] of the forward's write slots)")
    if not isinstance(out, torch.Tensor) or out.dim() != 4 or tuple(out.shape[:3]) != (batch, 1, nodes) \
            or not out.dtype.is_floating_point or out.stride(-1) != 1 or out.shape[-1] > valid.shape[1]:
        raise ValueError(f"tree_mask_at: out must be a floating tensor of shape [B, 1, M, W] = [{batch}, 1, {nodes}, "
                         f"W] with unit last stride and W <= C = {valid.shape[1]} (the forward's mask buffer), got "
                         f"{getattr(out, 'dtype', None)} {tuple(getattr(out, 'shape', ()))}")
    devices = {t.device for t in (valid, parents, present, start, out)}
    if len(devices) > 1:
        raise ValueError(f"tree_mask_at: all tensors must be on one device, got {sorted(map(str, devices))}")
    return batch, nodes, out.shape[-1]


def tree_mask_at_ref(valid: torch.Tensor, parents: torch.Tensor, present: torch.Tensor, start: torch.Tensor,
                     out: torch.Tensor) -> torch.Tensor:
    """Reference for :func:`tree_mask_at` (same arguments and result), with torch ops and no host sync."""
    batch, nodes, width = _check_at(valid, parents, present, start, out)
    if present is None:
        present = (parents >= 0) | (torch.arange(nodes, device=parents.device) == 0)
    cols = torch.arange(width, device=out.device)
    first = start.reshape(())
    seen = ((cols < first) & valid[:, :width])[:, None, :] & present[:, :, None]  # [B, M, W]
    if nodes:
        j = cols - first
        inside = (j >= 0) & (j < nodes)
        anc = ancestor_matrix(parents)  # [B, M, M], each node's ancestors and itself
        tree = anc.gather(2, j.clamp(0, nodes - 1).expand(batch, nodes, width)) & inside
        seen = seen | tree
    return out.copy_(torch.where(seen[:, None], 0.0, torch.finfo(out.dtype).min).to(out.dtype))


@jit
def _tree_mask_at_kernel(valid_ptr, parents_ptr, present_ptr, start_ptr, out_ptr, fill_ptr, M, W,
                         stride_vb, stride_pb, stride_rb, stride_ob, stride_oq,
                         ROOTED: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr,
                         PDL: tl.constexpr = False):
    pdl_start(PDL)
    query = tl.program_id(0)
    row = tl.program_id(1)
    zero = tl.load(fill_ptr)
    hidden = tl.load(fill_ptr + 1)
    first = tl.load(start_ptr)
    if ROOTED:  # no present tensor: the root and every node with a parent
        present = (query == 0) | (tl.load(parents_ptr + row * stride_pb + query) >= 0)
    else:
        present = tl.load(present_ptr + row * stride_rb + query) != 0
    out_row = out_ptr + row * stride_ob + query * stride_oq
    # Every column but the new nodes' own: a valid committed slot below `first` if the node is real; else hidden.
    for base in range(0, W, BLOCK_L):
        cols = base + tl.arange(0, BLOCK_L)
        inside = cols < W
        below = cols < first
        valid = tl.load(valid_ptr + row * stride_vb + cols, mask=inside & below, other=0) != 0
        tree = (cols >= first) & (cols < first + M)
        tl.store(out_row + cols, tl.where(valid & below & present, zero, hidden), mask=inside & ~tree)
    # The new nodes' columns: the node itself and its ancestors (walked up to -1; parents precede children).
    cols = tl.arange(0, BLOCK_T)
    seen = cols == query
    current = query.to(tl.int64)
    parent = tl.load(parents_ptr + row * stride_pb + current)
    while (parent >= 0) & (parent < current):
        seen = seen | (cols == parent)
        current = parent
        parent = tl.load(parents_ptr + row * stride_pb + current)
    tl.store(out_row + first + cols, tl.where(seen, zero, hidden), mask=(cols < M) & (first + cols < W))


def tree_mask_at(valid: torch.Tensor, parents: torch.Tensor, present: torch.Tensor, start: torch.Tensor,
                 out: torch.Tensor) -> torch.Tensor:
    """The additive mask of a tree forward over a static cache whose first write slot lives on the device.

    :func:`tree_mask` for the fast path's captured verify step: the ``M`` new nodes (no earlier pending slots)
    are written at slots ``Lc .. Lc + M - 1`` with ``Lc = start`` read on the device, so one CUDA graph serves
    every step (the host builds nothing; the mask is the graph's first kernel). Every column of ``out`` is
    written::

        visible[b, q, k] = valid[b, k] & present[b, q]                       (k < Lc)
                         = j == q  or  j is an ancestor of q,  j = k - Lc     (Lc <= k < Lc + M)
                         = False                                              (k >= Lc + M)
        out = where(visible, 0, finfo(out.dtype).min)

    An absent node (parent ``-1``, not present) sees only itself. For columns below ``Lc + M`` the values equal
    :func:`tree_mask`'s with ``committed_valid = valid[:, :Lc]``, bit for bit; past them, hidden.

    Dispatch: the Triton kernel when the tensors are on CUDA and triton imports, :func:`tree_mask_at_ref`
    otherwise (see :func:`specdec.kernels.kernel_mode`).

    Args:
        valid: Shape ``[B, C]`` bool, which cache slots hold real tokens (only those below ``Lc`` are read).
        parents: Shape ``[B, M]`` int64, each new node's parent among the new nodes (``-1``: none); parents
            precede their children.
        present: Shape ``[B, M]`` bool, which new nodes are real; ``None``: node 0 and every node with a parent
            (found in the same launch).
        start: Shape ``[1]`` int64, ``Lc`` (e.g. ``slots[:1]`` of the forward's write slots).
        out: Shape ``[B, 1, M, W]`` floating, ``W <= C``, unit last stride: written whole.

    Returns:
        ``out``.

    Example:
        >>> m = tree_mask_at(torch.tensor([[False, True, True, True]]), torch.tensor([[-1, 0]]),
        ...                  torch.tensor([[True, True]]), torch.tensor([2]), torch.empty(1, 1, 2, 4))
        >>> (m[0, 0] == 0).int().tolist()
        [[0, 1, 1, 0], [0, 1, 1, 1]]
    """
    _check_at(valid, parents, present, start, out)
    if not use_kernel("tree_mask_at", valid, parents, start, out):
        return tree_mask_at_ref(valid, parents, present, start, out)
    batch, nodes = parents.shape
    if batch and nodes:
        rooted = present is None
        present = parents if rooted else present.view(torch.uint8)  # never read when rooted
        _tree_mask_at_kernel[(nodes, batch)](
            valid.view(torch.uint8), parents, present, start, out, _fill_values(out.dtype, out.device), nodes,
            out.shape[-1], valid.stride(0), parents.stride(0), present.stride(0), out.stride(0), out.stride(2),
            ROOTED=rooted, BLOCK_L=512, BLOCK_T=next_pow2(nodes), **pdl_launch())
    return out


# --------------------------------------------------------------------------------------------------------
# The same family for a draft head's fixed-capacity cache: frontier visibility over slot ranges
# --------------------------------------------------------------------------------------------------------


def _check_head(lengths, visible, scratch_start, capacity, dtype, out, alignment) -> tuple[int, int, int]:
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or lengths.dtype.is_floating_point \
            or lengths.dtype == torch.bool:
        raise ValueError("head_tree_mask: lengths must be an int tensor of shape [B] (committed slots per row, "
                         "e.g. EagleState.lengths)")
    batch = lengths.shape[0]
    if not isinstance(visible, torch.Tensor) or visible.dim() != 3 or visible.dtype != torch.bool \
            or visible.shape[0] != batch:
        raise ValueError(f"head_tree_mask: visible must be a bool tensor of shape [B, F, S] = [{batch}, ...] (which "
                         f"scratch slots each frontier node sees: its ancestors and itself), got "
                         f"{getattr(visible, 'dtype', None)} {tuple(getattr(visible, 'shape', ()))}")
    nodes, scratch = visible.shape[1], visible.shape[2]
    if not isinstance(scratch_start, int) or not isinstance(capacity, int) or scratch_start < 0 \
            or scratch_start + scratch > capacity:
        raise ValueError(f"head_tree_mask: the scratch slots [scratch_start, scratch_start + S) = [{scratch_start}, "
                         f"{scratch_start} + {scratch}) must lie inside the cache's {capacity} slots; pass ints with "
                         f"0 <= scratch_start <= capacity - S")
    if not isinstance(dtype, torch.dtype) or not (dtype == torch.bool or dtype.is_floating_point):
        raise ValueError(f"head_tree_mask: dtype must be torch.bool (True = attend) or a floating dtype (additive "
                         f"0 / finfo.min), got {dtype!r}")
    if not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"head_tree_mask: alignment must be an int >= 1 (8 suits SDPA), got {alignment!r}")
    devices = {lengths.device, visible.device}
    if out is not None:
        shape = (batch, 1, nodes, capacity)
        if tuple(out.shape) != shape or out.dtype != dtype or out.stride(-1) != 1:
            raise ValueError(f"head_tree_mask: out must be a {dtype} tensor of shape {shape} with unit last stride "
                             f"(e.g. a view of a preallocated buffer), got {out.dtype} {tuple(out.shape)} strides "
                             f"{out.stride()}")
        devices.add(out.device)
    if len(devices) > 1:
        raise ValueError(f"head_tree_mask: all tensors must be on one device, got {sorted(map(str, devices))}")
    return batch, nodes, scratch


def _aligned_empty(batch: int, nodes: int, width: int, dtype, device, alignment: int) -> torch.Tensor:
    padded = -(-width // alignment) * alignment
    return torch.empty(batch, 1, nodes, padded, dtype=dtype, device=device)


def head_tree_mask_ref(
    lengths: torch.Tensor,
    visible: torch.Tensor,
    scratch_start: int,
    capacity: int,
    dtype: torch.dtype,
    *,
    out: torch.Tensor | None = None,
    alignment: int = 8,
) -> torch.Tensor:
    """Reference for :func:`head_tree_mask` (same signature and result): the EAGLE drafter's former torch code.

    Args:
        lengths: Shape ``[B]`` int64, committed slots per row.
        visible: Shape ``[B, F, S]`` bool, scratch slots each frontier node sees.
        scratch_start: first scratch slot.
        capacity: ``C``, the cache's slots (the mask's key length).
        dtype: ``torch.bool`` or a floating dtype.
        out: Shape ``[B, 1, F, C]``, optional destination (unit last stride).
        alignment: row stride multiple of a newly allocated mask.

    Returns:
        Shape ``[B, 1, F, C]``.
    """
    batch, nodes, scratch = _check_head(lengths, visible, scratch_start, capacity, dtype, out, alignment)
    committed = torch.arange(scratch_start, device=lengths.device) < lengths[:, None]            # [B, S0]
    seen = torch.cat([committed[:, None].expand(batch, nodes, scratch_start), visible,
                      visible.new_zeros(batch, nodes, capacity - scratch_start - scratch)], dim=-1)[:, None]
    if dtype == torch.bool:
        storage = _aligned_empty(batch, nodes, capacity, dtype, lengths.device, alignment)
        storage[..., capacity:] = False
        mask = storage[..., :capacity].copy_(seen)
    else:
        mask = to_aligned_additive_mask(seen, dtype, alignment)
    return mask if out is None else out.copy_(mask)


@jit
def _head_tree_mask_kernel(
    lengths_ptr, visible_ptr, out_ptr, fill_ptr,
    scratch_start, scratch_len, write_width,
    stride_vb, stride_vq, stride_vs, stride_ob, stride_oq,
    BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    query = tl.program_id(0)
    row = tl.program_id(1)
    zero = tl.load(fill_ptr)
    hidden = tl.load(fill_ptr + 1)
    length = tl.load(lengths_ptr + row)
    out_row = out_ptr + row * stride_ob + query * stride_oq
    vis_row = visible_ptr + row * stride_vb + query * stride_vq
    for start in range(0, write_width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        offset = cols - scratch_start
        in_scratch = (offset >= 0) & (offset < scratch_len)
        vis = tl.load(vis_row + offset * stride_vs, mask=in_scratch, other=0) != 0
        seen = ((cols < scratch_start) & (cols < length)) | vis
        tl.store(out_row + cols, tl.where(seen, zero, hidden), mask=cols < write_width)


def _head_fill_values(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if dtype != torch.bool:
        return _fill_values(dtype, device)
    key = (dtype, device)
    if key not in _FILL_CACHE:
        values = torch.zeros(2, dtype=torch.uint8, device=device)  # a bool mask, written as bytes: [True, False]
        values[0] = 1  # a fill, not a host-to-device copy: safe even inside a CUDA graph capture
        _FILL_CACHE[key] = values
    return _FILL_CACHE[key]


def _head_tree_mask_triton(lengths, visible, scratch_start, capacity, dtype, out, alignment) -> torch.Tensor:
    batch, nodes, scratch = _check_head(lengths, visible, scratch_start, capacity, dtype, out, alignment)
    device = lengths.device
    if out is None:
        storage = _aligned_empty(batch, nodes, capacity, dtype, device, alignment)
        mask, write_width = storage[..., :capacity], storage.shape[-1]
    else:
        mask, write_width = out, capacity
    if batch and nodes:
        target = mask.view(torch.uint8) if dtype == torch.bool else mask
        vis = visible.view(torch.uint8)
        _head_tree_mask_kernel[(nodes, batch)](
            lengths.long(), vis, target, _head_fill_values(dtype, device),
            scratch_start, scratch, write_width,
            vis.stride(0), vis.stride(1), vis.stride(2), target.stride(0), target.stride(2),
            BLOCK=min(512, next_pow2(write_width)), **pdl_launch(),
        )
    return mask


def head_tree_mask(
    lengths: torch.Tensor,
    visible: torch.Tensor,
    scratch_start: int,
    capacity: int,
    dtype: torch.dtype,
    *,
    out: torch.Tensor | None = None,
    alignment: int = 8,
) -> torch.Tensor:
    """The attention mask of one tree level over a draft head's fixed-capacity cache, in one launch.

    A draft head (EAGLE's) keeps its keys in a slot-addressed cache of ``C`` slots: committed entries at slots
    ``0..lengths-1``, the tree's scratch slots at ``[scratch_start, scratch_start + S)`` (the frontier's own keys
    are the last ``F`` of them), the rest unused. Frontier node ``q`` of row ``b`` sees::

        seen[b, q, k] = k < lengths[b]                      for k < scratch_start    (the committed prefix)
                      = visible[b, q, k - scratch_start]    for k in the scratch slots (its ancestors and itself)
                      = False                               otherwise
        mask = seen (dtype bool)  or  where(seen, 0, finfo(dtype).min) (floating dtype),  rows padded to `alignment`

    Same values, bit for bit, as the EAGLE drafter's former ``cat([committed, visible, zeros])`` (bool), or as
    ``to_aligned_additive_mask`` of it (floating); no host sync, shapes fixed by ``(B, F, S, C)``, so it is
    captured in CUDA graphs as it is. The tree's ancestor sets come from the tree policy (``visible``, see
    :mod:`specdec.trees.dynamic`); :func:`tree_mask` is the target-side member of the family, which walks parents.

    Dispatch: the Triton kernel when the tensors are on CUDA and triton imports, :func:`head_tree_mask_ref`
    otherwise (see :func:`specdec.kernels.kernel_mode`).

    Args:
        lengths: Shape ``[B]`` int64, committed slots per row (slot = position).
        visible: Shape ``[B, F, S]`` bool, which scratch slots each frontier node sees.
        scratch_start: first scratch slot (``>= max(lengths)`` in use, so that the ranges never overlap).
        capacity: ``C``, the cache's slots (the mask's key length).
        dtype: ``torch.bool`` (True = attend) or a floating dtype (additive: 0 visible, ``finfo.min`` hidden).
        out: Shape ``[B, 1, F, C]``, optional destination with unit last stride (a view of a preallocated buffer).
        alignment: row stride multiple of a newly allocated mask.

    Returns:
        Shape ``[B, 1, F, C]``.

    Example:
        >>> m = head_tree_mask(torch.tensor([2]), torch.tensor([[[True, False], [True, True]]]), 3, 6, torch.bool)
        >>> m[0, 0].int().tolist()
        [[1, 1, 0, 1, 0, 0], [1, 1, 0, 1, 1, 0]]

    References:
        EAGLE arXiv 2401.15077 (tree attention in the draft head); EAGLE-2 arXiv 2406.16858.
    """
    tensors = [lengths, visible] + ([out] if out is not None else [])
    if use_kernel("head_tree_mask", *tensors):
        return _head_tree_mask_triton(lengths, visible, scratch_start, capacity, dtype, out, alignment)
    return head_tree_mask_ref(lengths, visible, scratch_start, capacity, dtype, out=out, alignment=alignment)


# --------------------------------------------------------------------------------------------------------
# A draft head's update: the committed entries' mask, slots and the rows' new lengths in one launch
# --------------------------------------------------------------------------------------------------------


class HeadUpdate(NamedTuple):
    """What a draft head's update forward needs besides its inputs (see :func:`head_update_mask`).

    Attributes:
        mask: Shape ``[B, 1, M, C]``: bool (True = attend) or additive (0 / ``finfo.min``), rows padded to the
            alignment.
        slots: Shape ``[B, M]`` int64, where each entry's key goes (its position; the trash slot ``C - 1`` for
            padding).
        lengths: Shape ``[B]`` int64, the rows' committed lengths after the update.
        last: Shape ``[B]`` int64, the index of each row's last real entry (``-1``: none).
    """

    mask: torch.Tensor
    slots: torch.Tensor
    lengths: torch.Tensor
    last: torch.Tensor


def _check_update(lengths, positions, valid, capacity, dtype, alignment) -> tuple[int, int]:
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2 or positions.dtype.is_floating_point:
        raise ValueError(f"head_update_mask: positions must be an int tensor [B, M] (the entries' positions = slots), "
                         f"got {tuple(getattr(positions, 'shape', ()))}")
    B, M = positions.shape
    if M < 1:
        raise ValueError("head_update_mask: needs at least one entry per row (M >= 1); skip the update for M = 0")
    if not isinstance(lengths, torch.Tensor) or tuple(lengths.shape) != (B,) or lengths.dtype.is_floating_point:
        raise ValueError(f"head_update_mask: lengths must be an int tensor of shape [B] = [{B}], got "
                         f"{tuple(getattr(lengths, 'shape', ()))}")
    if not isinstance(valid, torch.Tensor) or tuple(valid.shape) != (B, M):
        raise ValueError(f"head_update_mask: valid must have the positions' shape [B, M] = [{B}, {M}], got "
                         f"{tuple(getattr(valid, 'shape', ()))}")
    if not isinstance(capacity, int) or capacity < 2:
        raise ValueError(f"head_update_mask: capacity must be an int >= 2 (slots, the last one the trash slot), got "
                         f"{capacity!r}")
    if not isinstance(dtype, torch.dtype) or not (dtype == torch.bool or dtype.is_floating_point):
        raise ValueError(f"head_update_mask: dtype must be torch.bool or a floating dtype, got {dtype!r}")
    if not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"head_update_mask: alignment must be an int >= 1, got {alignment!r}")
    return B, M


def head_update_mask_ref(lengths: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, capacity: int,
                         dtype: torch.dtype, *, alignment: int = 8) -> HeadUpdate:
    """Reference for :func:`head_update_mask` (same arguments and result): the EAGLE drafter's former torch code."""
    B, M = _check_update(lengths, positions, valid, capacity, dtype, alignment)
    valid = valid.bool()
    device = positions.device
    slots = torch.where(valid, positions, torch.full_like(positions, capacity - 1))
    new_lengths = torch.maximum(lengths.long(), torch.where(valid, positions + 1, 0).amax(1))
    s = torch.arange(capacity, device=device)
    sees = (s < new_lengths[:, None, None]) & (s <= positions[:, :, None])
    sees |= ~valid[:, :, None] & (s == 0)  # padding entries look at slot 0: finite, never used
    last = torch.where(valid, torch.arange(M, device=device), -1).amax(1)
    if dtype == torch.bool:
        storage = _aligned_empty(B, M, capacity, dtype, device, alignment)
        storage[..., capacity:] = False
        mask = storage[..., :capacity].copy_(sees[:, None])
    else:
        mask = to_aligned_additive_mask(sees[:, None], dtype, alignment)
    return HeadUpdate(mask, slots, new_lengths, last)


@jit
def _head_update_kernel(lengths_ptr, pos_ptr, valid_ptr, fill_ptr, mask_ptr, slots_ptr, new_len_ptr, last_ptr,
                        M, trash, write_width, stride_ob, stride_oq,
                        BLOCK_M: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (entry, row): the row's new length from all its entries, this entry's slot and mask row
    (committed slots up to its own position), and, for entry 0, the row's length and last real entry."""
    pdl_start(PDL)
    t = tl.program_id(0)
    row = tl.program_id(1)
    zero = tl.load(fill_ptr)
    hidden = tl.load(fill_ptr + 1)
    e = tl.arange(0, BLOCK_M)
    e_in = e < M
    pos_all = tl.load(pos_ptr + row * M + e, mask=e_in, other=0)
    ok_all = (tl.load(valid_ptr + row * M + e, mask=e_in, other=0) != 0) & e_in
    new_len = tl.maximum(tl.load(lengths_ptr + row), tl.max(tl.where(ok_all, pos_all + 1, 0), axis=0))
    if t == 0:
        tl.store(new_len_ptr + row, new_len)
        tl.store(last_ptr + row, tl.max(tl.where(ok_all, e, -1), axis=0).to(tl.int64))
    pos = tl.load(pos_ptr + row * M + t)
    flag = tl.load(valid_ptr + row * M + t)
    tl.store(slots_ptr + row * M + t, tl.where(flag != 0, pos, trash))
    out_row = mask_ptr + row * stride_ob + t * stride_oq
    for start in range(0, write_width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        seen = ((cols < new_len) & (cols <= pos)) | ((flag == 0) & (cols == 0))
        tl.store(out_row + cols, tl.where(seen, zero, hidden), mask=cols < write_width)


def head_update_mask(lengths: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, capacity: int,
                     dtype: torch.dtype, *, alignment: int = 8) -> HeadUpdate:
    """The mask, slots and new lengths of a draft head's update forward over its committed entries, in one launch.

    A draft head's cache is slot-addressed (slot = position). An update runs the head over each row's ``M``
    newly committed entries (padding where ``valid`` is False) and writes their keys at their positions::

        slots[b, t]    = positions[b, t] if valid[b, t] else C - 1            (the trash slot)
        lengths'[b]    = max(lengths[b], max_t {positions[b, t] + 1 : valid[b, t]})
        seen[b, t, s]  = (s < lengths'[b] and s <= positions[b, t])  or  (not valid[b, t] and s == 0)
        last[b]        = max {t : valid[b, t]}, or -1

    The mask is ``seen`` (bool) or ``where(seen, 0, finfo(dtype).min)``, rows padded to ``alignment`` (as
    :func:`specdec.masks.to_aligned_additive_mask` pads them); a padding entry also sees slot 0, so that its row is
    finite (its output is never used). No host sync; shapes fixed by ``(B, M, C)``, so CUDA graphs capture it. The
    EAGLE drafter's ``update`` ran this as about sixteen torch kernels (and the attention converted the bool mask:
    three more).

    Dispatch: the Triton kernel when the tensors are on CUDA and triton imports, :func:`head_update_mask_ref`
    otherwise (see :func:`specdec.kernels.kernel_mode`).

    Args:
        lengths: Shape ``[B]`` int64, committed slots per row before the update.
        positions: Shape ``[B, M]`` int64, the entries' positions (``< capacity - 1``).
        valid: Shape ``[B, M]`` bool, real entries.
        capacity: ``C``, the cache's slots.
        dtype: ``torch.bool`` or a floating dtype (additive).
        alignment: row stride multiple of the mask.

    Returns:
        A :class:`HeadUpdate` ``(mask [B, 1, M, C], slots [B, M], lengths [B], last [B])``.

    Example:
        >>> u = head_update_mask(torch.tensor([2]), torch.tensor([[2, 3]]), torch.tensor([[True, False]]), 6,
        ...                      torch.bool)
        >>> u.mask[0, 0].int().tolist(), u.slots.tolist(), u.lengths.tolist(), u.last.tolist()
        ([[1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0]], [[2, 5]], [3], [0])

    References:
        EAGLE arXiv 2401.15077 (the draft head's cache over the accepted tokens).
    """
    B, M = _check_update(lengths, positions, valid, capacity, dtype, alignment)
    if not use_kernel("head_update_mask", lengths, positions, valid):
        return head_update_mask_ref(lengths, positions, valid, capacity, dtype, alignment=alignment)
    device = positions.device
    storage = _aligned_empty(B, M, capacity, dtype, device, alignment)
    mask, write_width = storage[..., :capacity], storage.shape[-1]
    slots = torch.empty(B, M, dtype=torch.long, device=device)
    new_lengths = torch.empty(B, dtype=torch.long, device=device)
    last = torch.empty(B, dtype=torch.long, device=device)
    if B:
        target = mask.view(torch.uint8) if dtype == torch.bool else mask
        ok = valid.view(torch.uint8) if valid.dtype == torch.bool else valid.to(torch.uint8)  # bool: no copy
        _head_update_kernel[(M, B)](lengths.long().contiguous(), positions.long().contiguous(), ok.contiguous(),
                                    _head_fill_values(dtype, device), target, slots, new_lengths, last, M,
                                    capacity - 1, write_width, target.stride(0), target.stride(2),
                                    BLOCK_M=max(2, next_pow2(M)), BLOCK=min(512, next_pow2(write_width)),
                                    **pdl_launch())
    return HeadUpdate(mask, slots, new_lengths, last)
