"""Prompt lookup's draft in one launch: the n-gram search over each row's committed tokens and the chain it proposes.

Math: row ``b``'s sequence is ``s = history[b, :L_b] + [root_b]`` (``L_b = lengths[b]``). For ``n`` from
``max_ngram_size`` down to ``min_ngram_size``, the suffix ``s[-n:]`` is looked for among the earlier windows
``s[i : i + n]`` (``i + n < len(s)``); the first ``n`` with a match wins, its most recent match (largest ``i``; or
the first, ``most_recent=False``) gives the continuation ``s[i + n : i + n + K]`` (cut at the sequence's end), and
the draft is that continuation as a chain: node ``j`` (1-based) has parent ``j - 1`` and depth ``j`` while ``j <=
count``, and is absent (parent ``-1``, depth 0, token 0) after.

The reference, :func:`ngram_chain_ref`, is the torch code prompt lookup ran before (a copy of the history with the
root written in, :func:`find_ngram_continuations`: about 18 launches per ``n``, then the chain's layout): some 60-70
launches a step. The kernel runs one program per row: one pass over the window ends ``e`` (a window of length ``n``
ending at ``e`` matches when ``s[e - d] == s[-1 - d]`` for ``d < n``, so every ``n`` is checked in the same pass, each
longer one extending the shorter one's match) keeps the best end per ``n``, then writes the chain.

References:
    Saxena, "Prompt Lookup Decoding" (2023), https://github.com/apoorvumang/prompt-lookup-decoding; vLLM's n-gram
    proposer (the same search on the host, with numpy).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ._dispatch import use_kernel
from ._triton import jit, next_pow2, pdl_launch, pdl_start, tl

__all__ = ["NgramChain", "ngram_chain", "ngram_chain_ref", "chain_layout", "find_ngram_continuations",
           "find_ngram_continuations_ref", "NGRAM_BLOCK"]

#: Window ends one program compares at a time.
NGRAM_BLOCK = 256


class NgramChain(NamedTuple):
    """What :func:`ngram_chain` returns: a chain draft's fields and the proposal's length.

    Attributes:
        tokens: Shape ``[B, K]`` int64, the continuation left-aligned, 0 after ``counts``.
        counts: Shape ``[B]`` int64, tokens found per row (0: no match, or an inactive row).
        parents: Shape ``[B, K + 1]`` int64, node ``j``'s parent ``j - 1`` while ``1 <= j <= counts``, else ``-1``.
        depths: Shape ``[B, K + 1]`` int64, ``j`` while ``1 <= j <= counts``, else 0.
    """

    tokens: torch.Tensor
    counts: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor


def chain_layout(tokens: torch.Tensor, counts: torch.Tensor) -> NgramChain:
    """The chain of ``counts[b]`` present nodes per row (torch ops): ``tokens [B, W]`` masked to 0 after the count,
    parents and depths ``[B, W + 1]`` as :class:`NgramChain` describes."""
    width = tokens.shape[1]
    nodes = torch.arange(width + 1, device=tokens.device)
    present = (nodes[None, :] <= counts[:, None]) & (nodes[None, :] > 0)
    return NgramChain(torch.where(present[:, 1:], tokens, 0), counts, torch.where(present, nodes - 1, -1),
                      torch.where(present, nodes, 0))


def find_ngram_continuations(
    sequences: torch.Tensor,
    lengths: torch.Tensor,
    num_tokens: int,
    max_ngram_size: int,
    min_ngram_size: int = 1,
    *,
    most_recent: bool = True,
    early_exit: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the tokens that followed an earlier occurrence of the row's longest matching suffix n-gram.

    For ``n`` from ``max_ngram_size`` down to ``min_ngram_size``, the suffix ``s[L - n : L]`` of a row of
    length ``L`` is searched among the windows ``s[i : i + n]`` with ``i + n < L`` (an *earlier* occurrence, which
    may overlap the suffix but is not the suffix itself). The first ``n`` with a match wins; among its matches
    the most recent one (largest ``i``) is used, or the first one when ``most_recent=False`` (HF's and the
    original prompt-lookup choice). The continuation is ``s[i + n : min(i + n + num_tokens, L)]``.

    Args:
        sequences: Shape ``[B, T]`` int64, left-aligned token rows; entries at ``>= lengths[b]`` are ignored.
        lengths: Shape ``[B]`` int64, valid length of each row (``0 <= lengths[b] <= T``).
        num_tokens: ``K``, the most tokens to return per row, ``>= 0``.
        max_ngram_size: longest suffix tried, ``>= min_ngram_size``.
        min_ngram_size: shortest suffix tried, ``>= 1``.
        most_recent: pick the latest earlier occurrence (default) rather than the first.
        early_exit: stop trying shorter n-grams once every row has matched (one host sync per ``n``); ``False``
            tries them all and never synchronises (same result).

    Returns:
        ``(tokens, counts)``: ``tokens`` of shape ``[B, num_tokens]`` int64 (the continuation left-aligned,
        zeros after it) and ``counts`` of shape ``[B]`` int64, tokens found per row (0 when nothing matched).

    Example:
        >>> seq = torch.tensor([[5, 6, 7, 8, 5, 6]])
        >>> find_ngram_continuations(seq, torch.tensor([6]), 3, max_ngram_size=3)
        (tensor([[7, 8, 5]]), tensor([3]))

    References:
        Saxena, "Prompt Lookup Decoding" (2023), https://github.com/apoorvumang/prompt-lookup-decoding
    """
    if sequences.dim() != 2 or lengths.shape != sequences.shape[:1]:
        raise ValueError(
            f"sequences must be [B, T] with lengths [B]; got {tuple(sequences.shape)} and {tuple(lengths.shape)}"
        )
    if not 1 <= min_ngram_size <= max_ngram_size:
        raise ValueError(
            f"need 1 <= min_ngram_size <= max_ngram_size, got min {min_ngram_size}, max {max_ngram_size}"
        )
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    batch, width = sequences.shape
    device = sequences.device
    lengths = lengths.to(device=device, dtype=torch.long)
    # Match start per row; -1 until some n matched. Longer n are tried first and never overwritten.
    start = torch.full((batch,), -1, dtype=torch.long, device=device)
    for n in range(min(max_ngram_size, width - 1), min_ngram_size - 1, -1):
        num_windows = width - n + 1
        windows = sequences.unfold(1, n, 1)  # [B, W, n]
        suffix_idx = (lengths[:, None] - n + torch.arange(n, device=device)).clamp(min=0)
        suffix = sequences.gather(1, suffix_idx)  # [B, n]
        matches = (windows == suffix[:, None, :]).all(dim=2)
        window_starts = torch.arange(num_windows, device=device)
        matches &= window_starts[None, :] + n < lengths[:, None]
        found = matches.any(dim=1) & (start < 0)
        if most_recent:
            where = torch.where(matches, window_starts, -1).amax(dim=1)
        else:
            where = torch.where(matches, window_starts, num_windows).amin(dim=1)
        start = torch.where(found, where + n, start)
        # Host sync (one per n): skip the shorter n-grams once every row has matched.
        if early_exit and bool((start >= 0).all()):
            break
    counts = torch.where(start >= 0, (lengths - start).clamp(max=num_tokens), 0)
    offsets = torch.arange(num_tokens, device=device)
    index = (start.clamp(min=0)[:, None] + offsets).clamp(max=max(width - 1, 0))
    tokens = sequences.gather(1, index) if width else sequences.new_zeros((batch, num_tokens))
    tokens = torch.where(offsets[None, :] < counts[:, None], tokens, 0)
    return tokens, counts


