"""Top-k of each row for a small ``k``: the candidates of a dynamic (EAGLE-2) draft tree.

Drafting a dynamic tree takes, at every level, the ``k`` best children of each frontier node (``[B * k, V]`` rows
of draft log-probabilities) and then the ``k`` best of the ``k * k`` candidates. ``torch.topk`` runs these as a
radix selection with one block per row: about 29 us per call on the H200 for ``[10, 4096]`` (7 calls, 206 us of
an EAGLE-3 step's 1.49 ms of GPU time in session 9's profile). Here one program holds a whole row (up to
:data:`TOPK_CHUNK` entries) in registers and takes its maximum ``k`` times. A longer row (a 32,000-token vocabulary)
is cut into chunks of :data:`TOPK_CHUNK`, one program each, whose ``k`` best are merged by a second launch of the
same kernel over the ``chunks * k`` candidates: the k best of the row are among them, and equal values keep
ascending indices (a chunk's candidates precede the next chunk's). Before chunks, such rows ran the reference, a
full sort: about 375 us of a 7B EAGLE-2 step's 7.8 ms of GPU time on the H200 (session 12's profile). Few rows take
narrower chunks (:data:`TOPK_FEW_ROWS_CHUNK`: more programs, shorter loops). Each of the ``k`` picks is one maximum
over int64 keys that pack the value's order (its float32 bits made order-preserving) above the inverted index, so
the largest key is the largest value at its smallest index (session 26: 1.2-1.4 us less per call than a maximum
over the values and then a minimum over the indices holding it, the earlier form, kept behind ``PACKED=False``).

Order: values descending; equal values by ascending index (the order of a stable descending sort, as the reference
and :func:`specdec.trees.grow_dynamic_tree_ref`'s ``(-score, candidate index)`` order). ``-inf`` entries are
ordinary values (they come last). NaN inputs are not supported. A ``-0.0`` entry comes back as ``+0.0`` (equal to
it, so the order is the reference's).

Under ``torch.compile`` the kernel is called as the custom op ``torch.ops.specdec.topk_rows`` (opaque to inductor,
captured inside CUDA graphs like any kernel), so ``generate(fast="compile")`` keeps it.

:func:`log_softmax_topk` is the draft tree's actual question, the ``k`` best *log-probabilities* of each row of
logits: the same launches, the first also keeping each chunk's maximum and sum of exponentials, the last merging
them into the row's log-sum-exp and subtracting it from the ``k`` winners (``torch.log_softmax`` of a 32,000-wide
row in float32 and its cast were ~8 us per level on the H200, besides the top-k's own launches).
"""
from __future__ import annotations

import torch

from ._dispatch import get_kernel_mode, triton_available, use_kernel
from ._triton import as_rows, jit, next_pow2, pdl_launch, pdl_start, tl

__all__ = ["TOPK_CHUNK", "TOPK_MAX_N", "TOPK_MAX_K", "topk_rows", "topk_rows_ref", "log_softmax_topk",
           "log_softmax_topk_ref"]

#: The most entries one program holds; longer rows are cut into chunks of at most this size, merged by more launches.
TOPK_CHUNK = 4096
#: The chunk width for few rows (at most :data:`TOPK_FEW_ROWS`) of at most :data:`TOPK_FEW_ROWS_MAX_N` entries:
#: more, shorter programs. Measured on the H200 (session 26, ``docs/results/fast_s26``, log-softmax + top-10, a
#: chain of 32 calls, packed keys): ``[10, 8192]`` 8.1 -> 7.4 us, ``[1, 8192]`` 7.5 -> 6.6, ``[10, 32000]`` 9.6 ->
#: 9.5; with 40 rows 1,024-wide chunks were slower (9.2 against 8.3).
TOPK_FEW_ROWS_CHUNK = 1024
TOPK_FEW_ROWS = 16
TOPK_FEW_ROWS_MAX_N = 1 << 16
#: The longest row the kernels take (a bound on the merging launches: three at most); longer rows run the reference.
TOPK_MAX_N = 1 << 24
#: The largest ``k`` the kernel takes (one pass over the row per value); larger ``k`` run the reference.
TOPK_MAX_K = 32


