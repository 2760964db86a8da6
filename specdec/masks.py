"""Attention masks for tree verification and padded prompts, as predicates and as fast 4-D tensors.

Two layers, in the style of attention-gym:

- A *mask mod* is a pure predicate ``mask_mod(b, q_idx, kv_idx) -> bool tensor`` evaluated on broadcastable
  index tensors (True = the query may attend to the key). Mask mods combine with :func:`and_masks` and
  :func:`or_masks`, and :func:`create_mask` evaluates one on a full ``[B, 1, Q, KV]`` grid. This layer is the
  readable *reference*. (attention-gym's ``mask_mod`` also takes a head index; every mask here is shared by
  all heads, so it is left out.)
- Fast builders with the same meaning: :func:`tree_attention_mask` and :func:`causal_mask_with_padding`,
  checked against their references :func:`tree_attention_mask_ref` and :func:`causal_mask_with_padding_ref`.
  They run on the device of their inputs, with no host sync and no Python loop over the batch or the nodes.

Output forms, for HF's ``attention_mask=`` argument (a 4-D mask is passed to the attention as is):
``dtype=torch.bool`` gives True = attend (SDPA); a floating ``dtype`` gives the additive form, 0 where
attended and ``torch.finfo(dtype).min`` elsewhere (eager attention adds the mask to the scores, so it needs
this form; SDPA takes it too). Every query row attends to at least itself, so no row is all-masked.

Tree-step layout: the cache holds ``L`` slots before the tree (real tokens, left padding, holes), then the
tree's ``N + 1`` nodes (root first) are run in one forward, so the mask is ``[B, 1, N + 1, L + N + 1]``: the
first ``L`` columns are the prefix (``prefix_valid``), the last ``N + 1`` columns the tree (ancestor or self).

References:
    - SpecInfer: Miao et al., arXiv 2305.09781 (tree-based parallel decoding, topology-aware causal mask).
    - Medusa: Cai et al., arXiv 2401.10774 (``medusa_attn_mask``); EAGLE: Li et al., arXiv 2401.15077
      (``tree_attn_mask``).
    - vLLM ``tree_attn`` backend (``_prepare_tree_attn_bias``: additive bias, 0 on ancestors and self).
    - attention-gym (``mask_mod``, ``and_masks``, ``or_masks``, ``create_mask``).
"""
from __future__ import annotations

import numbers
from collections.abc import Callable

import torch

from .trees import Tree, ancestor_matrix

__all__ = [
    "MaskMod",
    "and_masks",
    "or_masks",
    "create_mask",
    "to_additive_mask",
    "to_aligned_additive_mask",
    "causal_mask_mod",
    "diagonal_mask_mod",
    "padding_mask_mod",
    "prefix_mask_mod",
    "tree_mask_mod",
    "tree_attention_mask",
    "tree_attention_mask_ref",
    "causal_mask_with_padding",
    "causal_mask_with_padding_ref",
    "prefix_valid_from_lengths",
    "tree_positions",
]

#: ``mask_mod(b, q_idx, kv_idx) -> bool tensor``: a pure predicate on broadcastable int64 index tensors.
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------------------------------------
# Predicates and the generic builder (the reference layer)
# --------------------------------------------------------------------------------------------------------