def find_ngram_continuations_ref(
    sequences: torch.Tensor,
    lengths: torch.Tensor,
    num_tokens: int,
    max_ngram_size: int,
    min_ngram_size: int = 1,
    *,
    most_recent: bool = True,
    early_exit: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-Python reference of :func:`find_ngram_continuations` (same signature and result), for tests.

    Args:
        sequences: Shape ``[B, T]`` int64, left-aligned token rows.
        lengths: Shape ``[B]`` int64, valid length of each row.
        num_tokens: ``K``, the most tokens to return per row.
        max_ngram_size: longest suffix tried.
        min_ngram_size: shortest suffix tried.
        most_recent: pick the latest earlier occurrence rather than the first.
        early_exit: accepted for the same signature (the result does not depend on it).

    Returns:
        ``(tokens, counts)`` of shapes ``[B, num_tokens]`` and ``[B]``, as :func:`find_ngram_continuations`.
    """
    tokens = torch.zeros((sequences.shape[0], num_tokens), dtype=torch.long)
    counts = torch.zeros(sequences.shape[0], dtype=torch.long)
    for b, (row, length) in enumerate(zip(sequences.tolist(), lengths.tolist())):
        row = row[:length]
        for n in range(max_ngram_size, min_ngram_size - 1, -1):
            if n >= length:
                continue
            suffix = row[length - n :]
            hits = [i for i in range(length - n) if row[i : i + n] == suffix]
            if hits:
                i = hits[-1] if most_recent else hits[0]
                found = row[i + n : i + n + num_tokens]
                tokens[b, : len(found)] = torch.tensor(found, dtype=torch.long)
                counts[b] = len(found)
                break
    return tokens.to(sequences.device), counts.to(sequences.device)


def _check(history, lengths, roots, num_tokens, max_ngram_size, min_ngram_size, active) -> None:
    batch = history.shape[0] if history.dim() == 2 else -1
    if batch < 0 or tuple(lengths.shape) != (batch,) or tuple(roots.shape) != (batch,):
        raise ValueError(f"ngram_chain needs history [B, C] with lengths and roots [B]; got history "
                         f"{tuple(history.shape)}, lengths {tuple(lengths.shape)}, roots {tuple(roots.shape)}")
    if active is not None and tuple(active.shape) != (batch,):
        raise ValueError(f"active must be [B] = [{batch}] bool (rows still generating) or None, got "
                         f"{tuple(active.shape)}")
    if not 1 <= min_ngram_size <= max_ngram_size:
        raise ValueError(f"need 1 <= min_ngram_size <= max_ngram_size, got min {min_ngram_size}, max {max_ngram_size}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")


def ngram_chain_ref(history: torch.Tensor, lengths: torch.Tensor, roots: torch.Tensor, num_tokens: int,
                    max_ngram_size: int, min_ngram_size: int = 1, *, most_recent: bool = True,
                    active: torch.Tensor | None = None) -> NgramChain:
    """Reference for :func:`ngram_chain` (same signature and result): the root written into a copy of the history,
    :func:`find_ngram_continuations` without early exit, inactive rows' counts zeroed, :func:`chain_layout`.

    Args:
        history: Shape ``[B, C]`` int64, row ``b``'s committed tokens in ``history[b, :lengths[b]]``.
        lengths: Shape ``[B]`` int64; a row needs ``0 <= lengths[b] < C`` (a column for the root), else it proposes
            nothing.
        roots: Shape ``[B]`` int64, the token after each row's committed ones (the sequence's last).
        num_tokens: ``K``, the longest chain.
        max_ngram_size, min_ngram_size: the suffix lengths tried, longest first.
        most_recent: the latest earlier match (default) or the first.
        active: Shape ``[B]`` bool, or ``None`` (every row); inactive rows propose nothing.

    Returns:
        :class:`NgramChain`.
    """
    _check(history, lengths, roots, num_tokens, max_ngram_size, min_ngram_size, active)
    batch, columns = history.shape
    if columns == 0:  # no row has room for its root
        return chain_layout(history.new_zeros(batch, num_tokens), lengths.new_zeros(batch))
    room = (lengths >= 0) & (lengths < columns)
    sequences = history.clone()
    sequences.scatter_(1, torch.where(room, lengths, 0)[:, None], roots[:, None].to(history.dtype))
    tokens, counts = find_ngram_continuations(sequences, torch.where(room, lengths + 1, 0), num_tokens,
                                              max_ngram_size, min_ngram_size, most_recent=most_recent,
                                              early_exit=False)
    if active is not None:
        counts = torch.where(active, counts, 0)
    return chain_layout(tokens, counts)


@jit
def _ngram_kernel(hist_ptr, len_ptr, root_ptr, act_ptr, tok_ptr, cnt_ptr, par_ptr, dep_ptr, stride_h, C, K,
                  MIN_N: tl.constexpr, MAX_N: tl.constexpr, NP: tl.constexpr, MOST_RECENT: tl.constexpr,
                  HAS_ACTIVE: tl.constexpr, BLOCK: tl.constexpr, KB: tl.constexpr, PDL: tl.constexpr = False):
    """One row: the best window end per n in one pass over the ends, then the chain of the longest n's match."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    h = hist_ptr + row * stride_h
    last = tl.load(len_ptr + row)  # the root's index in the sequence; window ends lie in [n - 1, last - 1]
    last = tl.where((last >= 0) & (last < C), last, 0)  # no room for the root: nothing searched, nothing proposed
    root = tl.load(root_ptr + row)
    nidx = tl.arange(0, NP)
    if MOST_RECENT:  # no match yet: -1 (largest end wins) / 2^62 (smallest wins)
        best = tl.full([NP], -1, tl.int64)
    else:
        best = tl.full([NP], 1 << 62, tl.int64)
    for e0 in range(0, last, BLOCK):
        e = e0 + tl.arange(0, BLOCK).to(tl.int64)
        match = e < last
        for d in tl.static_range(MAX_N):
            if d == 0:
                suffix = root
            else:
                suffix = tl.load(h + (last - d), mask=last - d >= 0, other=-1)
            value = tl.load(h + (e - d), mask=match & (e - d >= 0), other=-2)
            match = match & (e - d >= 0) & (value == suffix)
            if MOST_RECENT:
                found = tl.max(tl.where(match, e, -1), axis=0)
                best = tl.where(nidx == d + 1, tl.maximum(best, found), best)
            else:
                found = tl.min(tl.where(match, e, 1 << 62), axis=0)
                best = tl.where(nidx == d + 1, tl.minimum(best, found), best)
    found = (best >= 0) & (best < (1 << 62)) & (nidx >= MIN_N) & (nidx <= MAX_N)
    n = tl.max(tl.where(found, nidx, 0), axis=0)
    start = tl.sum(tl.where((nidx == n) & (n > 0), best, 0), axis=0) + 1
    count = tl.where(n > 0, tl.minimum(last + 1 - start, K), 0)
    if HAS_ACTIVE:
        count = tl.where(tl.load(act_ptr + row) != 0, count, 0)
    j = tl.arange(0, KB).to(tl.int64)
    idx = start + j
    take = j < count
    token = tl.load(h + idx, mask=take & (idx < last), other=0)
    token = tl.where(take & (idx == last), root, token)
    tl.store(tok_ptr + row * K + j, token, mask=j < K)
    present = (j >= 1) & (j <= count)
    tl.store(par_ptr + row * (K + 1) + j, tl.where(present, j - 1, -1), mask=j <= K)
    tl.store(dep_ptr + row * (K + 1) + j, tl.where(present, j, 0), mask=j <= K)
    tl.store(cnt_ptr + row, count)