def topk_rows_ref(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for :func:`topk_rows`: a stable descending sort, cut to ``k``.

    Args:
        x: Shape ``[..., N]``, floating point, no NaN.
        k: ``1 <= k <= N``.

    Returns:
        ``(values [..., k] in x's dtype, indices [..., k] int64)``: descending, ties by ascending index.
    """
    _check(x, k)
    values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


def topk_rows(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest entries of each row of ``x`` and their indices (see the module docstring).

    The kernel on CUDA (eagerly, inside CUDA graphs, and inside ``torch.compile`` as a custom op) when ``N <=``
    :data:`TOPK_MAX_N` and ``k <=`` :data:`TOPK_MAX_K` (one launch for ``N <=`` :data:`TOPK_CHUNK`, two or three above);
    :func:`topk_rows_ref` otherwise.

    Args:
        x: Shape ``[..., N]``, floating point, no NaN.
        k: ``1 <= k <= N``.

    Returns:
        ``(values [..., k] in x's dtype, indices [..., k] int64)``: descending, ties by ascending index.

    Raises:
        ValueError: ``k`` outside ``[1, N]``, or ``x`` not floating point.
    """
    return _dispatch(x, k, lse=False)


def _dispatch(x: torch.Tensor, k: int, lse: bool,
              index_map: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`topk_rows` (``lse`` False) or :func:`log_softmax_topk` (``index_map``: with ``lse`` only): the kernel
    or the reference."""
    _check(x, k)
    name = "log_softmax_topk" if lse else "topk_rows"

    def ref(x, k):
        return log_softmax_topk_ref(x, k, index_map=index_map) if lse else topk_rows_ref(x, k)

    if x.shape[-1] > TOPK_MAX_N or k > TOPK_MAX_K or x.numel() == 0:
        return ref(x, k)
    mode = get_kernel_mode()
    if mode == "auto":
        if x.is_cuda and triton_available():  # the op under torch.compile (opaque to inductor), else the launcher
            if torch.compiler.is_compiling():
                op = torch.ops.specdec.log_softmax_topk if lse else torch.ops.specdec.topk_rows
                values, indices = op(x, k)
                return values, (indices if index_map is None else index_map[indices].long())
            return _topk_rows_triton(x, k, lse=lse, index_map=index_map)
        return ref(x, k)
    if use_kernel(name, x):  # forced: the kernel (under the interpreter on CPU)
        return _topk_rows_triton(x, k, lse=lse, index_map=index_map)
    return ref(x, k)


def _check(x: torch.Tensor, k: int) -> None:
    if not x.is_floating_point():
        raise ValueError(f"topk_rows: x must be floating point, got {x.dtype}")
    if x.dim() < 1 or not 1 <= int(k) <= x.shape[-1]:
        raise ValueError(f"topk_rows: k must be between 1 and the row length {tuple(x.shape)[-1:]}, got {k}")


@jit
def _topk_rows_kernel(x_ptr, src_ptr, v_ptr, i_ptr, stat_ptr, map_ptr, n, width, stride, n_stats, K: tl.constexpr,
                      BLOCK: tl.constexpr, GATHER: tl.constexpr, STATS: tl.constexpr, LSE: tl.constexpr,
                      MERGE: tl.constexpr, BLOCK_C: tl.constexpr, PACKED: tl.constexpr = True,
                      MAP: tl.constexpr = False, K_PAD: tl.constexpr = 1, PDL: tl.constexpr = False):
    """One program per (row, chunk of ``width <= BLOCK`` entries): the chunk's ``K`` best, written at
    ``[row, chunk, :]``. ``GATHER``: the entries are candidates; write their source indices (``src [row, n]``).
    ``STATS``: also write the chunk's maximum and sum of ``exp(x - max)`` at ``stat [row, chunk, 0:2]``. ``LSE``:
    subtract the row's log-sum-exp from the values written: from this chunk (the whole row), or with ``MERGE``
    from the ``n_stats`` chunks' statistics at ``stat``. ``PACKED``: each pick is one maximum over 64-bit keys
    (:func:`_sort_keys`: the value's order in the high half, the inverted index in the low half) instead of a
    maximum over the values and a minimum over the indices that hold it. ``MAP``: write ``map[index]`` instead of
    the index (the last launch of :func:`log_softmax_topk`'s ``index_map``)."""
    pdl_start(PDL)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    lane = tl.arange(0, BLOCK)
    offs = chunk * width + lane
    inside = (lane < width) & (offs < n)
    x = tl.load(x_ptr + row * stride + offs, mask=inside, other=float("-inf")).to(tl.float32)
    shift = 0.0
    if STATS or (LSE and not MERGE):  # this chunk's maximum and sum of exponentials
        top = tl.max(x, axis=0)
        top = tl.where(top == float("-inf"), 0.0, top)
        total = tl.sum(tl.where(inside, tl.exp(x - top), 0.0), axis=0)
        if STATS:
            tl.store(stat_ptr + (row * tl.num_programs(1) + chunk) * 2, top)
            tl.store(stat_ptr + (row * tl.num_programs(1) + chunk) * 2 + 1, total)
        if LSE:
            shift = top + tl.log(total)
    if LSE and MERGE:  # the row's chunks, merged: M + log(sum_c s_c exp(m_c - M))
        c = tl.arange(0, BLOCK_C)
        m_c = tl.load(stat_ptr + (row * n_stats + c) * 2, mask=c < n_stats, other=float("-inf"))
        s_c = tl.load(stat_ptr + (row * n_stats + c) * 2 + 1, mask=c < n_stats, other=0.0)
        big = tl.max(m_c, axis=0)
        shift = big + tl.log(tl.sum(tl.where(c < n_stats, s_c * tl.exp(m_c - big), 0.0), axis=0))
    out = (row * tl.num_programs(1) + chunk) * K
    if PACKED:
        keys = _sort_keys(x, offs, inside)
    else:
        free = inside  # entries not taken yet (padding never)
    slots = tl.arange(0, K_PAD)
    picks = tl.zeros([K_PAD], tl.int64)
    for j in tl.static_range(K):
        if PACKED:  # the largest key: the largest value at its smallest index
            top = tl.max(keys, axis=0)
            at = (0xFFFFFFFF - (top & 0xFFFFFFFF)).to(tl.int32)
            ordered = (top >> 32).to(tl.int32)
            best = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
        else:
            best = tl.max(tl.where(free, x, float("-inf")), axis=0)
            at = tl.min(tl.where(free & (x == best), offs, n + BLOCK), axis=0)
        tl.store(v_ptr + out + j, (best - shift).to(v_ptr.dtype.element_ty))
        if MAP:  # kept in registers: mapped by one vector read after the loop, not a dependent read per pick
            picks = tl.where(slots == j, at.to(tl.int64), picks)
        else:
            if GATHER:
                index = tl.load(src_ptr + row * n + at)
            else:
                index = at.to(tl.int64)
            tl.store(i_ptr + out + j, index)
        if PACKED:
            keys = tl.where(offs == at, -0x7FFFFFFFFFFFFFFF - 1, keys)
        else:
            free = free & (offs != at)
    if MAP:
        if GATHER:
            picks = tl.load(src_ptr + row * n + picks, mask=slots < K, other=0)
        tl.store(i_ptr + out + slots, tl.load(map_ptr + picks, mask=slots < K, other=0).to(tl.int64), mask=slots < K)


@jit
def _sort_keys(x, offs, inside):
    """int64 keys ordered as ``(x descending, offs ascending)``: the high 32 bits are ``x``'s float32 bits made
    order-preserving as signed integers (negative values' magnitude bits flipped; ``-0.0`` taken as ``+0.0``, equal
    to it), the low 32 bits ``0xFFFFFFFF - offs``; lanes outside ``inside`` get the smallest int64 (padding never
    wins, while ``-inf`` entries stay ordinary values)."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    keys = (ordered.to(tl.int64) << 32) | (0xFFFFFFFF - offs.to(tl.int64))
    return tl.where(inside, keys, -0x7FFFFFFFFFFFFFFF - 1)


def _topk_launch(rows: torch.Tensor, k: int, src: torch.Tensor | None = None, *, lse: bool = False,
                 stats: torch.Tensor | None = None, packed: bool = True, chunk: int | None = None,
                 index_map: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``[R, chunks, k]``: each chunk's k best values and indices (``src``: the candidates' source indices). Chunks
    have equal widths (the last one shorter by less than their number), so each holds at least ``k`` entries.
    ``lse``: float32 log-softmax values: a first launch (``src`` ``None``) of several chunks returns their statistics
    ``[R, chunks, 2]`` for the last launch (one chunk), which subtracts the row's log-sum-exp (from ``stats``).
    ``packed``: the kernel's ``PACKED`` picks; ``chunk``: the chunk width (default :data:`TOPK_CHUNK`); ``index_map``:
    written through it by the last launch (one chunk)."""
    R, n = rows.shape
    chunks = -(-n // (chunk or TOPK_CHUNK))
    width = -(-n // chunks)
    values = torch.empty(R, chunks, k, dtype=torch.float32 if lse else rows.dtype, device=rows.device)
    indices = torch.empty(R, chunks, k, dtype=torch.long, device=rows.device)
    keep = lse and src is None and chunks > 1  # the first launch of a row in chunks: keep their statistics
    new_stats = torch.empty(R, chunks, 2, dtype=torch.float32, device=rows.device) if keep else None
    apply = lse and chunks == 1
    n_stats = stats.shape[1] if apply and stats is not None else 0
    mapped = index_map is not None and chunks == 1
    if R:
        block = next_pow2(width)
        _topk_rows_kernel[(R, chunks)](rows, rows if src is None else src, values, indices,
                                       new_stats if keep else (stats if n_stats else values),
                                       index_map if mapped else indices, n, width, rows.stride(0), n_stats, K=k,
                                       BLOCK=block, GATHER=src is not None, STATS=keep, LSE=apply, MERGE=n_stats > 0,
                                       BLOCK_C=next_pow2(max(n_stats, 1)), PACKED=packed, MAP=mapped,
                                       K_PAD=next_pow2(k) if mapped else 1,
                                       num_warps=8 if block >= 4096 else 4, **pdl_launch())
    return values, indices, new_stats if keep else stats


def _topk_rows_triton(x: torch.Tensor, k: int, lse: bool = False, packed: bool = True, chunk: int | None = None,
                      index_map: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    rows = as_rows(x)
    R = rows.shape[0]
    if chunk is None and R <= TOPK_FEW_ROWS and rows.shape[1] <= TOPK_FEW_ROWS_MAX_N:
        chunk = TOPK_FEW_ROWS_CHUNK
    values, indices, stats = _topk_launch(rows, k, lse=lse, packed=packed, chunk=chunk, index_map=index_map)
    while values.shape[1] > 1:  # chunks: the k best of their candidates (in chunk order, so ties stay ascending)
        values, indices, stats = _topk_launch(values.view(R, -1), k, indices.view(R, -1), lse=lse, stats=stats,
                                              packed=packed, chunk=chunk, index_map=index_map)
    lead = tuple(x.shape[:-1])
    return values.view(*lead, k), indices.view(*lead, k)


def log_softmax_topk_ref(logits: torch.Tensor, k: int, *,
                         index_map: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for :func:`log_softmax_topk` (same arguments and result):
    ``topk_rows_ref(torch.log_softmax(logits.float(), -1), k)``, the indices then read through ``index_map``."""
    _check(logits, k)
    _check_map(logits, index_map)
    values, indices = topk_rows_ref(torch.log_softmax(logits.float(), dim=-1), k)
    return values, (indices if index_map is None else index_map[indices].long())


def _check_map(x: torch.Tensor, index_map: torch.Tensor | None) -> None:
    if index_map is not None and (not isinstance(index_map, torch.Tensor) or index_map.dim() != 1
                                  or index_map.shape[0] != x.shape[-1] or index_map.dtype not in (torch.int32,
                                                                                                     torch.int64)
                                  or index_map.device != x.device):
        raise ValueError(f"log_softmax_topk: index_map must be an int32/int64 vector of the row length "
                         f"[{x.shape[-1]}] on {x.device}, got {getattr(index_map, 'dtype', type(index_map))} "
                         f"{tuple(getattr(index_map, 'shape', ()))}")


def log_softmax_topk(logits: torch.Tensor, k: int, *,
                     index_map: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest log-probabilities of each row of ``logits`` and their indices, without the
    ``[..., V]`` log-softmax tensor: on CUDA the top-k kernel's launches (see the module docstring) with the rows'
    log-sum-exp merged from the chunks' statistics; :func:`log_softmax_topk_ref` elsewhere (and where
    :func:`topk_rows` would take the reference).

    .. math::
        \\log p_i = x_i - \\log \\textstyle\\sum_j e^{x_j}

    The order is the logits' (descending, equal logits by ascending index); the values agree with the reference's
    to float32 rounding (the log-sum-exp is summed chunk by chunk).

    Args:
        logits: Shape ``[..., V]``, floating point, no NaN.
        k: ``1 <= k <= V``.
        index_map: Shape ``[V]`` int64 (or int32), or ``None``: return ``index_map[indices]`` instead of the
            indices, read inside the last launch (a draft vocabulary's target ids: no gather of its own).

    Returns:
        ``(log-probabilities [..., k] float32, indices [..., k] int64)``.
    """
    _check_map(logits, index_map)
    return _dispatch(logits, k, lse=True, index_map=index_map)


if triton_available():
    @torch.library.custom_op("specdec::log_softmax_topk", mutates_args=())
    def _log_softmax_topk_op(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _topk_rows_triton(logits, k, lse=True)

    @_log_softmax_topk_op.register_fake
    def _(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        lead = tuple(logits.shape[:-1])
        return logits.new_empty(*lead, k, dtype=torch.float32), logits.new_empty(*lead, k, dtype=torch.long)

    @torch.library.custom_op("specdec::topk_rows", mutates_args=())
    def _topk_rows_op(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _topk_rows_triton(x, k)

    @_topk_rows_op.register_fake
    def _(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        lead = tuple(x.shape[:-1])
        return x.new_empty(*lead, k), x.new_empty(*lead, k, dtype=torch.long)
