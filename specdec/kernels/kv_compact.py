"""KV-cache compaction of the accepted paths: every layer's keys and values in one launch.

What :meth:`specdec.adapter.ModelAdapter.commit` does per layer (two gathers and two concatenations per layer,
so ``4 * layers`` kernels)::

    k = cat([k[:, :, :Lc], k.gather(2, Lc + keep.clamp(min=0))], 2)       # [B, H, Lc + A, d]

:func:`compact_kv` does it for all layers at once: the launcher passes a table of the layers' data pointers and
one program per (tensor, row, head) copies its slots. ``inplace=True`` moves only the ``A`` kept slots inside
the existing tensors (all loads before a barrier, then all stores, so overlapping moves are safe) and returns
views: ``A`` slots of traffic per row and head instead of ``Lc + A``. Both keep the identity fast path: when every
row keeps a prefix of its pending slots (a chain, or nothing rejected), the result is a view and nothing moves.

References:
    - vLLM / SGLang keep a paged cache and only rewrite slot mappings; with HF's contiguous ``DynamicCache`` the
      accepted entries must move, as in Medusa / EAGLE's ``tree_decoding`` ``past_key_values`` index_select.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ._dispatch import use_kernel
from ._triton import jit, next_pow2, pdl_launch, pdl_start, pointer_table, tl

__all__ = ["compact_kv", "compact_kv_ref", "KVCompactPlan", "kept_at_ends", "kept_at_ends_ref"]


def _check(keys, values, keep, counts, committed_len, inplace, dest=None) -> tuple[int, int]:
    keys, values = list(keys), list(values)
    if len(keys) != len(values):
        raise ValueError(f"compact_kv: got {len(keys)} key tensors but {len(values)} value tensors; pass one per layer")
    if not isinstance(keep, torch.Tensor) or keep.dim() != 2 or keep.dtype.is_floating_point:
        raise ValueError("compact_kv: keep must be an int64 tensor of shape [B, A] (pending indices, -1 padded)")
    batch, kept = keep.shape
    if not isinstance(counts, torch.Tensor) or tuple(counts.shape) != (batch,):
        raise ValueError(f"compact_kv: counts must have shape [B] = [{batch}] (real entries of keep per row)")
    devices = {keep.device, counts.device}
    for tensor in keys + values:
        devices.add(tensor.device)
        if tensor.dim() != 4 or tensor.shape[0] != batch:
            raise ValueError(
                f"compact_kv: every cache tensor must have shape [B, heads, L, head_dim] with B = {batch}, got "
                f"{tuple(tensor.shape)}"
            )
        if not (0 <= committed_len <= tensor.shape[2]):
            raise ValueError(
                f"compact_kv: committed_len={committed_len} is outside [0, L = {tensor.shape[2]}]: pass the number of "
                f"committed slots (CacheState.committed_valid.shape[1])"
            )
        if inplace and committed_len + kept > tensor.shape[2]:
            raise ValueError(
                f"compact_kv: inplace needs Lc + A = {committed_len + kept} <= L = {tensor.shape[2]} (keep at most "
                f"the pending slots); use inplace=False"
            )
    if dest is not None:
        if not inplace or not isinstance(dest, torch.Tensor) or tuple(dest.shape) != (batch,):
            raise ValueError(f"compact_kv: dest (per-row destination slots) must be a [B] = [{batch}] int64 tensor "
                             f"and needs inplace=True")
        devices.add(dest.device)
    if len(devices) > 1:
        raise ValueError(f"compact_kv: all tensors must be on one device, got {sorted(map(str, devices))}")
    return batch, kept


def _is_identity(keep: torch.Tensor, counts: torch.Tensor, pending: int, prefix: bool | None = None) -> bool:
    # The one host sync of a commit: does every row keep a prefix of its pending slots (e.g. a chain)?
    # A caller that already knows (``prefix``) spares it.
    kept = keep.shape[1]
    if prefix is not None:
        return bool(prefix) and kept <= pending
    ar = torch.arange(kept, device=keep.device)[None, :]
    return kept <= pending and bool(((keep == ar) | (ar >= counts[:, None])).all())


def compact_kv_ref(
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    keep: torch.Tensor,
    counts: torch.Tensor,
    committed_len: int,
    *,
    inplace: bool = False,
    prefix: bool | None = None,
    dest: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Reference for :func:`compact_kv` (same signature and result): the adapter's per-layer torch code.

    Args:
        keys: one tensor per layer. Shape: ``[B, heads, L, head_dim]`` each, ``L = Lc + P``.
        values: one tensor per layer, shaped like ``keys``.
        keep: Shape ``[B, A]`` int64, pending indices to keep in sequence order, ``-1`` padded.
        counts: Shape ``[B]`` int64, real entries of ``keep`` per row.
        committed_len: ``Lc``, committed slots before the pending ones.
        inplace: write the kept slots into the given tensors and return views.
        prefix: whether every row keeps a prefix of its pending slots, if the caller knows (no host sync).
        dest: Shape ``[B]`` int64, per-row first destination slot (``inplace`` only; default ``Lc`` for every row).

    Returns:
        ``(keys, values)``: lists of ``[B, heads, Lc + A, head_dim]`` tensors.
    """
    _check(keys, values, keep, counts, committed_len, inplace, dest)
    lc = committed_len
    kept = keep.shape[1]
    tensors = list(keys) + list(values)
    if dest is not None:
        _move_rows(tensors, keep, lc, dest)
        out = [t[:, :, : lc + kept] for t in tensors]
        return out[: len(keys)], out[len(keys):]
    if kept == 0:
        out = [t[:, :, :lc] for t in tensors]
    elif _is_identity(keep, counts, tensors[0].shape[2] - lc if tensors else 0, prefix):
        out = [t[:, :, : lc + kept] for t in tensors]
    else:
        index = keep.long().clamp(min=0) + lc
        out = []
        for t in tensors:
            gathered = t.gather(2, index[:, None, :, None].expand(t.shape[0], t.shape[1], kept, t.shape[3]))
            if inplace:
                t[:, :, lc : lc + kept] = gathered
                out.append(t[:, :, : lc + kept])
            else:
                out.append(torch.cat([t[:, :, :lc], gathered], 2))
    return out[: len(keys)], out[len(keys):]


