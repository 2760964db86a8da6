"""After verification, in one launch each: the tokens a step emits (vLLM's ``[B, D + 1]``, ``-1``-padded layout),
and the drafter's feedback (its rows and the target's features at the accepted nodes, :func:`accepted_feedback`).

Math: row ``b`` emits ``tokens[b, accepted_nodes[b, j] - 1]`` for ``j = 1..num_accepted[b]`` (the accepted drafts,
in path order), then ``next_tokens[b]`` (the bonus or recovered token); the columns after those ``num_accepted[b]
+ 1`` hold ``-1``. The reference is the torch code :func:`specdec.verify.emitted_tokens` ran before (a gather, a
pad column, two ``where``s: about a dozen launches); the kernel is one program per row.

References:
    vLLM v1 rejection sampler (``vllm/v1/sample/rejection_sampler.py``): the glossary (accepted, recovered, bonus
    tokens) and the ``[B, K + 1]`` output with ``-1`` placeholders.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ._dispatch import use_kernel
from ._triton import jit, next_pow2, pdl_launch, pdl_start, tl

__all__ = ["emitted_tokens", "emitted_tokens_ref", "accepted_feedback", "accepted_feedback_ref", "FeedbackRows",
           "sanitised_ids", "sanitised_ids_ref", "packed_tokens", "packed_tokens_ref"]


def _check(draft_tokens, accepted_nodes, num_accepted, next_tokens) -> tuple[int, int]:
    if draft_tokens.dim() != 2 or accepted_nodes.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, N] and accepted_nodes [B, D + 1], got "
                         f"{tuple(draft_tokens.shape)} and {tuple(accepted_nodes.shape)}")
    batch, width = accepted_nodes.shape
    if width < 1 or draft_tokens.shape[0] != batch or tuple(num_accepted.shape) != (batch,) \
            or tuple(next_tokens.shape) != (batch,):
        raise ValueError(f"emitted_tokens needs accepted_nodes [B, D + 1] with D + 1 >= 1 and num_accepted, "
                         f"next_tokens [B] for the B = {batch} rows of draft_tokens; got accepted_nodes "
                         f"{tuple(accepted_nodes.shape)}, num_accepted {tuple(num_accepted.shape)}, next_tokens "
                         f"{tuple(next_tokens.shape)} (pass a VerifyResult's fields as they are)")
    return batch, width


def emitted_tokens_ref(draft_tokens: torch.Tensor, accepted_nodes: torch.Tensor, num_accepted: torch.Tensor,
                       next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for :func:`emitted_tokens` (same signature and result).

    Args:
        draft_tokens: Shape ``[B, N]``, the draft's tokens (node ``i`` holds ``draft_tokens[:, i - 1]``).
        accepted_nodes: Shape ``[B, D + 1]``, the accepted path as node indices (root first), ``-1`` padded.
        num_accepted: Shape ``[B]``, accepted drafts per row.
        next_tokens: Shape ``[B]``, the bonus or recovered token per row.

    Returns:
        ``(tokens [B, D + 1], counts [B] = num_accepted + 1)``, ``tokens`` ``-1`` after each row's count.
    """
    _check(draft_tokens, accepted_nodes, num_accepted, next_tokens)
    nodes = accepted_nodes[:, 1:]
    on_path = nodes > 0
    node_tokens = draft_tokens.gather(1, (nodes - 1).clamp_min(0)) if draft_tokens.shape[1] else nodes.clone()
    node_tokens = torch.where(on_path, node_tokens, torch.full_like(node_tokens, -1))
    # The next token's column: built from the row count, not from node_tokens, which has no columns for D = 0.
    tokens = torch.cat([node_tokens, node_tokens.new_full((node_tokens.shape[0], 1), -1)], dim=1)
    column = torch.arange(tokens.shape[1], device=tokens.device)[None]
    count = num_accepted[:, None]
    tokens = torch.where(column == count, next_tokens[:, None].to(tokens.dtype), tokens)
    tokens = torch.where(column > count, torch.full_like(tokens, -1), tokens)
    return tokens, num_accepted + 1