def and_masks(*mask_mods: MaskMod) -> MaskMod:
    """Combine mask mods with logical AND: attend only where every one of them attends.

    Args:
        *mask_mods: one or more predicates ``(b, q_idx, kv_idx) -> bool tensor``.

    Returns:
        A mask mod.

    Example:
        >>> m = and_masks(causal_mask_mod, lambda b, q, kv: kv > 0)
        >>> create_mask(m, 1, 3, 3)[0, 0].int().tolist()
        [[0, 0, 0], [0, 1, 0], [0, 1, 1]]

    References:
        attention-gym ``and_masks``.
    """
    if not mask_mods:
        raise ValueError("and_masks needs at least one mask mod")

    def combined(b: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        out = mask_mods[0](b, q_idx, kv_idx)
        for mod in mask_mods[1:]:
            out = out & mod(b, q_idx, kv_idx)
        return out

    return combined


def or_masks(*mask_mods: MaskMod) -> MaskMod:
    """Combine mask mods with logical OR: attend where any one of them attends.

    Args:
        *mask_mods: one or more predicates ``(b, q_idx, kv_idx) -> bool tensor``.

    Returns:
        A mask mod.

    Example:
        >>> m = or_masks(diagonal_mask_mod, lambda b, q, kv: kv == 0)
        >>> create_mask(m, 1, 3, 3)[0, 0].int().tolist()
        [[1, 0, 0], [1, 1, 0], [1, 0, 1]]

    References:
        attention-gym ``or_masks``.
    """
    if not mask_mods:
        raise ValueError("or_masks needs at least one mask mod")

    def combined(b: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        out = mask_mods[0](b, q_idx, kv_idx)
        for mod in mask_mods[1:]:
            out = out | mod(b, q_idx, kv_idx)
        return out

    return combined


def create_mask(
    mask_mod: MaskMod, B: int, Q: int, KV: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Evaluate a mask mod on every ``(b, q_idx, kv_idx)``: the generic (reference) mask builder.

    Args:
        mask_mod: predicate ``(b, q_idx, kv_idx) -> bool tensor``; it receives ``b`` of shape ``[B, 1, 1]``,
            ``q_idx`` of shape ``[1, Q, 1]`` and ``kv_idx`` of shape ``[1, 1, KV]`` (int64).
        B: batch rows. Q: query positions. KV: key positions.
        device: where to build the indices (default CPU).

    Returns:
        Shape ``[B, 1, Q, KV]`` bool, True = attend.

    Example:
        >>> create_mask(causal_mask_mod, 1, 2, 2)[0, 0].tolist()
        [[True, False], [True, True]]

    References:
        attention-gym ``create_mask``.
    """
    b = torch.arange(B, device=device)[:, None, None]
    q_idx = torch.arange(Q, device=device)[None, :, None]
    kv_idx = torch.arange(KV, device=device)[None, None, :]
    out = torch.as_tensor(mask_mod(b, q_idx, kv_idx), dtype=torch.bool, device=device)
    return out.expand(B, Q, KV)[:, None].clone()


def causal_mask_mod(b: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    """Causal predicate: a query attends to keys at or before its own index (``kv_idx <= q_idx``)."""
    return kv_idx <= q_idx


def diagonal_mask_mod(b: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    """Self predicate: a query attends to the key at its own index (keeps padding rows non-empty)."""
    return kv_idx == q_idx


def _lookup(table: torch.Tensor, b: torch.Tensor, idx: torch.Tensor, fill: object) -> torch.Tensor:
    # table[b, idx] with out-of-range idx giving `fill`: a spare last column holds the fill value.
    spare = torch.full((table.shape[0], 1), fill, dtype=table.dtype, device=table.device)
    padded = torch.cat([table, spare], dim=1)
    inside = (idx >= 0) & (idx < table.shape[1])
    return padded[b, torch.where(inside, idx, table.shape[1])]


def padding_mask_mod(valid: torch.Tensor) -> MaskMod:
    """Predicate true where both the query and the key are real tokens.

    Args:
        valid: Shape ``[B, T]`` bool, which positions hold real tokens (False = padding).

    Returns:
        A mask mod over ``q_idx, kv_idx < T``.

    References:
        HF ``masking_utils`` (padding mask function).
    """
    valid = _as_bool_2d(valid, "valid")

    def mod(b: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return _lookup(valid, b, q_idx, False) & _lookup(valid, b, kv_idx, False)

    return mod


def prefix_mask_mod(prefix_valid: torch.Tensor) -> MaskMod:
    """Predicate for the prefix columns of a tree step: key ``kv_idx < L`` is attended iff it is valid.

    Args:
        prefix_valid: Shape ``[B, L]`` bool, which cache slots before the tree row ``b`` may see.

    Returns:
        A mask mod, False for every ``kv_idx >= L`` (the tree columns).
    """
    prefix_valid = _as_bool_2d(prefix_valid, "prefix_valid")

    def mod(b: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return _lookup(prefix_valid, b, kv_idx, False)

    return mod


def tree_mask_mod(parents: torch.Tensor, prefix_len: int) -> MaskMod:
    """Predicate for the tree columns: query node ``q`` attends to key ``prefix_len + j`` iff ``j`` is ``q``
    or an ancestor of ``q``.

    The reference walks from ``q`` up to the root one parent at a time (``N`` steps); the fast path
    (:func:`specdec.trees.ancestor_matrix`) uses pointer doubling instead. Absent nodes (parent ``-1``) see
    only themselves.

    Args:
        parents: Shape ``[B, N + 1]`` int64, parent of each node, ``-1`` for the root and absent nodes.
        prefix_len: ``L``, the number of cache slots before the tree (the tree's first key column).

    Returns:
        A mask mod over query indices ``0..N`` (node indices), False for every ``kv_idx < prefix_len``.

    References:
        SpecInfer arXiv 2305.09781; Medusa arXiv 2401.10774; EAGLE arXiv 2401.15077.
    """
    if not isinstance(parents, torch.Tensor) or parents.dim() != 2:
        raise ValueError("parents must be a tensor of shape [B, N + 1] (node 0 is the root)")
    parents = parents.long()
    num_nodes = parents.shape[1] - 1

    def mod(b: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        node = kv_idx - prefix_len
        current = torch.broadcast_to(q_idx, torch.broadcast_shapes(b.shape, q_idx.shape))
        hit = (node >= 0) & (current == node)
        for _ in range(num_nodes):
            current = _lookup(parents, b, current, -1)
            hit = hit | ((current >= 0) & (current == node))
        return hit

    return mod


def to_additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Turn a boolean mask (True = attend) into the additive form: 0 where attended, ``finfo(dtype).min``
    elsewhere.

    Args:
        mask: bool tensor of any shape, e.g. ``[B, 1, Q, KV]``.
        dtype: a floating dtype, usually the model's (``torch.float32``, ``torch.bfloat16``, ...).

    Returns:
        A tensor of the same shape and ``dtype``.

    Example:
        >>> to_additive_mask(torch.tensor([True, False]), torch.float16).tolist()
        [0.0, -65504.0]

    References:
        HF transformers (additive masks use ``torch.finfo(dtype).min``); vLLM ``tree_attn`` bias.
    """
    if not dtype.is_floating_point:
        raise ValueError(
            f"an additive mask needs a floating dtype, got {dtype}; use torch.bool for True = attend"
        )
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.finfo(dtype).min)


def to_aligned_additive_mask(mask: torch.Tensor, dtype: torch.dtype, alignment: int = 8) -> torch.Tensor:
    """:func:`to_additive_mask` into storage whose rows are padded to a multiple of ``alignment`` elements.

    PyTorch's memory-efficient SDPA kernel needs the mask's strides aligned to 8 elements; given a mask whose
    key length is not, it copies it into a padded one in *every* attention call (every layer). A mask made
    here is a view of width ``KV`` into padded storage, so the kernel takes it as is.

    Args:
        mask: bool, ``[..., KV]`` (e.g. ``[B, 1, Q, KV]``), True = attend.
        dtype: a floating dtype.
        alignment: row stride multiple (elements).

    Returns:
        The additive mask, shape ``mask.shape``; ``stride(-2)`` is a multiple of ``alignment``.

    Example:
        >>> m = to_aligned_additive_mask(torch.ones(1, 1, 2, 5, dtype=torch.bool), torch.float32)
        >>> m.shape, m.stride(-2)
        (torch.Size([1, 1, 2, 5]), 8)

    References:
        PyTorch ``aten/src/ATen/native/transformers/attention.cpp`` (``preprocess_mask``, ``pad_bias``).
    """
    kv = mask.shape[-1]
    pad = -kv % alignment
    if pad:
        mask = torch.nn.functional.pad(mask, (0, pad))
    return to_additive_mask(mask, dtype)[..., :kv]


def _finish(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return mask
    return to_additive_mask(mask, dtype)


def _check_dtype(dtype: torch.dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not (dtype == torch.bool or dtype.is_floating_point):
        raise ValueError(
            f"dtype must be torch.bool (True = attend, for SDPA) or a floating dtype (additive 0 / "
            f"finfo.min, for eager attention), got {dtype!r}"
        )


def _as_bool_2d(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a tensor of shape [B, length] (bool or 0/1), got {shape}")
    if x.dtype.is_floating_point or x.dtype.is_complex:
        raise ValueError(
            f"{name} must be bool (or integer 0/1 like HF's attention_mask), got dtype {x.dtype}"
        )
    return x if x.dtype == torch.bool else x != 0


def _tree_batch(parents: torch.Tensor | Tree, batch: int, device: torch.device) -> torch.Tensor:
    """Parents as ``[B, N + 1]`` on ``device`` (a :class:`Tree` is broadcast to every row)."""
    if isinstance(parents, Tree):
        return parents.parents.to(device)[None].expand(batch, parents.num_nodes + 1)
    if not isinstance(parents, torch.Tensor) or parents.dim() != 2:
        raise ValueError(
            "parents must be a Tree or a tensor of shape [B, N + 1] (node 0 is the root, -1 = no parent)"
        )
    if parents.shape[0] != batch:
        raise ValueError(
            f"parents has {parents.shape[0]} rows but prefix_valid has {batch}; give one tree per row "
            f"(or a Tree, shared by every row)"
        )
    if parents.device != device:
        raise ValueError(
            f"parents is on {parents.device} but prefix_valid is on {device}; move both to one device"
        )
    return parents.long()


# --------------------------------------------------------------------------------------------------------
# Fast builders and their references
# --------------------------------------------------------------------------------------------------------


def tree_attention_mask(
    parents: torch.Tensor | Tree, prefix_valid: torch.Tensor, *, dtype: torch.dtype = torch.bool
) -> torch.Tensor:
    """The 4-D attention mask of one tree-verification forward: prefix as given, each node sees its ancestors.

    Query ``i`` is tree node ``i`` (root 0). Key ``k < L`` is cache slot ``k`` before the tree: attended iff
    ``prefix_valid[b, k]``. Key ``L + j`` is tree node ``j``: attended iff ``j`` is ``i`` or an ancestor of
    ``i``. Absent nodes (parent ``-1``, index > 0) see the prefix and themselves only, so no row is
    all-masked; their outputs are meaningless and must not be verified.

    .. math::
        M[b, 0, i, k] = \\text{prefix\\_valid}[b, k] \\;(k < L), \\qquad
        M[b, 0, i, L + j] = [\\, j \\preceq_b i \\,]

    Args:
        parents: Shape ``[B, N + 1]`` int64 (one tree per row, the :class:`specdec.types.Draft` layout), or a
            :class:`specdec.trees.Tree` shared by every row (its precomputed ancestor mask is used; move the
            tree to the device once with ``tree.to(device)``).
        prefix_valid: Shape ``[B, L]`` bool (or 0/1 integers), which cache slots before the tree each row may
            see: False for left padding and for holes (e.g. rejected drafts not yet removed from the cache).
            With HF's ``DynamicCache``, ``L = cache.get_seq_length()``.
        dtype: ``torch.bool`` (True = attend; SDPA) or a floating dtype for the additive form (0 attended,
            ``finfo(dtype).min`` masked; required by eager attention).

    Returns:
        Shape ``[B, 1, N + 1, L + N + 1]`` in ``dtype``, on the device of ``prefix_valid``.

    Example:
        >>> from specdec.trees import compile_tree
        >>> tree = compile_tree([(0,), (1,), (0, 0)])
        >>> mask = tree_attention_mask(tree, torch.tensor([[False, True]]))
        >>> mask.shape
        torch.Size([1, 1, 4, 6])
        >>> mask[0, 0].int().tolist()
        [[0, 1, 1, 0, 0, 0], [0, 1, 1, 1, 0, 0], [0, 1, 1, 0, 1, 0], [0, 1, 1, 1, 0, 1]]

    References:
        SpecInfer arXiv 2305.09781; Medusa arXiv 2401.10774 (``medusa_attn_mask``); EAGLE arXiv 2401.15077
        (``tree_attn_mask``); vLLM ``tree_attn`` backend; SGLang ``build_tree_kernel_efficient`` (FULL_MASK).
    """
    _check_dtype(dtype)
    prefix_valid = _as_bool_2d(prefix_valid, "prefix_valid")
    batch, prefix_len = prefix_valid.shape
    if isinstance(parents, Tree):
        width = parents.num_nodes + 1
        anc = parents.ancestor_mask.to(prefix_valid.device)[None].expand(batch, width, width)
    else:
        anc = ancestor_matrix(_tree_batch(parents, batch, prefix_valid.device))
        width = anc.shape[1]
    prefix = prefix_valid[:, None, :].expand(batch, width, prefix_len)
    return _finish(torch.cat([prefix, anc], dim=-1)[:, None], dtype)


def tree_attention_mask_ref(
    parents: torch.Tensor | Tree, prefix_valid: torch.Tensor, *, dtype: torch.dtype = torch.bool
) -> torch.Tensor:
    """Reference for :func:`tree_attention_mask` (same signature and result), built from mask mods.

    ``create_mask(or_masks(prefix_mask_mod(prefix_valid), tree_mask_mod(parents, L)), B, N + 1, L + N + 1)``.
    Slow (walks every path); for tests.

    Args:
        parents: Shape ``[B, N + 1]`` int64, or a :class:`specdec.trees.Tree`.
        prefix_valid: Shape ``[B, L]`` bool.
        dtype: ``torch.bool`` or a floating dtype.

    Returns:
        Shape ``[B, 1, N + 1, L + N + 1]`` in ``dtype``.
    """
    _check_dtype(dtype)
    prefix_valid = _as_bool_2d(prefix_valid, "prefix_valid")
    batch, prefix_len = prefix_valid.shape
    parents = _tree_batch(parents, batch, prefix_valid.device)
    width = parents.shape[1]
    mod = or_masks(prefix_mask_mod(prefix_valid), tree_mask_mod(parents, prefix_len))
    return _finish(create_mask(mod, batch, width, prefix_len + width, device=prefix_valid.device), dtype)


def causal_mask_with_padding(valid: torch.Tensor, *, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """4-D causal mask of a padded prompt: each real token sees the real tokens at or before it.

    Padding positions see only themselves (so no row is all-masked); their outputs are meaningless. Works
    for left padding, right padding and holes alike.

    Args:
        valid: Shape ``[B, T]`` bool (or HF's 0/1 ``attention_mask``), which positions are real tokens.
        dtype: ``torch.bool`` (True = attend) or a floating dtype for the additive form.

    Returns:
        Shape ``[B, 1, T, T]`` in ``dtype``, on the device of ``valid``.

    Example:
        >>> causal_mask_with_padding(torch.tensor([[0, 1, 1]]))[0, 0].int().tolist()
        [[1, 0, 0], [0, 1, 0], [0, 1, 1]]

    References:
        HF ``masking_utils.create_causal_mask`` (causal and padding mask functions combined).
    """
    _check_dtype(dtype)
    valid = _as_bool_2d(valid, "valid")
    length = valid.shape[1]
    positions = torch.arange(length, device=valid.device)
    causal = positions[None, :] <= positions[:, None]
    eye = positions[None, :] == positions[:, None]
    mask = (causal[None] & valid[:, :, None] & valid[:, None, :]) | eye[None]
    return _finish(mask[:, None], dtype)


def causal_mask_with_padding_ref(valid: torch.Tensor, *, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """Reference for :func:`causal_mask_with_padding` (same signature and result), built from mask mods.

    ``create_mask(or_masks(and_masks(causal_mask_mod, padding_mask_mod(valid)), diagonal_mask_mod), ...)``.

    Args:
        valid: Shape ``[B, T]`` bool.
        dtype: ``torch.bool`` or a floating dtype.

    Returns:
        Shape ``[B, 1, T, T]`` in ``dtype``.
    """
    _check_dtype(dtype)
    valid = _as_bool_2d(valid, "valid")
    mod = or_masks(and_masks(causal_mask_mod, padding_mask_mod(valid)), diagonal_mask_mod)
    batch, length = valid.shape
    return _finish(create_mask(mod, batch, length, length, device=valid.device), dtype)


def prefix_valid_from_lengths(lengths: torch.Tensor, L: int, *, left_padded: bool = True) -> torch.Tensor:
    """Which of ``L`` slots are real, from per-row lengths: the last ``lengths[b]`` slots (left padding)
    or the first ``lengths[b]`` (right padding).

    Args:
        lengths: Shape ``[B]`` int64, real tokens per row; values above ``L`` act as ``L`` (not checked, to
            avoid a host sync).
        L: number of slots, ``>= 0``.
        left_padded: True when padding is on the left (HF generation's convention for decoder-only models).

    Returns:
        Shape ``[B, L]`` bool, on the device of ``lengths``.

    Example:
        >>> prefix_valid_from_lengths(torch.tensor([1, 3]), 3).int().tolist()
        [[0, 0, 1], [1, 1, 1]]
        >>> prefix_valid_from_lengths(torch.tensor([1, 3]), 3, left_padded=False).int().tolist()
        [[1, 0, 0], [1, 1, 1]]

    References:
        HF transformers padding conventions (``padding_side="left"``).
    """
    if isinstance(L, bool) or not isinstance(L, numbers.Integral) or L < 0:
        raise ValueError(f"L must be an int >= 0 (the number of cache slots), got {L!r}")
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1:
        raise ValueError("lengths must be a tensor of shape [B] (real tokens per row)")
    slots = torch.arange(int(L), device=lengths.device)
    if left_padded:
        return slots[None, :] >= (int(L) - lengths)[:, None]
    return slots[None, :] < lengths[:, None]


def tree_positions(depths: torch.Tensor | Tree, root_positions: torch.Tensor) -> torch.Tensor:
    """Position ids of the tree nodes: the root's position plus each node's depth.

    Args:
        depths: Shape ``[B, N + 1]`` int64 (``Draft.depths``; absent nodes 0), or a
            :class:`specdec.trees.Tree` shared by every row.
        root_positions: Shape ``[B]`` int64, position id of each row's root. With positions counted over
            real tokens only (0 = first real prompt token) and the root not yet in the cache, this is the
            number of real tokens before it: ``prefix_valid.sum(-1)``.

    Returns:
        Shape ``[B, N + 1]`` int64, on the device of ``root_positions``; pass it as HF's ``position_ids``.

    Example:
        >>> from specdec.trees import chain_tree
        >>> tree_positions(chain_tree(2), torch.tensor([5, 3])).tolist()
        [[5, 6, 7], [3, 4, 5]]

    References:
        Medusa arXiv 2401.10774 (``medusa_position_ids`` + current length); EAGLE arXiv 2401.15077
        (``tree_position_ids``); SGLang ``build_tree_kernel_efficient`` (``seq_len + depth``).
    """
    if not isinstance(root_positions, torch.Tensor) or root_positions.dim() != 1:
        raise ValueError("root_positions must be a tensor of shape [B] (position id of each row's root)")
    if isinstance(depths, Tree):
        depths = depths.depths.to(root_positions.device)[None]
    elif not isinstance(depths, torch.Tensor) or depths.dim() != 2:
        raise ValueError("depths must be a Tree or a tensor of shape [B, N + 1]")
    elif depths.shape[0] != root_positions.shape[0]:
        raise ValueError(
            f"depths has {depths.shape[0]} rows but root_positions has {root_positions.shape[0]}; one per row"
        )
    return root_positions.long()[:, None] + depths.long()