def _ngram_chain_triton(history, lengths, roots, num_tokens, max_ngram_size, min_ngram_size, most_recent, active):
    batch = history.shape[0]
    device = history.device
    tokens = torch.empty(batch, num_tokens, dtype=torch.long, device=device)
    counts = torch.empty(batch, dtype=torch.long, device=device)
    parents = torch.empty(batch, num_tokens + 1, dtype=torch.long, device=device)
    depths = torch.empty(batch, num_tokens + 1, dtype=torch.long, device=device)
    if batch:
        history = history if history.stride(-1) == 1 else history.contiguous()
        flags = active.contiguous().view(torch.uint8) if active is not None else counts  # never read without active
        _ngram_kernel[(batch,)](
            history, lengths.contiguous(), roots.to(history.dtype).contiguous(), flags, tokens, counts, parents,
            depths, history.stride(0), history.shape[1], num_tokens, MIN_N=min_ngram_size, MAX_N=max_ngram_size,
            NP=next_pow2(max_ngram_size + 1), MOST_RECENT=most_recent, HAS_ACTIVE=active is not None,
            BLOCK=NGRAM_BLOCK, KB=next_pow2(num_tokens + 1), **pdl_launch(),
        )
    return NgramChain(tokens, counts, parents, depths)


def ngram_chain(history: torch.Tensor, lengths: torch.Tensor, roots: torch.Tensor, num_tokens: int,
                max_ngram_size: int, min_ngram_size: int = 1, *, most_recent: bool = True,
                active: torch.Tensor | None = None) -> NgramChain:
    """Prompt lookup's draft: per row, the chain copied from the latest earlier occurrence of its longest matching
    suffix n-gram (module docstring), one launch on CUDA, no host sync, static shapes.

    Args:
        history: Shape ``[B, C]`` int64, row ``b``'s committed tokens in ``history[b, :lengths[b]]`` (the rest is
            ignored).
        lengths: Shape ``[B]`` int64; a row needs ``0 <= lengths[b] < C`` (a column for the root: the reference
            writes it there), else it proposes nothing (no read past the history).
        roots: Shape ``[B]`` int64, each row's root: the sequence searched is the history, then the root.
        num_tokens: ``K``, the longest chain (``>= 0``).
        max_ngram_size, min_ngram_size: the suffix lengths tried, longest first (``1 <= min <= max``).
        most_recent: the latest earlier match (default) or the first (HF's choice).
        active: Shape ``[B]`` bool, or ``None`` (every row); inactive rows propose nothing.

    Returns:
        :class:`NgramChain` (``tokens [B, K]``, ``counts [B]``, ``parents`` and ``depths [B, K + 1]``).

    Raises:
        ValueError: shapes that do not fit, or n-gram sizes out of order (named in the message).

    Example:
        >>> ngram_chain(torch.tensor([[5, 6, 7, 8, 5, 0]]), torch.tensor([5]), torch.tensor([6]), 3, 3).tokens
        tensor([[7, 8, 5]])
    """
    _check(history, lengths, roots, num_tokens, max_ngram_size, min_ngram_size, active)
    if use_kernel("ngram_chain", history, lengths, roots, *(() if active is None else (active,))):
        return _ngram_chain_triton(history, lengths, roots, num_tokens, max_ngram_size, min_ngram_size, most_recent,
                                   active)
    return ngram_chain_ref(history, lengths, roots, num_tokens, max_ngram_size, min_ngram_size,
                           most_recent=most_recent, active=active)