def _move_rows(tensors: list, keep: torch.Tensor, base, dest: torch.Tensor) -> None:
    """Torch form of the per-row moves: slot ``dest[b] + a`` of each tensor takes slot ``base + max(keep[b, a], 0)``
    (``base``: an int or a device scalar), every kept slot read before any is written."""
    kept = keep.shape[1]
    if not kept:
        return
    index = keep.long().clamp(min=0) + base
    target = dest.long()[:, None] + torch.arange(kept, device=keep.device)[None, :]
    for t in tensors:
        shape = (t.shape[0], t.shape[1], kept, t.shape[3])
        moved = t.gather(2, index[:, None, :, None].expand(shape))
        t.scatter_(2, target[:, None, :, None].expand(shape), moved)


@jit
def _kv_compact_kernel(src_table, dst_table, witness, keep_ptr, dest_ptr, base_ptr, batch, heads, committed, kept,
                       head_dim, stride_sb, stride_sh, stride_sl, stride_sd, stride_db, stride_dh, stride_dl, stride_dd,
                       stride_kb, stride_ka,
                       INPLACE: tl.constexpr, DEST: tl.constexpr, BASE: tl.constexpr, BLOCK_S: tl.constexpr,
                       BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (cache tensor, row, head): copy the committed slots (unless in place), then the kept ones.
    ``BASE``: the first pending slot is read from ``base_ptr`` (a device scalar: a captured step's ``Lc``)."""
    pdl_start(PDL)
    pid = tl.program_id(0).to(tl.int64)
    tensor = pid // (batch * heads)
    row = (pid // heads) % batch
    head = pid % heads
    src = tl.load(src_table + tensor).to(witness.dtype) + row * stride_sb + head * stride_sh
    dst = tl.load(dst_table + tensor).to(witness.dtype) + row * stride_db + head * stride_dh
    dims = tl.arange(0, BLOCK_D)
    dims_ok = dims < head_dim
    if not INPLACE:
        for start in range(0, committed, BLOCK_S):
            slots = start + tl.arange(0, BLOCK_S)
            ok = (slots < committed)[:, None] & dims_ok[None, :]
            x = tl.load(src + slots[:, None] * stride_sl + dims[None, :] * stride_sd, mask=ok)
            tl.store(dst + slots[:, None] * stride_dl + dims[None, :] * stride_dd, x, mask=ok)
    a = tl.arange(0, BLOCK_A)
    a_ok = a < kept
    index = tl.maximum(tl.load(keep_ptr + row * stride_kb + a * stride_ka, mask=a_ok, other=0), 0)
    ok = a_ok[:, None] & dims_ok[None, :]
    if BASE:
        first_pending = tl.load(base_ptr)
    else:
        first_pending = committed
    x = tl.load(src + (first_pending + index)[:, None] * stride_sl + dims[None, :] * stride_sd, mask=ok)
    if INPLACE:
        tl.debug_barrier()  # every kept slot is read before any is overwritten (moves may overlap)
    if DEST:  # per-row destinations (the static cache's dense row ends)
        first = tl.load(dest_ptr + row)
    else:
        first = committed
    tl.store(dst + (first + a)[:, None] * stride_dl + dims[None, :] * stride_dd, x, mask=ok)


def _compact_kv_triton(keys, values, keep, counts, committed_len, inplace, prefix=None, dest=None):
    batch, kept = _check(keys, values, keep, counts, committed_len, inplace, dest)
    tensors = list(keys) + list(values)
    lc = committed_len
    if kept == 0:
        out = [t[:, :, :lc] for t in tensors]
        return out[: len(keys)], out[len(keys):]
    if dest is None and _is_identity(keep, counts, tensors[0].shape[2] - lc, prefix):
        out = [t[:, :, : lc + kept] for t in tensors]
        return out[: len(keys)], out[len(keys):]
    keep = keep.long()
    dest = None if dest is None else dest.long()
    if inplace:
        results = tensors
    else:
        results = [torch.empty(t.shape[0], t.shape[1], lc + kept, t.shape[3], dtype=t.dtype, device=t.device)
                   for t in tensors]
    for group in _groups(tensors, results, inplace):
        _launch(group, keep, dest, batch, lc, kept, inplace)
    if inplace:
        results = [t[:, :, : lc + kept] for t in tensors]
    return results[: len(keys)], results[len(keys):]


class _Group(NamedTuple):
    """Identically laid-out cache tensors (one launch) and their pointer tables."""

    src: list
    src_table: torch.Tensor
    dst_table: torch.Tensor
    src_stride: tuple
    dst_stride: tuple
    heads: int
    head_dim: int


def _groups(tensors: list, results: list, inplace: bool) -> list[_Group]:
    """One group per layout (one for every model with uniform layers)."""
    members: dict[tuple, list[int]] = {}
    for i, t in enumerate(tensors):
        members.setdefault((tuple(t.shape), t.stride(), results[i].stride(), t.dtype, t.device), []).append(i)
    groups = []
    for (shape, src_stride, dst_stride, _, device), idx in members.items():
        src = [tensors[i] for i in idx]
        src_table = pointer_table(src, device)
        dst_table = src_table if inplace else pointer_table([results[i] for i in idx], device)
        groups.append(_Group(src, src_table, dst_table, src_stride, dst_stride, shape[1], shape[3]))
    return groups


def _launch(group: _Group, keep: torch.Tensor, dest: torch.Tensor | None, batch: int, lc: int, kept: int,
            inplace: bool, base: torch.Tensor | None = None) -> None:
    """One launch of the kernel over a group's tensors (``base``: ``Lc`` as a device scalar instead of ``lc``)."""
    block_d = next_pow2(group.head_dim)
    _kv_compact_kernel[(len(group.src) * batch * group.heads,)](
        group.src_table, group.dst_table, group.src[0], keep, keep if dest is None else dest,
        keep if base is None else base, batch, group.heads, lc, kept, group.head_dim, *group.src_stride,
        *group.dst_stride, *keep.stride(),
        INPLACE=inplace, DEST=dest is not None, BASE=base is not None, BLOCK_S=max(1, 2048 // block_d),
        BLOCK_A=next_pow2(kept), BLOCK_D=block_d, **pdl_launch(),
    )


class KVCompactPlan:
    """:func:`compact_kv` with ``inplace=True`` over a fixed set of cache tensors, checked and grouped once.

    A static KV cache (:class:`specdec.static.StaticAdapter`) commits into the same tensors at every step:
    the plan validates them, groups them by layout and builds the pointer tables at construction, so a call
    checks only ``keep`` / ``counts`` / ``dest`` and launches (no per-call walk over every layer, no views
    returned). Same dispatch as :func:`compact_kv`: the kernel on CUDA, :func:`compact_kv_ref` otherwise.

    Args:
        keys: one tensor per layer, ``[B, heads, L, head_dim]``, never reallocated while the plan is used.
        values: one tensor per layer, shaped like ``keys``.

    Example:
        >>> k = torch.arange(6.).reshape(1, 1, 6, 1)
        >>> plan = KVCompactPlan([k], [k.clone()])
        >>> plan(torch.tensor([[0, 2]]), torch.tensor([2]), 2)
        >>> k.flatten().tolist()[:4]
        [0.0, 1.0, 2.0, 4.0]
    """

    def __init__(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]):
        self.keys, self.values = list(keys), list(values)
        if not self.keys:
            raise ValueError("KVCompactPlan: pass at least one layer's keys and values")
        first = self.keys[0]
        empty = torch.zeros(first.shape[0], 0, dtype=torch.long, device=first.device)
        _check(self.keys, self.values, empty, empty.sum(1), 0, True)  # shapes, one batch, one device
        self.batch, self.length = first.shape[0], min(t.shape[2] for t in self.keys + self.values)
        self._groups: list[_Group] | None = None  # built at the first kernel launch (pointer tables on the device)

    def __call__(self, keep: torch.Tensor, counts: torch.Tensor, committed_len: int, *,
                 dest: torch.Tensor | None = None, prefix: bool | None = None) -> None:
        """Move each row's kept pending slots in place, as ``compact_kv(keys, values, keep, counts, committed_len,
        inplace=True, dest=dest, prefix=prefix)`` (without its returned views).

        Args:
            keep: Shape ``[B, A]`` int64, pending indices to keep, ``-1`` padded.
            counts: Shape ``[B]`` int64, real entries of ``keep`` per row.
            committed_len: ``Lc``.
            dest: Shape ``[B]`` int64, per-row destinations (``dest[b] <= Lc``), as in :func:`compact_kv`.
            prefix: as in :func:`compact_kv` (ignored with ``dest``).
        """
        if not isinstance(keep, torch.Tensor) or keep.dim() != 2 or keep.shape[0] != self.batch:
            raise ValueError(f"KVCompactPlan: keep must be a [B, A] int64 tensor with B = {self.batch}")
        kept = keep.shape[1]
        if tuple(counts.shape) != (self.batch,) or (dest is not None and tuple(dest.shape) != (self.batch,)):
            raise ValueError(f"KVCompactPlan: counts (and dest) must have shape [B] = [{self.batch}]")
        if not 0 <= committed_len or committed_len + kept > self.length:
            raise ValueError(f"KVCompactPlan: Lc + A = {committed_len + kept} must lie in [0, L = {self.length}] "
                             f"(keep at most the pending slots)")
        if kept == 0:
            return
        if not use_kernel("compact_kv", keep, counts, self.keys[0]):
            compact_kv_ref(self.keys, self.values, keep, counts, committed_len, inplace=True, prefix=prefix,
                           dest=dest)
            return
        if dest is None and _is_identity(keep, counts, self.length - committed_len, prefix):
            return
        if self._groups is None:
            tensors = self.keys + self.values
            self._groups = _groups(tensors, tensors, True)
        keep = keep.long()
        dest = None if dest is None else dest.long()
        for group in self._groups:
            _launch(group, keep, dest, self.batch, committed_len, kept, True)

    def move_to_ends(self, keep: torch.Tensor, base: torch.Tensor, dest: torch.Tensor) -> None:
        """Move each row's kept pending slots in place to the row's own end, reading ``Lc`` from the device.

        Math, per row ``b`` and ``a < A`` (every layer's keys and values): slot ``dest[b] + a`` takes slot
        ``base + max(keep[b, a], 0)`` (all reads before any write); as ``self(keep, counts, Lc, dest=dest)`` with
        ``Lc = base``, without a host value of ``Lc``: a captured step (a CUDA graph) replays it at every ``Lc``.
        Entries past a row's count are moved too (they land on slots its ``valid`` row marks invalid). No checks
        that need the host: the caller guarantees ``dest[b] + A <= L`` and ``base + P <= L``.

        Args:
            keep: Shape ``[B, A]`` int64, pending indices to keep, ``-1`` padded.
            base: Shape ``[1]`` int64 (device), ``Lc``: the first pending slot.
            dest: Shape ``[B]`` int64 (device), each row's first destination slot (``<= Lc``).
        """
        if keep.dim() != 2 or keep.shape[0] != self.batch or tuple(dest.shape) != (self.batch,) or base.numel() != 1:
            raise ValueError(f"KVCompactPlan.move_to_ends: keep [B, A], dest [B] and base [1] with B = {self.batch}, "
                             f"got {tuple(keep.shape)}, {tuple(dest.shape)}, {tuple(base.shape)}")
        kept = keep.shape[1]
        if kept == 0:
            return
        if not use_kernel("compact_kv", keep, base, dest, self.keys[0]):
            _move_rows(self.keys + self.values, keep, base.long(), dest)
            return
        if self._groups is None:
            tensors = self.keys + self.values
            self._groups = _groups(tensors, tensors, True)
        for group in self._groups:
            _launch(group, keep.long(), dest.long(), self.batch, 0, kept, True, base=base.long())


def compact_kv(
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    keep: torch.Tensor,
    counts: torch.Tensor,
    committed_len: int,
    *,
    inplace: bool = False,
    prefix: bool | None = None,
    dest: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Keep, per row, the committed slots and then the chosen pending slots of every layer (one launch).

    Math (per layer tensor ``t`` of shape ``[B, H, Lc + P, d]``)::

        out[b, h, s]      = t[b, h, s]                             s < Lc
        out[b, h, Lc + a] = t[b, h, Lc + max(keep[b, a], 0)]       a < A

    Slots ``a >= counts[b]`` are padding (they copy pending slot 0, as the reference does; the cache's
    ``committed_valid`` hides them). When every row keeps a prefix of its pending slots (``keep[b, a] == a`` for
    ``a < counts[b]``) the result is ``t[:, :, :Lc + A]``, a view: nothing moves (one host sync decides it, as in
    :meth:`specdec.adapter.ModelAdapter.commit`).

    Dispatch: the kernel when the tensors are on CUDA and triton imports, :func:`compact_kv_ref` otherwise.

    Args:
        keys: one tensor per layer (HF ``cache.layers[i].keys``). Shape: ``[B, heads, L, head_dim]`` each.
        values: one tensor per layer, shaped like ``keys``.
        keep: pending indices to keep, in sequence order, ``-1`` padded (``VerifyResult.accepted_nodes`` cut to
            the widest count).
            Shape: ``[B, A]`` int64.
        counts: real entries of ``keep`` per row. Shape: ``[B]`` int64.
        committed_len: ``Lc``, committed slots before the pending ones.
        inplace: move the kept slots inside the given tensors and return views (``A`` slots of traffic per row and
            head instead of ``Lc + A``). Only when nothing else holds these tensors (HF's ``DynamicCache``
            replaces them on every forward); needs ``Lc + A <= L``.
        prefix: whether every row keeps a prefix of its pending slots, if the caller knows it (``None``: found out
            with one host sync).
        dest: Shape ``[B]`` int64, with ``inplace``: row ``b``'s kept slots go to ``dest[b] + a`` instead of
            ``Lc + a`` (a static cache whose rows end at different slots; ``dest[b] <= Lc``, so every move goes
            left, and nothing is skipped: no host sync). The returned views are ``[:, :, :Lc + A]`` as without it.

    Returns:
        ``(keys, values)``: lists of ``[B, heads, Lc + A, head_dim]`` tensors, in the input order.

    Example:
        >>> k = torch.arange(6.).reshape(1, 1, 6, 1)          # Lc = 2 committed, 4 pending slots
        >>> ks, _ = compact_kv([k], [k.clone()], torch.tensor([[0, 2]]), torch.tensor([2]), 2)
        >>> ks[0].flatten().tolist()
        [0.0, 1.0, 2.0, 4.0]

    References:
        Medusa arXiv 2401.10774 and EAGLE arXiv 2401.15077 (``update_inference_inputs``: gather the accepted
        path's KV entries).
    """
    tensors = list(keys) + list(values) + [keep, counts]
    if use_kernel("compact_kv", *tensors):
        return _compact_kv_triton(keys, values, keep, counts, committed_len, inplace, prefix, dest)
    return compact_kv_ref(keys, values, keep, counts, committed_len, inplace=inplace, prefix=prefix, dest=dest)


def _check_kept(valid: torch.Tensor, ends: torch.Tensor, counts: torch.Tensor, width: int) -> None:
    if valid.dim() != 2 or valid.dtype != torch.bool or tuple(ends.shape) != (valid.shape[0],) \
            or tuple(counts.shape) != (valid.shape[0],) or not 0 <= width <= valid.shape[1]:
        raise ValueError(f"kept_at_ends: valid [B, L] bool, ends [B] and counts [B] with B = valid.shape[0], and "
                         f"0 <= width <= L; got valid {tuple(valid.shape)} {valid.dtype}, ends {tuple(ends.shape)}, "
                         f"counts {tuple(counts.shape)}, width {width}")


def kept_at_ends_ref(valid: torch.Tensor, ends: torch.Tensor, counts: torch.Tensor, width: int) -> None:
    """Reference for :func:`kept_at_ends`, same arguments: a scatter and an add (five torch launches on CUDA)."""
    _check_kept(valid, ends, counts, width)
    if width:
        columns = torch.arange(width, device=valid.device)[None, :]
        valid.scatter_(1, ends[:, None] + columns, columns < counts[:, None])
    ends.add_(counts)


@jit
def _kept_at_ends_kernel(valid_ptr, ends_ptr, counts_ptr, stride_v, width, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = False):
    """Program ``b``: ``valid[b, ends[b] + j] = j < counts[b]`` for ``j < width``, then ``ends[b] += counts[b]``
    (``valid`` as bytes)."""
    pdl_start(PDL)
    b = tl.program_id(0)
    end = tl.load(ends_ptr + b)
    count = tl.load(counts_ptr + b)
    j = tl.arange(0, BLOCK)
    tl.store(valid_ptr + b.to(tl.int64) * stride_v + end + j, (j < count).to(tl.uint8), mask=j < width)
    tl.store(ends_ptr + b, end + count)


def kept_at_ends(valid: torch.Tensor, ends: torch.Tensor, counts: torch.Tensor, width: int) -> None:
    """After each row's kept slots moved to its end (:meth:`KVCompactPlan.move_to_ends`): the row's ``width``
    slots from ``ends`` marked valid up to its count and invalid after, then ``ends += counts``; in place, one
    launch on CUDA (the reference's scatter and add are five), nothing read on the host.

    Math, per row ``b`` and ``j < width``: ``valid[b, ends[b] + j] = j < counts[b]``; ``ends[b] += counts[b]``.
    The caller guarantees ``ends[b] + width <= L``.

    Args:
        valid: Shape ``[B, L]`` bool (written).
        ends: Shape ``[B]`` int64 (written).
        counts: Shape ``[B]`` integer, ``0 <= counts[b] <= width``.
        width: ``A``, the slots written per row.

    Example:
        >>> valid, ends = torch.zeros(2, 6, dtype=torch.bool), torch.tensor([1, 2])
        >>> kept_at_ends(valid, ends, torch.tensor([2, 0]), 3)
        >>> valid.int().tolist(), ends.tolist()
        ([[0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]], [3, 2])
    """
    if not use_kernel("kept_at_ends", valid, ends, counts):
        return kept_at_ends_ref(valid, ends, counts, width)
    _check_kept(valid, ends, counts, width)
    if valid.stride(1) != 1 or ends.dtype != torch.long:
        raise ValueError(f"kept_at_ends: the kernel needs valid unit-stride along L and ends int64, got strides "
                         f"{valid.stride()} and {ends.dtype}")
    counts = counts if counts.dtype == torch.long else counts.long()
    _kept_at_ends_kernel[(valid.shape[0],)](valid.view(torch.uint8), ends, counts, valid.stride(0), width,
                                             BLOCK=next_pow2(max(width, 16)), num_warps=1, **pdl_launch())
