"""The bookkeeping of an EAGLE-2 dynamic tree: one launch per level, two for the rerank.

:func:`specdec.trees.grow_dynamic_tree` runs one head forward per level; between two forwards it records the
level's candidates and picks the next frontier. In torch ops that is about a dozen small kernels per level (clamp,
add, a copy, a top-k, four gathers, a concatenation, ...) and about ten more for the final rerank (two sorts, a
search, gathers, concatenations): some eighty launches of a microsecond or two each, for a few kilobytes of data.
Here:

- :func:`dynamic_tree_level` records a level's candidates into preallocated ``[B, C]`` buffers (score, target
  token, parent candidate) and, unless it is the last level, returns the next frontier (the ``k`` best of the
  level's candidates, their tokens and candidate ids, their parents' head outputs, their ancestor sets): one
  program per (row, frontier slot).
- :func:`rerank_candidates` keeps the ``n`` best of all candidates, in candidate order, with their parents' node
  indices and depths: two launches, ranks by counting (no sort), then places by a prefix sum.

Order everywhere: scores descending, equal scores by ascending candidate index (a stable descending sort, the
order of :func:`specdec.kernels.topk_rows` and of :func:`specdec.trees.grow_dynamic_tree_ref`). Scores are float32
and added in the same order as the references, so the kernels' trees equal the references' bit for bit. NaN
scores are not supported.

References:
    Li et al., "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees", arXiv 2406.16858, Sec. 4.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ._dispatch import use_kernel
from ._triton import jit, next_pow2, pdl_launch, pdl_start, tl

__all__ = ["TreeCandidates", "TreeFrontier", "new_candidates", "dynamic_tree_level", "dynamic_tree_level_ref",
           "rerank_candidates", "rerank_candidates_ref", "TREE_LEVEL_MAX_K", "RERANK_MAX_CANDIDATES"]

#: The widest frontier the level kernel takes (it ranks the ``k * k`` candidates pairwise); wider runs the reference.
TREE_LEVEL_MAX_K = 16
#: The most candidates per row the rerank kernel takes; more run the reference.
RERANK_MAX_CANDIDATES = 4096


class TreeCandidates(NamedTuple):
    """Every candidate of one step's dynamic tree, level by level (level 1: ``k``; each later level: ``k * k``).

    Attributes:
        scores: Shape ``[B, C]`` float32, cumulative log-probabilities.
        tokens: Shape ``[B, C]`` int64, target-vocabulary ids.
        parents: Shape ``[B, C]`` int64, the parent's candidate index (``-1``: the root).
    """

    scores: torch.Tensor
    tokens: torch.Tensor
    parents: torch.Tensor


class TreeFrontier(NamedTuple):
    """The nodes a level expands: the ``k`` best candidates of the level before.

    Attributes:
        scores: Shape ``[B, k]`` float32.
        tokens: Shape ``[B, k]`` int64 (target ids: the head's next input).
        ids: Shape ``[B, k]`` int64, candidate indices (parents of the next level's candidates).
        hidden: Shape ``[B, k, H]``, the head's output at each node's parent (the head's next conditioning input).
        visible: Shape ``[B, k, S]`` bool, the scratch slots each node sees (its ancestors and itself).
    """

    scores: torch.Tensor
    tokens: torch.Tensor
    ids: torch.Tensor
    hidden: torch.Tensor
    visible: torch.Tensor


def new_candidates(batch: int, top_k: int, depth: int, device) -> TreeCandidates:
    """Uninitialised candidate buffers for a tree of ``depth`` levels (every entry is written by the levels).

    Args:
        batch: ``B``.
        top_k: ``k``.
        depth: ``D``; ``C = k + (D - 1) k^2``.
        device: where.

    Returns:
        A :class:`TreeCandidates`.
    """
    C = top_k + (depth - 1) * top_k * top_k
    return TreeCandidates(torch.empty(batch, C, dtype=torch.float32, device=device),
                          torch.empty(batch, C, dtype=torch.long, device=device),
                          torch.empty(batch, C, dtype=torch.long, device=device))


def _check_level(cands: TreeCandidates, offset: int, child_lp, child_tokens, frontier, hidden) -> int:
    k = child_lp.shape[-1]
    B, C = cands.scores.shape
    if k < 1 or (C - k) % (k * k):
        raise ValueError(f"dynamic_tree_level: candidate buffers of {C} per row do not hold whole levels of k={k} "
                         f"children (k + (D - 1) k^2): make them with new_candidates(B, k, depth, device)")
    parents = 1 if frontier is None else k
    want = (B, k) if frontier is None else (B, k, k)
    if tuple(child_lp.shape) != want or tuple(child_tokens.shape) != want:
        raise ValueError(f"dynamic_tree_level: child_lp and child_tokens must have shape {list(want)} "
                         f"({'root level: [B, k]' if frontier is None else '[B, k parents, k children]'}), got "
                         f"{tuple(child_lp.shape)} and {tuple(child_tokens.shape)}")
    if not 0 <= offset <= cands.scores.shape[1] - parents * k:
        raise ValueError(f"dynamic_tree_level: offset {offset} leaves no room for {parents * k} candidates in "
                         f"buffers of {cands.scores.shape[1]}")
    want_h = (B, hidden.shape[-1]) if frontier is None else (B, k, hidden.shape[-1])
    if tuple(hidden.shape) != want_h:
        raise ValueError(f"dynamic_tree_level: hidden must have shape {list(want_h)} (the root's head output, or "
                         f"the frontier's), got {tuple(hidden.shape)}")
    return k


def dynamic_tree_level_ref(cands: TreeCandidates, offset: int, child_lp: torch.Tensor, child_tokens: torch.Tensor,
                           frontier: TreeFrontier | None, hidden: torch.Tensor, *,
                           advance: bool = True) -> TreeFrontier | None:
    """Reference for :func:`dynamic_tree_level` (same arguments and result), in torch ops."""
    k = _check_level(cands, offset, child_lp, child_tokens, frontier, hidden)
    B = child_lp.shape[0]
    device = child_lp.device
    if frontier is None:  # level 1: the root's k best, in their order (already the ranking's)
        cum, tokens = child_lp.float(), child_tokens
        parents = torch.full((B, k), -1, dtype=torch.long, device=device)
    else:  # clamp: a rounding-positive log-prob would let a child outscore its parent
        cum = (frontier.scores[..., None] + child_lp.float().clamp(max=0.0)).flatten(1)  # flat j: parent j // k
        tokens = child_tokens.flatten(1)
        parents = frontier.ids.repeat_interleave(k, dim=1)
    n = cum.shape[1]
    cands.scores[:, offset:offset + n] = cum
    cands.tokens[:, offset:offset + n] = tokens
    cands.parents[:, offset:offset + n] = parents
    if not advance:
        return None
    eye = torch.eye(k, dtype=torch.bool, device=device)[None].expand(B, k, k)
    best = torch.sort(cum, dim=1, descending=True, stable=True).indices[:, :k]  # level 1 best first: the identity
    if frontier is None:
        return TreeFrontier(cum.gather(1, best), tokens.gather(1, best), offset + best,
                            hidden[:, None].expand(B, k, hidden.shape[-1]), eye)
    slot = best // k
    inherited = frontier.visible.gather(1, slot[..., None].expand(B, k, frontier.visible.shape[-1]))
    return TreeFrontier(cum.gather(1, best), tokens.gather(1, best), offset + best,
                        hidden.gather(1, slot[..., None].expand(B, k, hidden.shape[-1])),
                        torch.cat([inherited, eye], dim=-1))


def dynamic_tree_level(cands: TreeCandidates, offset: int, child_lp: torch.Tensor, child_tokens: torch.Tensor,
                       frontier: TreeFrontier | None, hidden: torch.Tensor, *,
                       advance: bool = True) -> TreeFrontier | None:
    """Record one level's candidates at ``cands[:, offset:]`` and pick the next frontier, in one launch.

    Level 1 (``frontier`` ``None``): the root's ``k`` best children, scores = their log-probabilities (``child_lp``
    as given), parent ``-1``. A later level: frontier node ``i``'s child ``r`` is candidate ``offset + i k + r``,
    score = ``frontier.scores[i] + min(child_lp[i, r], 0)`` (the clamp keeps a child from outscoring its parent),
    parent = ``frontier.ids[i]``. With ``advance`` the ``k`` best of the level's candidates become the next
    frontier (ties by candidate index), each with its parent's head output and its parent's ancestor set plus
    itself.

    Dispatch: the Triton kernel (one program per row and frontier slot) when the tensors are on CUDA, triton imports
    and ``k <=`` :data:`TREE_LEVEL_MAX_K`; :func:`dynamic_tree_level_ref` otherwise (and inside ``torch.compile``).

    Args:
        cands: the step's :class:`TreeCandidates` (written in place).
        offset: the level's first candidate index (``0`` for level 1, then ``k + (l - 2) k^2`` for level ``l``).
        child_lp: Shape ``[B, k]`` (level 1) or ``[B, k, k]``: the ``k`` best children's log-probabilities per
            parent, best first (:func:`specdec.kernels.log_softmax_topk`).
        child_tokens: same shape, int64: their target ids.
        frontier: the level's parents (``None`` for level 1).
        hidden: Shape ``[B, H]`` (level 1: the root's head output) or ``[B, k, H]`` (the head's outputs at the
            frontier: the parents of the next frontier).
        advance: pick and return the next frontier (``False`` at the last level).

    Returns:
        The next :class:`TreeFrontier` (``visible`` ``[B, k, S + k]``), or ``None`` without ``advance``.

    Raises:
        ValueError: shapes that do not fit, naming the argument.
    """
    k = _check_level(cands, offset, child_lp, child_tokens, frontier, hidden)
    tensors = [cands.scores, child_lp, child_tokens, hidden] + ([] if frontier is None else list(frontier))
    if k <= TREE_LEVEL_MAX_K and child_lp.shape[0] > 0 and use_kernel("dynamic_tree_level", *tensors):
        return _tree_level_triton(cands, offset, child_lp, child_tokens, frontier, hidden, advance, k)
    return dynamic_tree_level_ref(cands, offset, child_lp, child_tokens, frontier, hidden, advance=advance)


@jit
def _tree_level_kernel(lp_ptr, tok_ptr, fs_ptr, fid_ptr, hid_ptr, vis_ptr, cs_ptr, ct_ptr, cp_ptr,
                       ns_ptr, nt_ptr, nid_ptr, nh_ptr, nv_ptr, C, offset, H, S,
                       K: tl.constexpr, NC: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr,
                       BLOCK_V: tl.constexpr, ROOT: tl.constexpr, ADVANCE: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (row ``b``, frontier slot ``i``): the level's ``NC`` candidates (``K`` root children, or
    ``K * K``) scored; this program records every ``K``-th of them (``j % K == i``); with ``ADVANCE`` it ranks them
    all, takes the one of rank ``i`` as the next frontier's node ``i`` and copies its parent's hidden row and
    ancestor set."""
    pdl_start(PDL)
    b = tl.program_id(0)
    i = tl.program_id(1)
    j = tl.arange(0, BLOCK_C)
    j_in = j < NC
    lp = tl.load(lp_ptr + b * NC + j, mask=j_in, other=float("-inf")).to(tl.float32)
    parent = j // K
    if ROOT:
        cum = lp
        pid = tl.full([BLOCK_C], -1, tl.int64)
    else:
        cum = tl.load(fs_ptr + b * K + parent, mask=j_in, other=0.0) + tl.minimum(lp, 0.0)
        pid = tl.load(fid_ptr + b * K + parent, mask=j_in, other=-1)
    tok = tl.load(tok_ptr + b * NC + j, mask=j_in, other=0)
    mine = j_in & (j % K == i)
    tl.store(cs_ptr + b * C + offset + j, cum, mask=mine)
    tl.store(ct_ptr + b * C + offset + j, tok, mask=mine)
    tl.store(cp_ptr + b * C + offset + j, pid, mask=mine)
    if ADVANCE:
        # rank[j] = candidates ahead of j: higher score, or equal score and a smaller index
        ahead = (cum[None, :] > cum[:, None]) | ((cum[None, :] == cum[:, None]) & (j[None, :] < j[:, None]))
        rank = tl.sum((ahead & j_in[None, :]).to(tl.int32), axis=1)
        pick = j_in & (rank == i)
        best = tl.sum(tl.where(pick, j, 0), axis=0)
        tl.store(ns_ptr + b * K + i, tl.sum(tl.where(pick, cum, 0.0), axis=0))
        tl.store(nt_ptr + b * K + i, tl.sum(tl.where(pick, tok, 0), axis=0))
        tl.store(nid_ptr + b * K + i, (offset + best).to(tl.int64))
        src = b if ROOT else b * K + best // K  # the parent's row of hidden ([B, H] at the root, else [B * K, H])
        for h0 in range(0, H, BLOCK_H):
            h = h0 + tl.arange(0, BLOCK_H)
            row = tl.load(hid_ptr + src * H + h, mask=h < H)
            tl.store(nh_ptr + (b * K + i) * H + h, row, mask=h < H)
        for v0 in range(0, S + K, BLOCK_V):  # [ancestors of the parent | this level: itself only]
            v = v0 + tl.arange(0, BLOCK_V)
            own = (v >= S) & (v - S == i)
            if ROOT:
                seen = own
            else:
                seen = (tl.load(vis_ptr + src * S + v, mask=v < S, other=0) != 0) | own
            tl.store(nv_ptr + (b * K + i) * (S + K) + v, seen.to(tl.int8), mask=v < S + K)


def _tree_level_triton(cands, offset, child_lp, child_tokens, frontier, hidden, advance, k):
    B = child_lp.shape[0]
    device = child_lp.device
    nc = child_lp[0].numel()
    lp, tok, hid = child_lp.contiguous(), child_tokens.contiguous(), hidden.contiguous()
    H = hid.shape[-1]
    S = 0 if frontier is None else frontier.visible.shape[-1]
    if advance:
        nxt = TreeFrontier(torch.empty(B, k, dtype=torch.float32, device=device),
                           torch.empty(B, k, dtype=torch.long, device=device),
                           torch.empty(B, k, dtype=torch.long, device=device),
                           torch.empty(B, k, H, dtype=hid.dtype, device=device),
                           torch.empty(B, k, S + k, dtype=torch.bool, device=device))
    else:  # the pointers are never read
        nxt = TreeFrontier(*(cands.scores,) * 5)
    if frontier is None:
        fs = fid = vis = cands.scores  # never read at the root
    else:
        fs, fid = frontier.scores.contiguous(), frontier.ids.contiguous()
        vis = frontier.visible.contiguous().view(torch.int8)
    nv = nxt.visible.view(torch.int8) if advance else nxt.visible
    _tree_level_kernel[(B, k)](lp, tok, fs, fid, hid, vis, cands.scores, cands.tokens, cands.parents,
                               nxt.scores, nxt.tokens, nxt.ids, nxt.hidden, nv, cands.scores.shape[1], offset, H, S,
                               K=k, NC=nc, BLOCK_C=max(16, next_pow2(nc)), BLOCK_H=min(1024, next_pow2(H)),
                               BLOCK_V=min(256, max(16, next_pow2(S + k))), ROOT=frontier is None,
                               ADVANCE=advance, num_warps=4, **pdl_launch())
    return nxt if advance else None


def _levels(C: int, k: int, device) -> torch.Tensor:
    """Each candidate's depth: ``1`` for the first ``k``, then ``2 + (j - k) // k^2``."""
    j = torch.arange(C, device=device)
    return torch.where(j < k, 1, 2 + (j - k).clamp(min=0) // (k * k))


def _check_rerank(cands: TreeCandidates, top_k: int, total_tokens: int) -> int:
    B, C = cands.scores.shape
    if top_k < 1 or (C - top_k) % (top_k * top_k):
        raise ValueError(f"rerank_candidates: {C} candidates per row is not k + (D - 1) k^2 for top_k={top_k}")
    if total_tokens < 2:
        raise ValueError(f"rerank_candidates: total_tokens must be >= 2 (root + 1 draft), got {total_tokens}")
    return min(total_tokens - 1, C)


def rerank_candidates_ref(cands: TreeCandidates, top_k: int,
                          total_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference for :func:`rerank_candidates` (same arguments and result): two stable sorts and a search."""
    n = _check_rerank(cands, top_k, total_tokens)
    scores, tokens, parent_ids = cands
    B, C = scores.shape
    best = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :n]
    selected = best.sort(dim=1).values  # candidate order: levels ascending, parents before children
    parent_cand = parent_ids.gather(1, selected)
    parent_node = torch.searchsorted(selected, parent_cand.clamp(min=0)) + 1
    parent_node = torch.where(parent_cand < 0, torch.zeros_like(parent_node), parent_node)
    root = torch.full((B, 1), -1, dtype=torch.long, device=scores.device)
    parents = torch.cat([root, parent_node], 1)
    depths = torch.cat([torch.zeros_like(root), _levels(C, top_k, scores.device)[selected]], 1)
    return tokens.gather(1, selected), parents, depths


def rerank_candidates(cands: TreeCandidates, top_k: int,
                      total_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EAGLE-2's rerank: the ``n = min(total_tokens - 1, C)`` best candidates, in candidate order, as a tree.

    Candidate order puts levels in order and parents before their children, so the kept nodes are stored breadth
    first; a kept node's parent is its parent candidate's place among the kept (``+ 1``: node 0 is the root). The
    kept set is ancestor-closed when no child outscores its parent (the clamped log-probabilities guarantee it).

    Dispatch: the Triton kernels (ranks by pairwise counting, programs over blocks of candidates; then one program
    per row: places by a prefix sum) when the tensors are on CUDA, triton imports and ``C <=``
    :data:`RERANK_MAX_CANDIDATES`; :func:`rerank_candidates_ref` otherwise (and inside ``torch.compile``).

    Args:
        cands: the step's :class:`TreeCandidates` (``C = k + (D - 1) k^2`` per row).
        top_k: ``k``.
        total_tokens: the tree's size with the root.

    Returns:
        ``(tokens [B, n] int64, parents [B, n + 1] int64, depths [B, n + 1] int64)``, node 0 the root (parent
        ``-1``, depth 0).

    Raises:
        ValueError: buffers that are not a whole number of levels, or ``total_tokens < 2``.
    """
    n = _check_rerank(cands, top_k, total_tokens)
    C = cands.scores.shape[1]
    if C <= RERANK_MAX_CANDIDATES and cands.scores.shape[0] > 0 and use_kernel("rerank_candidates", *cands):
        return _rerank_triton(cands, top_k, n)
    return rerank_candidates_ref(cands, top_k, total_tokens)


@jit
def _rerank_rank_kernel(cs_ptr, keep_ptr, C, n, BLOCK_J: tl.constexpr, BLOCK_M: tl.constexpr,
                        PDL: tl.constexpr = False):
    """One program per (row, block of candidates): each candidate's rank (the candidates ahead of it, counted block
    by block); ``keep[row, j]`` = rank below ``n``."""
    pdl_start(PDL)
    b = tl.program_id(0)
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    j_in = j < C
    s_j = tl.load(cs_ptr + b * C + j, mask=j_in, other=float("-inf"))
    rank = tl.zeros([BLOCK_J], tl.int32)
    for m0 in range(0, C, BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        s_m = tl.load(cs_ptr + b * C + m, mask=m < C, other=float("-inf"))
        ahead = (s_m[None, :] > s_j[:, None]) | ((s_m[None, :] == s_j[:, None]) & (m[None, :] < j[:, None]))
        rank += tl.sum((ahead & (m < C)[None, :]).to(tl.int32), axis=1)
    tl.store(keep_ptr + b * C + j, (rank < n).to(tl.int32), mask=j_in)


@jit
def _rerank_place_kernel(keep_ptr, ct_ptr, cp_ptr, place_ptr, tok_ptr, par_ptr, dep_ptr, C, n,
                         K: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr = False):
    """One program per row: the kept candidates' places by a prefix sum, their parents' places read back from
    ``place`` (this row's scratch) after a barrier, the tree written."""
    pdl_start(PDL)
    b = tl.program_id(0)
    j = tl.arange(0, BLOCK_C)
    j_in = j < C
    kept = tl.load(keep_ptr + b * C + j, mask=j_in, other=0)
    before = tl.cumsum(kept, axis=0) - kept  # kept candidates below j
    tl.store(place_ptr + b * C + j, before, mask=j_in)
    tl.debug_barrier()  # every place written before any is read back
    pc = tl.load(cp_ptr + b * C + j, mask=j_in, other=-1)
    is_kept = j_in & (kept != 0)
    parent_node = tl.where(pc < 0, 0, tl.load(place_ptr + b * C + pc, mask=is_kept & (pc >= 0), other=0) + 1)
    level = tl.where(j < K, 1, 2 + (j - K) // (K * K))
    tl.store(tok_ptr + b * n + before, tl.load(ct_ptr + b * C + j, mask=is_kept, other=0), mask=is_kept)
    tl.store(par_ptr + b * (n + 1) + 1 + before, parent_node.to(tl.int64), mask=is_kept)
    tl.store(dep_ptr + b * (n + 1) + 1 + before, level.to(tl.int64), mask=is_kept)
    tl.store(par_ptr + b * (n + 1), -1)
    tl.store(dep_ptr + b * (n + 1), 0)


def _rerank_triton(cands: TreeCandidates, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scores, tokens, parents = (t.contiguous() for t in cands)
    B, C = scores.shape
    device = scores.device
    keep = torch.empty(B, C, dtype=torch.int32, device=device)
    place = torch.empty(B, C, dtype=torch.int32, device=device)
    out_tok = torch.empty(B, n, dtype=torch.long, device=device)
    out_par = torch.empty(B, n + 1, dtype=torch.long, device=device)
    out_dep = torch.empty(B, n + 1, dtype=torch.long, device=device)
    block_j = 32  # [32 x 64] comparisons per step of a program's loop: no register spills, C / 32 programs per row
    _rerank_rank_kernel[(B, -(-C // block_j))](scores, keep, C, n, BLOCK_J=block_j, BLOCK_M=64, num_warps=4,
    **pdl_launch())
    _rerank_place_kernel[(B,)](keep, tokens, parents, place, out_tok, out_par, out_dep, C, n, K=k,
                               BLOCK_C=max(16, next_pow2(C)), num_warps=4 if C <= 1024 else 8, **pdl_launch())
    return out_tok, out_par, out_dep