@jit
def _emit_kernel(tokens_ptr, path_ptr, num_ptr, next_ptr, out_ptr, count_ptr, width,
                 stride_tb, stride_tn, stride_pb, stride_pn, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """One row: column j < n takes the token of path node j + 1, column n the next token, later columns -1."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    n = tl.load(num_ptr + row)
    nxt = tl.load(next_ptr + row)
    node = tl.load(path_ptr + row * stride_pb + (cols + 1) * stride_pn, mask=cols + 1 < width, other=0)
    take = (cols < n) & (node > 0)
    token = tl.load(tokens_ptr + row * stride_tb + (node - 1) * stride_tn, mask=take, other=-1)
    out = tl.where(cols == n, nxt, tl.where(cols < n, token, -1))
    tl.store(out_ptr + row * width + cols, out, mask=cols < width)
    tl.store(count_ptr + row, n + 1)


def _emitted_tokens_triton(draft_tokens, accepted_nodes, num_accepted, next_tokens):
    batch, width = _check(draft_tokens, accepted_nodes, num_accepted, next_tokens)
    dtype = draft_tokens.dtype if draft_tokens.shape[1] else accepted_nodes.dtype
    if num_accepted.dtype == dtype:  # one allocation: [B, D + 1] tokens, then [B] counts (contiguous views)
        flat = torch.empty(batch * (width + 1), dtype=dtype, device=accepted_nodes.device)
        tokens, counts = flat[:batch * width].view(batch, width), flat[batch * width:]
    else:
        tokens = torch.empty(batch, width, dtype=dtype, device=accepted_nodes.device)
        counts = torch.empty_like(num_accepted)
    if batch:
        source = draft_tokens if draft_tokens.shape[1] else accepted_nodes  # never read when N = 0
        _emit_kernel[(batch,)](  # [B] inputs indexed densely
            source, accepted_nodes, num_accepted.contiguous(), next_tokens.to(dtype).contiguous(), tokens, counts,
            width,
            source.stride(0), source.stride(1), accepted_nodes.stride(0), accepted_nodes.stride(1),
            BLOCK=next_pow2(width), **pdl_launch(),
        )
    return tokens, counts


def emitted_tokens(draft_tokens: torch.Tensor, accepted_nodes: torch.Tensor, num_accepted: torch.Tensor,
                   next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens each row emits after verification: its accepted drafts, then the next token (one launch on CUDA).

    Math: ``tokens[b, j] = draft_tokens[b, accepted_nodes[b, j + 1] - 1]`` for ``j < num_accepted[b]``,
    ``tokens[b, num_accepted[b]] = next_tokens[b]``, ``-1`` after.

    Args:
        draft_tokens: Shape ``[B, N]`` int64, the draft's tokens.
        accepted_nodes: Shape ``[B, D + 1]`` int64, the accepted path (``VerifyResult.accepted_nodes``).
        num_accepted: Shape ``[B]`` int64 (``VerifyResult.num_accepted``).
        next_tokens: Shape ``[B]`` int64 (``VerifyResult.next_tokens``).

    Returns:
        ``(tokens [B, D + 1], counts [B])``, ``counts = num_accepted + 1``.

    Raises:
        ValueError: shapes that do not fit together (the message names them).

    Example:
        >>> emitted_tokens(torch.tensor([[5, 6]]), torch.tensor([[0, 1, -1]]), torch.tensor([1]),
        ...                torch.tensor([9]))[0].tolist()
        [[5, 9, -1]]
    """
    if use_kernel("emitted_tokens", draft_tokens, accepted_nodes, num_accepted, next_tokens):
        return _emitted_tokens_triton(draft_tokens, accepted_nodes, num_accepted, next_tokens)
    return emitted_tokens_ref(draft_tokens, accepted_nodes, num_accepted, next_tokens)


# ----------------------------------------------------------------------------------------------------------------
# The drafter's feedback rows of a verified step (and the target features at the accepted nodes)
# ----------------------------------------------------------------------------------------------------------------

_FEATURES_PER_LAUNCH = 4  # feature pointers of one launch; more feature tensors (or other layouts) take more launches


class FeedbackRows(NamedTuple):
    """What :func:`accepted_feedback` returns: the fields of a drafter's ``Feedback`` after a verified step.

    A named tuple: it unpacks as ``committed, next_tokens, positions, valid, features``.

    Attributes:
        committed: Shape ``[B, W]`` (``tokens``' dtype), the root then the emitted tokens (clamped at 0).
        next_tokens: Shape ``[B, W]`` (``tokens``' dtype), the token after each (clamped at 0).
        positions: Shape ``[B, W]`` (``lengths``' dtype), ``lengths + j``.
        valid: Shape ``[B, W]`` bool, ``j < keep_counts``.
        features: a tuple of ``F`` tensors ``[B, W, H_i]``, one per feature tensor given (its dtype): the target's
            features at the accepted nodes; ``()`` without features.
    """

    committed: torch.Tensor
    next_tokens: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    features: tuple = ()


def _check_feedback(roots, tokens, keep_counts, lengths, width, features, nodes) -> int:
    batch = tokens.shape[0] if tokens.dim() == 2 else -1
    if batch < 0 or tuple(roots.shape) != (batch,) or tuple(keep_counts.shape) != (batch,) \
            or tuple(lengths.shape) != (batch,):
        raise ValueError(f"accepted_feedback needs tokens [B, D + 1] and roots, keep_counts, lengths [B]; got tokens "
                         f"{tuple(tokens.shape)}, roots {tuple(roots.shape)}, keep_counts {tuple(keep_counts.shape)}, "
                         f"lengths {tuple(lengths.shape)}")
    if not 0 <= width <= tokens.shape[1]:
        raise ValueError(f"width must lie in [0, D + 1] = [0, {tokens.shape[1]}] (the widest kept path), got {width}")
    if features:
        if nodes is None or nodes.dim() != 2 or nodes.shape[0] != batch or nodes.shape[1] < width \
                or nodes.dtype.is_floating_point:
            raise ValueError(f"accepted_feedback: with features, nodes must be the accepted path [B = {batch}, >= W = "
                             f"{width}] of integer node indices, got "
                             f"{None if nodes is None else (tuple(nodes.shape), nodes.dtype)}")
        for i, f in enumerate(features):
            if f.dim() != 3 or f.shape[0] != batch or f.device != nodes.device:
                raise ValueError(f"accepted_feedback: features[{i}] must be [B = {batch}, N, H] on {nodes.device} "
                                 f"(one tensor per feature layer, as ForwardOutput.features), got {tuple(f.shape)} "
                                 f"on {f.device}")
    return batch


def accepted_feedback_ref(roots: torch.Tensor, tokens: torch.Tensor, keep_counts: torch.Tensor,
                          lengths: torch.Tensor, width: int, features=(), nodes: torch.Tensor | None = None
                          ) -> FeedbackRows:
    """Reference for :func:`accepted_feedback` (same signature and result): the code ``step()`` ran before (the
    rows' torch ops, then one gather per feature tensor).

    Args:
        roots: Shape ``[B]``, each row's root (the token the step's forward started from).
        tokens: Shape ``[B, D + 1]``, the emitted tokens (:func:`emitted_tokens`), ``-1`` padded.
        keep_counts: Shape ``[B]``, tokens each row commits (root + accepted drafts; 0 for inactive rows).
        lengths: Shape ``[B]``, each row's position of the root (the committed length before the step).
        width: ``W``, the widest kept path (columns of the outputs).
        features: ``F`` tensors ``[B, N, H_i]``, the target's features at the step's ``N`` nodes (or none).
        nodes: Shape ``[B, >= W]`` int64, the accepted path's node indices, ``-1`` padded (with ``features``).

    Returns:
        :class:`FeedbackRows`, each row field ``[B, W]``, ``features`` ``F`` tensors ``[B, W, H_i]``.
    """
    features = tuple(features)
    _check_feedback(roots, tokens, keep_counts, lengths, width, features, nodes)
    columns = torch.arange(width, device=tokens.device)[None, :]
    committed = torch.cat([roots[:, None].to(tokens.dtype), tokens], 1)[:, :width].clamp_(min=0)
    feats = ()
    if features:
        index = nodes[:, :width].clamp(min=0)[:, :, None]
        feats = tuple(f.gather(1, index.expand(-1, -1, f.shape[-1])) for f in features)
    return FeedbackRows(committed, tokens[:, :width].clamp(min=0), lengths[:, None] + columns,
                        columns < keep_counts[:, None], feats)


@jit
def _feedback_kernel(roots_ptr, tokens_ptr, counts_ptr, lengths_ptr, committed_ptr, next_ptr, positions_ptr,
                     valid_ptr, nodes_ptr, f0, f1, f2, f3, out_ptr, width, hidden, stride_tb, stride_tn, stride_nb,
                     stride_nw, stride_fb, stride_fn, stride_fh, plane,
                     ROWS: tl.constexpr, NUM: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (row, column): the feedback entry (``ROWS``) and its node's vector from ``NUM`` features."""
    pdl_start(PDL)
    pid = tl.program_id(0).to(tl.int64)
    row = pid // width
    col = pid % width
    if ROWS:
        base = tokens_ptr + row * stride_tb
        here = tl.load(base + col * stride_tn)
        before = tl.load(base + (col - 1) * stride_tn, mask=col >= 1, other=0)
        committed = tl.where(col == 0, tl.load(roots_ptr + row), before)
        tl.store(committed_ptr + pid, tl.maximum(committed, 0))
        tl.store(next_ptr + pid, tl.maximum(here, 0))
        tl.store(positions_ptr + pid, tl.load(lengths_ptr + row) + col)
        tl.store(valid_ptr + pid, (col < tl.load(counts_ptr + row)).to(tl.int8))
    if NUM > 0:
        node = tl.maximum(tl.load(nodes_ptr + row * stride_nb + col * stride_nw), 0)
        src = row * stride_fb + node * stride_fn
        dst = out_ptr + pid * hidden
        for start in range(0, hidden, BLOCK_H):
            h = start + tl.arange(0, BLOCK_H)
            ok = h < hidden
            tl.store(dst + h, tl.load(f0 + src + h * stride_fh, mask=ok), mask=ok)
            if NUM > 1:
                tl.store(dst + plane + h, tl.load(f1 + src + h * stride_fh, mask=ok), mask=ok)
            if NUM > 2:
                tl.store(dst + 2 * plane + h, tl.load(f2 + src + h * stride_fh, mask=ok), mask=ok)
            if NUM > 3:
                tl.store(dst + 3 * plane + h, tl.load(f3 + src + h * stride_fh, mask=ok), mask=ok)


def _accepted_feedback_triton(roots, tokens, keep_counts, lengths, width, features=(), nodes=None):
    features = tuple(features)
    batch = _check_feedback(roots, tokens, keep_counts, lengths, width, features, nodes)
    device = tokens.device
    if lengths.dtype == tokens.dtype:  # one allocation for the three integer outputs (contiguous views)
        committed, next_tokens, positions = torch.empty(3, batch, width, dtype=tokens.dtype, device=device).unbind(0)
    else:
        committed = torch.empty(batch, width, dtype=tokens.dtype, device=device)
        next_tokens = torch.empty_like(committed)
        positions = torch.empty(batch, width, dtype=lengths.dtype, device=device)
    valid = torch.empty(batch, width, dtype=torch.bool, device=device)
    # Feature tensors of one layout share launches, four at a time; the first launch also writes the rows.
    launches: list[tuple[list[int], torch.Tensor | None]] = []
    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(features):
        groups.setdefault((tuple(f.shape), f.stride(), f.dtype), []).append(i)
    out: list = [None] * len(features)
    for (shape, _, dtype), members in groups.items():
        stacked = torch.empty(len(members), batch, width, shape[2], dtype=dtype, device=device)
        for j, i in enumerate(members):
            out[i] = stacked[j]
        for start in range(0, len(members), _FEATURES_PER_LAUNCH):
            launches.append((members[start:start + _FEATURES_PER_LAUNCH], stacked[start]))
    if not launches:
        launches.append(([], None))
    if batch and width:
        # the kernel indexes the [B] inputs densely: a strided view (e.g. a column of a captured step's input) is
        # copied first (a no-op for the usual contiguous ones)
        roots_t = roots.to(tokens.dtype).contiguous()
        keep_counts, lengths = keep_counts.contiguous(), lengths.contiguous()
        for n, (chunk, dst) in enumerate(launches):
            srcs = [features[i] for i in chunk]
            f = srcs[0] if srcs else tokens  # never read without features (NUM = 0)
            srcs += [f] * (_FEATURES_PER_LAUNCH - len(srcs))
            path = nodes if nodes is not None else tokens
            hidden = f.shape[2] if chunk else 1
            _feedback_kernel[(batch * width,)](
                roots_t, tokens, keep_counts, lengths, committed, next_tokens, positions, valid.view(torch.int8),
                path, *srcs, committed if dst is None else dst, width, hidden, tokens.stride(0), tokens.stride(1),
                path.stride(0), path.stride(1), *(f.stride() if chunk else (0, 0, 0)), batch * width * hidden,
                ROWS=n == 0, NUM=len(chunk), BLOCK_H=min(1024, next_pow2(hidden)), **pdl_launch(),
            )
    return FeedbackRows(committed, next_tokens, positions, valid, tuple(out))


def accepted_feedback(roots: torch.Tensor, tokens: torch.Tensor, keep_counts: torch.Tensor, lengths: torch.Tensor,
                      width: int, features=(), nodes: torch.Tensor | None = None) -> FeedbackRows:
    """The drafter's feedback after a verified step, its rows and the target features at the accepted nodes, in one
    launch on CUDA.

    Math, per row ``b`` and column ``j < W``: ``committed[b, j]`` = the root for ``j = 0``, else ``tokens[b, j - 1]``;
    ``next_tokens[b, j] = tokens[b, j]`` (both clamped at 0: ``-1`` padding becomes a harmless id);
    ``positions[b, j] = lengths[b] + j``; ``valid[b, j] = j < keep_counts[b]``; and per feature tensor ``i``,
    ``result.features[i][b, j] = features[i][b, max(nodes[b, j], 0)]`` (``-1`` padding reads node 0). One program
    per (row, column); feature tensors of one shape, strides and dtype share a launch, four at a time (more
    tensors, or other layouts, take more launches; the first also writes the rows).

    Args:
        roots: Shape ``[B]`` int64.
        tokens: Shape ``[B, D + 1]`` int64, the emitted tokens, ``-1`` padded.
        keep_counts: Shape ``[B]`` int64, tokens each row commits.
        lengths: Shape ``[B]`` int64, the root's position per row.
        width: ``W <= D + 1``, the widest kept path.
        features: a sequence of ``F`` tensors ``[B, N, H_i]`` on ``nodes``' device (``ForwardOutput.features``),
            or none.
        nodes: Shape ``[B, >= W]`` int64, the accepted path's node indices in ``[0, N)``, ``-1`` padded; its first
            ``W`` columns are read. Needed with ``features``, ignored without.

    Returns:
        :class:`FeedbackRows`: ``committed``, ``next_tokens``, ``positions``, ``valid`` each ``[B, W]``
        (``valid`` bool), ``features`` a tuple of ``F`` tensors ``[B, W, H_i]`` (contiguous; ``()`` without
        features).

    Raises:
        ValueError: shapes, ``width``, ``nodes`` or feature devices that do not fit (the message names them).

    Example:
        >>> c, n, p, v, f = accepted_feedback(torch.tensor([7]), torch.tensor([[5, 9, -1]]), torch.tensor([2]),
        ...                                   torch.tensor([10]), 2, [torch.arange(6.).view(1, 3, 2)],
        ...                                   torch.tensor([[0, 2, -1]]))
        >>> c.tolist(), n.tolist(), p.tolist(), v.tolist(), f[0].tolist()
        ([[7, 5]], [[5, 9]], [[10, 11]], [[True, True]], [[[0.0, 1.0], [4.0, 5.0]]])
    """
    features = tuple(features)
    if use_kernel("accepted_feedback", roots, tokens, keep_counts, lengths, *features):
        return _accepted_feedback_triton(roots, tokens, keep_counts, lengths, width, features, nodes)
    return accepted_feedback_ref(roots, tokens, keep_counts, lengths, width, features, nodes)


# ----------------------------------------------------------------------------------------------------------------
# The fast path's verify step around the verification: draft ids clamped into the vocabulary; the host's copy packed
# ----------------------------------------------------------------------------------------------------------------


def _check_ids(tokens, parents, vocab) -> None:
    if tokens.dim() != 2 or parents.dim() != 2 or parents.shape != (tokens.shape[0], tokens.shape[1] + 1) \
            or tokens.dtype.is_floating_point or parents.dtype.is_floating_point or not isinstance(vocab, int) \
            or vocab < 1:
        raise ValueError(f"sanitised_ids: tokens [B, N] and parents [B, N + 1] integer (Draft.tokens, "
                         f"Draft.parents) and an int vocab >= 1; got tokens {tuple(tokens.shape)} {tokens.dtype}, "
                         f"parents {tuple(parents.shape)} {parents.dtype}, vocab {vocab!r}")


def sanitised_ids_ref(tokens: torch.Tensor, parents: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for :func:`sanitised_ids` (same arguments and results): a clamp, two compares and an ``and``."""
    _check_ids(tokens, parents, vocab)
    clamped = tokens.clamp(0, vocab - 1)
    return clamped, (clamped != tokens) & (parents[:, 1:] >= 0)  # clamping moved exactly the ids outside [0, V)


@jit
def _sanitise_kernel(tokens_ptr, parents_ptr, out_ptr, bad_ptr, N, vocab, stride_t, stride_p, stride_o, stride_b,
                     BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Program ``b``: ``out[b] = clamp(tokens[b], 0, vocab - 1)``, ``bad[b] = moved & parents[b, 1:] >= 0``."""
    pdl_start(PDL)
    b = tl.program_id(0)
    j = tl.arange(0, BLOCK)
    inside = j < N
    t = tl.load(tokens_ptr + b * stride_t + j, mask=inside, other=0)
    parent = tl.load(parents_ptr + b * stride_p + 1 + j, mask=inside, other=-1)
    clamped = tl.minimum(tl.maximum(t, 0), vocab - 1)
    tl.store(out_ptr + b * stride_o + j, clamped, mask=inside)
    tl.store(bad_ptr + b * stride_b + j, ((clamped != t) & (parent >= 0)).to(tl.uint8), mask=inside)


def sanitised_ids(tokens: torch.Tensor, parents: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A draft's ids clamped into ``[0, vocab)``, and which present drafts held an id outside it; one launch on
    CUDA (the reference's clamp, compares and ``and`` are four), nothing read on the host.

    Math: ``clamped = clamp(tokens, 0, vocab - 1)``; ``bad[b, i] = clamped[b, i] != tokens[b, i] and
    parents[b, i + 1] >= 0`` (node ``i + 1`` holds ``tokens[:, i]``; absent nodes are never bad).

    Args:
        tokens: Shape ``[B, N]`` int64 (other integer types: the reference), a draft's tokens.
        parents: Shape ``[B, N + 1]`` int64, its parents (``-1``: none; node 0 is the root).
        vocab: the target's vocabulary size.

    Returns:
        ``(clamped [B, N] int64, bad [B, N] bool)``.

    Example:
        >>> clamped, bad = sanitised_ids(torch.tensor([[5, -2, 9]]), torch.tensor([[-1, 0, 0, -1]]), 8)
        >>> clamped.tolist(), bad.int().tolist()
        ([[5, 0, 7]], [[0, 1, 0]])
    """
    if not use_kernel("sanitised_ids", tokens, parents) or tokens.dtype != torch.long or parents.dtype != torch.long:
        return sanitised_ids_ref(tokens, parents, vocab)
    _check_ids(tokens, parents, vocab)
    tokens = tokens if tokens.stride(1) == 1 else tokens.contiguous()
    parents = parents if parents.stride(1) == 1 else parents.contiguous()
    batch, n = tokens.shape
    clamped = torch.empty_like(tokens, memory_format=torch.contiguous_format)
    bad = torch.empty(batch, n, dtype=torch.bool, device=tokens.device)
    if batch and n:
        _sanitise_kernel[(batch,)](tokens, parents, clamped, bad.view(torch.uint8), n, vocab, tokens.stride(0),
                                   parents.stride(0), clamped.stride(0), bad.stride(0), BLOCK=next_pow2(n),
                                   num_warps=1, **pdl_launch())
    return clamped, bad


def packed_tokens_ref(counts: torch.Tensor, tokens: torch.Tensor, bad: torch.Tensor | None) -> torch.Tensor:
    """Reference for :func:`packed_tokens` (same arguments and result): a concatenation."""
    return torch.cat([counts[:, None].long(), tokens] + ([bad.long()] if bad is not None else []), 1)


@jit
def _pack_kernel(counts_ptr, tokens_ptr, bad_ptr, out_ptr, T, N, stride_t, stride_b, stride_o, HAS_BAD: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False):
    """Program ``b``: ``out[b] = [counts[b], tokens[b, :T], bad[b, :N]]``."""
    pdl_start(PDL)
    b = tl.program_id(0)
    row = out_ptr + b * stride_o
    tl.store(row, tl.load(counts_ptr + b).to(tl.int64))
    t = tl.arange(0, BLOCK_T)
    tl.store(row + 1 + t, tl.load(tokens_ptr + b * stride_t + t, mask=t < T), mask=t < T)
    if HAS_BAD:
        i = tl.arange(0, BLOCK_N)
        flags = tl.load(bad_ptr + b * stride_b + i, mask=i < N, other=0)
        tl.store(row + 1 + T + i, flags.to(tl.int64), mask=i < N)


def packed_tokens(counts: torch.Tensor, tokens: torch.Tensor, bad: torch.Tensor | None) -> torch.Tensor:
    """What a late tree step copies to the host, in one tensor: per row its count, its emitted tokens, then its
    draft ids' bad flags (one launch on CUDA: the reference's cast and concatenation are two).

    Args:
        counts: Shape ``[B]`` integer, tokens emitted per row.
        tokens: Shape ``[B, T]`` int64, the emitted tokens (:func:`emitted_tokens`).
        bad: Shape ``[B, N]`` bool (:func:`sanitised_ids`), or ``None``.

    Returns:
        Shape ``[B, 1 + T (+ N)]`` int64.

    Example:
        >>> packed_tokens(torch.tensor([2]), torch.tensor([[4, 7, -1]]), torch.tensor([[False, True]])).tolist()
        [[2, 4, 7, -1, 0, 1]]
    """
    if tokens.dim() != 2 or tokens.dtype != torch.long or tuple(counts.shape) != (tokens.shape[0],) or (
            bad is not None and (bad.dim() != 2 or bad.dtype != torch.bool or bad.shape[0] != tokens.shape[0])):
        raise ValueError(f"packed_tokens: counts [B], tokens [B, T] int64 and bad [B, N] bool or None; got counts "
                         f"{tuple(counts.shape)}, tokens {tuple(tokens.shape)} {tokens.dtype}, bad "
                         f"{None if bad is None else (tuple(bad.shape), bad.dtype)}")
    if not use_kernel("packed_tokens", counts, tokens, *([] if bad is None else [bad])):
        return packed_tokens_ref(counts, tokens, bad)
    tokens = tokens if tokens.stride(1) == 1 else tokens.contiguous()
    bad = bad if bad is None or bad.stride(1) == 1 else bad.contiguous()
    batch, t = tokens.shape
    n = 0 if bad is None else bad.shape[1]
    out = torch.empty(batch, 1 + t + n, dtype=torch.long, device=tokens.device)
    if batch:
        flags = bad.view(torch.uint8) if bad is not None else tokens
        _pack_kernel[(batch,)](counts, tokens, flags, out, t, n, tokens.stride(0), flags.stride(0), out.stride(0),
                               HAS_BAD=bad is not None, BLOCK_T=next_pow2(max(t, 1)), BLOCK_N=next_pow2(max(n, 1)),
                               num_warps=1, **pdl_launch())
    return out
