"""Optimised static trees: measure per-depth, per-rank acceptance, then build the best tree for a node budget.

Model (Medusa, Sec. 2.1.2 / 3.3.1): let ``a[d, r]`` be the probability that the target's token at depth ``d + 1``
(0-based ``d``) is the draft's rank-``r`` candidate there, given that the path above it was accepted. Assuming
independence across depths, a node with path ``(r_1, ..., r_k)`` is accepted with probability
``prod_i a[i - 1, r_i]``, and since at most one sibling can be right, the expected number of tokens a step emits
is

.. math:: \\tau(\\mathcal{T}) = 1 + \\sum_{(r_1..r_k) \\in \\mathcal{T}} \\prod_{i=1}^{k} a_{i-1, r_i}

(the 1 is the bonus / recovered token). A valid tree (tree choices, :mod:`specdec.trees.core`) is closed under
parents and earlier siblings.

- :func:`measure_rank_acceptance` estimates ``a`` by decoding calibration prompts greedily with *any* drafter that
  drafts a given static tree (Medusa's level trees, EAGLE-1's static trees, a draft model's token tree): at every
  step and for every draft node whose parent's path matches the target, it counts whether the node's token is the
  target's token (:func:`count_rank_hits`).
- :func:`optimal_tree`: Medusa's greedy construction: grow from ``(0,)``, always adding the frontier node (next
  sibling or first child of a chosen node) of largest path product. Optimal when ``a`` decreases along ranks.
- :func:`sequoia_tree`: the exact optimum of the same objective for any ``a``, by dynamic programming over
  (depth, number of children, node budget), as Sequoia's DP with per-depth acceptance vectors.
- :func:`expected_accept_length`: ``tau`` of a tree under the model.

References:
    Cai et al., "Medusa", arXiv 2401.10774 (Sec. 2.1.2 and 3.3.1, optimised sparse trees; ``heads_accuracy.py``,
    ``gen_results.py``); Chen et al., "Sequoia: Scalable, Robust, and Hardware-aware Speculative Decoding",
    arXiv 2402.12374 (dynamic programme for the tree of maximal expected accepted length).
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from .core import Tree, ancestor_matrix, compile_tree

__all__ = ["RankAcceptance", "comb_tree", "count_rank_hits", "rank_candidates", "measure_rank_acceptance",
           "expected_accept_length",
           "optimal_tree", "sequoia_tree"]

Path = tuple[int, ...]


class RankAcceptance(NamedTuple):
    """Measured per-depth, per-rank acceptance.

    Attributes:
        probs: Shape ``[D, R]`` float64, ``hits / tries`` (0 where nothing was tried): ``probs[d, r]`` estimates
            ``a[d, r]``, the chance that depth ``d + 1``'s rank-``r`` candidate is the target's token given an
            accepted path above it.
        hits: Shape ``[D, R]`` int64, nodes whose token was the target's.
        tries: Shape ``[D, R]`` int64, nodes whose parent's path was the target's.
        num_steps: decoding steps measured.
    """

    probs: torch.Tensor
    hits: torch.Tensor
    tries: torch.Tensor
    num_steps: int


def comb_tree(num_levels: int, num_ranks: int) -> tuple[Path, ...]:
    """The probe tree of :func:`measure_rank_acceptance`: ``num_ranks`` candidates at every depth below the top-1
    path, ``[(0,), ..., (R-1,), (0, 0), ..., (0, R-1), ...]`` (``D * R`` nodes).

    Args:
        num_levels: ``D``, depth.
        num_ranks: ``R``, candidates per depth.

    Returns:
        Tree choices.

    Example:
        >>> comb_tree(2, 2)
        ((0,), (1,), (0, 0), (0, 1))
    """
    if num_levels < 1 or num_ranks < 1:
        raise ValueError(f"num_levels and num_ranks must be >= 1, got {num_levels} and {num_ranks}")
    return tuple((0,) * d + (r,) for d in range(num_levels) for r in range(num_ranks))


def count_rank_hits(target_logits: torch.Tensor, draft, num_levels: int, num_ranks: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-depth, per-rank hits and tries of one verification step (greedy).

    A node is *tried* when its parent's whole path equals the target's greedy tokens (the root always does); it is
    a *hit* when its own token is the target's greedy token after its parent. Its rank is its position among its
    siblings (drafts store siblings in rank order); its depth is its level.

    Args:
        target_logits: the target's logits at the tree's nodes (only the argmax is used).
            Shape: ``[B, N + 1, V]``.
        draft: the verified :class:`~specdec.types.Draft`.
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``.
        num_levels: ``D``: depths counted (deeper nodes are ignored).
        num_ranks: ``R``: ranks counted (higher ranks are ignored).

    Returns:
        ``(hits, tries)``, each Shape ``[D, R]`` int64 on the logits' device. No host sync.
    """
    argmax = target_logits.argmax(-1)                                             # [B, N + 1]
    parents = draft.parents
    B, W = parents.shape
    device = parents.device
    nodes = torch.arange(W, device=device)
    present = (parents >= 0) & (nodes > 0)
    match = present[:, 1:] & (draft.tokens == argmax.gather(1, parents.clamp(min=0)[:, 1:]))
    ok = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=device), match], 1)  # root always matches
    correct = ~(ancestor_matrix(parents) & ~ok[:, None, :]).any(-1)              # whole path matches
    same_parent = (parents[:, :, None] == parents[:, None, :]) & present[:, None, :] & (nodes[None, :] < nodes[:, None])
    rank = same_parent.sum(-1)                                                    # [B, N + 1]
    tried = present & correct.gather(1, parents.clamp(min=0)) & (draft.depths <= num_levels) & (rank < num_ranks)
    flat = ((draft.depths - 1).clamp(min=0) * num_ranks + rank.clamp(max=num_ranks - 1))[tried]
    tries = torch.zeros(num_levels * num_ranks, dtype=torch.long, device=device)
    hits = torch.zeros_like(tries)
    tries.index_add_(0, flat, torch.ones_like(flat))
    hits.index_add_(0, flat, ok[tried].long())
    return hits.view(num_levels, num_ranks), tries.view(num_levels, num_ranks)


def rank_candidates(draft, num_levels: int, num_ranks: int) -> torch.Tensor:
    """The draft's token for each (depth, rank): the first node (lowest index) of that depth and sibling rank.

    For level-wise drafters (Medusa) every node of a depth and rank holds the same token; for drafters whose
    candidates depend on the parent (EAGLE) the first node sits under the lowest-index parent (the top-1 path in
    :func:`comb_tree`).

    Args:
        draft: a :class:`~specdec.types.Draft`.
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``.
        num_levels: ``D``.
        num_ranks: ``R``.

    Returns:
        Shape ``[B, D, R]`` int64, ``-1`` where the draft has no such node.
    """
    parents = draft.parents
    B, W = parents.shape
    nodes = torch.arange(W, device=parents.device)
    present = (parents >= 0) & (nodes > 0)
    same_parent = (parents[:, :, None] == parents[:, None, :]) & present[:, None, :] & (nodes[None, :] < nodes[:, None])
    rank = same_parent.sum(-1)
    slot = torch.where(present & (draft.depths <= num_levels) & (rank < num_ranks),
                       (draft.depths - 1) * num_ranks + rank, num_levels * num_ranks)      # last slot: discarded
    first = torch.full((B, num_levels * num_ranks + 1), W, dtype=torch.long, device=parents.device)
    first = first.scatter_reduce(1, slot, nodes.expand(B, W), reduce="amin")[:, :-1]
    pad = torch.full((B, 1), -1, dtype=torch.long, device=parents.device)
    tokens = torch.cat([pad, draft.tokens, pad], 1)  # node i's token is tokens[:, i]; index W (no node) is -1
    return tokens.gather(1, first).view(B, num_levels, num_ranks)


def _continuation_counts(candidates: list, generated: torch.Tensor, accepted: list, num_levels: int,
                         num_ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    # step i's root is generated[s_i] with s_i = sum_{j < i} (accepted_j + 1); its depth-d truth is generated[s_i + d]
    hits = torch.zeros(num_levels, num_ranks, dtype=torch.long)
    tries = torch.zeros_like(hits)
    start = 0
    for cand, n in zip(candidates, accepted):
        if cand is not None:
            for d in range(1, num_levels + 1):
                if start + d >= generated.numel():
                    break
                row = cand[d - 1]
                tries[d - 1] += (row >= 0).long()
                hits[d - 1] += ((row >= 0) & (row == generated[start + d])).long()
        start += n + 1
    return hits, tries


def measure_rank_acceptance(target, make_drafter: Callable, prompts: Sequence[torch.Tensor], *, num_levels: int,
                            num_ranks: int = 10, probe_tree=None, max_new_tokens: int = 64, mode: str = "prefix",
                            eos_token_id=None, progress: bool = False) -> RankAcceptance:
    """Measure per-depth, per-rank acceptance of a drafter by greedy decoding of calibration prompts.

    Each prompt is decoded (batch 1, greedy, so the output is the target's own) with the drafter built for the
    probe tree; a counting verifier sees every step's target logits and draft and then verifies greedily. Two
    estimates of ``a[d, r]``:

    - ``mode="prefix"``: given the accepted prefix (:func:`count_rank_hits`): a node is tried when its parent's
      whole path is the target's, and hits when its token is the target's next one. With the default probe the
      parents are the top-1 path, so where drafters are right together (easy text), deeper ranks look better than
      they are under other parents.
    - ``mode="continuation"``: Medusa's own ``heads_accuracy``: the draft's rank-``r`` candidate at depth ``d``
      (:func:`rank_candidates`) against the token the target actually emitted ``d`` positions after the step's root,
      whether or not the path above was accepted. Exact for level-wise drafters, whose candidates ignore the parent.

    Use calibration text the drafter was trained on or like it, never the evaluation prompts.

    Args:
        target: the HF causal LM.
        make_drafter: ``tree_choices -> drafter`` drafting that static tree, e.g.
            ``lambda t: specdec.recipes.medusa(head, t)`` or ``lambda t: specdec.recipes.eagle1(eagle_head, t)``.
        prompts: calibration prompts. Shape: each ``[1, T]`` or ``[T]`` int64 on the target's device.
        num_levels: ``D``, depths measured.
        num_ranks: ``R``, ranks measured per depth (Medusa's ``TOPK = 10``).
        probe_tree: the tree drafted while measuring (default :func:`comb_tree` ``(D, R)``: ranks are measured
            below the top-1 path). For drafters whose candidates depend on the parent (EAGLE), the estimate is
            conditional on the probe's parents.
        max_new_tokens: tokens decoded per prompt.
        eos_token_id: as ``generate`` (default: the model's).
        progress: a tqdm bar over prompts.

    Returns:
        A :class:`RankAcceptance`.

    References:
        Medusa arXiv 2401.10774 (``medusa/eval/heads_accuracy.py``: per-head top-k accuracy on calibration prompts).
    """
    from tqdm.auto import tqdm

    from ..generate import generate
    from ..verify import verify_greedy

    if mode not in ("prefix", "continuation"):
        raise ValueError(f"mode must be 'prefix' (given the accepted prefix) or 'continuation' (against the target's "
                         f"own continuation, Medusa's heads_accuracy), got {mode!r}")
    probe = comb_tree(num_levels, num_ranks) if probe_tree is None else probe_tree
    drafter = make_drafter(probe)
    totals = {"hits": torch.zeros(num_levels, num_ranks, dtype=torch.long),
              "tries": torch.zeros(num_levels, num_ranks, dtype=torch.long), "steps": 0}
    step_candidates: list = []

    def counting_verifier(target_logits, draft, source=None, *, max_depth=None):
        if draft.num_nodes == 0:  # a plain step (the token budget left no room to draft)
            step_candidates.append(None)
            return verify_greedy(target_logits, draft, max_depth=max_depth)
        if mode == "prefix":
            hits, tries = count_rank_hits(target_logits, draft, num_levels, num_ranks)
            totals["hits"] += hits.cpu()
            totals["tries"] += tries.cpu()
        else:
            step_candidates.append(rank_candidates(draft, num_levels, num_ranks)[0].cpu())
        totals["steps"] += 1
        return verify_greedy(target_logits, draft, max_depth=max_depth)

    for ids in tqdm(prompts, desc="calibration", disable=not progress):
        ids = ids if ids.dim() == 2 else ids[None]
        if ids.shape[0] != 1:
            raise ValueError(f"calibration prompts are decoded one at a time: give [1, T] tensors, got "
                             f"{tuple(ids.shape)}")
        step_candidates.clear()
        out = generate(target, ids, drafter=drafter, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                       verifier=counting_verifier)
        if mode == "continuation":
            generated = out.sequences[0, ids.shape[1]: ids.shape[1] + int(out.num_new_tokens[0])].cpu()
            accepted = [row[0] for row in out.stats.num_accepted_per_step]
            hits, tries = _continuation_counts(step_candidates, generated, accepted, num_levels, num_ranks)
            totals["hits"] += hits
            totals["tries"] += tries
    if totals["steps"] == 0:
        raise ValueError("no draft was verified: give calibration prompts and max_new_tokens >= 2")
    hits, tries = totals["hits"], totals["tries"]
    probs = torch.where(tries > 0, hits.double() / tries.clamp(min=1).double(), torch.zeros((), dtype=torch.float64))
    return RankAcceptance(probs, hits, tries, totals["steps"])


def _table(acceptance) -> list[list[float]]:
    probs = acceptance.probs if isinstance(acceptance, RankAcceptance) else acceptance
    table = torch.as_tensor(probs, dtype=torch.float64).cpu()
    if table.dim() != 2 or table.shape[0] < 1 or table.shape[1] < 1:
        raise ValueError(f"acceptance must have shape [D, R] (depths x ranks), got {tuple(table.shape)}")
    if bool(((table < 0) | (table > 1) | table.isnan()).any()):
        raise ValueError("acceptance holds probabilities: every entry must lie in [0, 1]")
    return table.tolist()


def _check_budget(num_nodes: int) -> None:
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be an int >= 1 (draft nodes, root excluded), got {num_nodes!r}")


def expected_accept_length(tree, acceptance) -> float:
    """Expected tokens per step of a tree under the independence model (``tau``, bonus token included).

    .. math:: \\tau = 1 + \\sum_{(r_1..r_k)} \\prod_i a_{i-1, r_i}

    Args:
        tree: tree choices or a compiled tree (depths beyond ``D`` or ranks beyond ``R`` count as never accepted).
        acceptance: a :class:`RankAcceptance` or a ``[D, R]`` table of probabilities.

    Returns:
        ``tau`` as a float.

    Example:
        >>> expected_accept_length([(0,), (1,), (0, 0)], [[0.5, 0.2], [0.5, 0.1]])
        1.95
    """
    a = _table(acceptance)
    total = 1.0
    if not isinstance(tree, Tree) and len(tree) == 0:  # no drafts (e.g. nothing was ever accepted): tau is 1
        return total
    for path in compile_tree(tree).choices:
        value = 1.0
        for depth, rank in enumerate(path):
            value *= a[depth][rank] if depth < len(a) and rank < len(a[0]) else 0.0
        total += value
    return total


def optimal_tree(acceptance, num_nodes: int, *, max_depth: int | None = None) -> tuple[Path, ...]:
    """Medusa's greedy optimised tree: repeatedly add the frontier node with the largest path product.

    Start with the frontier ``{(0,)}``; take the frontier path ``p`` of largest ``prod_i a[i, p_i]`` (ties: the
    smaller ``(len, path)``); add its next sibling (if a rank is left) and its first child (if a depth is left) to
    the frontier; stop at ``num_nodes`` nodes. Each added node is the one of largest marginal gain in expected
    accepted length among those that keep the tree valid; when ``a`` does not increase along ranks this gives the
    optimal tree (:func:`sequoia_tree` is exact for any ``a``).

    Args:
        acceptance: a :class:`RankAcceptance` or a ``[D, R]`` table of probabilities.
        num_nodes: the budget ``N`` of draft nodes (root excluded); ``mc_sim_7b_63`` has 63.
        max_depth: cap on the depth (default ``D``).

    Returns:
        Tree choices in the order they were added (``compile_tree`` sorts them); fewer than ``num_nodes`` only when
        the full ``R``-ary tree of depth ``D`` is smaller.

    Example:
        >>> optimal_tree([[0.6, 0.2], [0.5, 0.1]], 3)
        ((0,), (0, 0), (1,))

    References:
        Medusa arXiv 2401.10774 (Sec. 3.3.1; ``medusa/eval/gen_results.py``).
    """
    _check_budget(num_nodes)
    a = _table(acceptance)
    depth_cap = len(a) if max_depth is None else min(len(a), max_depth)
    ranks = len(a[0])

    def value(path: Path) -> float:
        v = 1.0
        for depth, rank in enumerate(path):
            v *= a[depth][rank]
        return v

    chosen: list[Path] = []
    frontier = [(-value((0,)), (1, (0,)))]
    while frontier and len(chosen) < num_nodes:
        _, (_, path) = heapq.heappop(frontier)
        chosen.append(path)
        if path[-1] + 1 < ranks:
            sibling = path[:-1] + (path[-1] + 1,)
            heapq.heappush(frontier, (-value(sibling), (len(sibling), sibling)))
        if len(path) < depth_cap:
            child = path + (0,)
            heapq.heappush(frontier, (-value(child), (len(child), child)))
    return tuple(chosen)


def sequoia_tree(acceptance, num_nodes: int, *, max_depth: int | None = None) -> tuple[Path, ...]:
    """The tree of maximal expected accepted length for a node budget, for any acceptance table (exact DP).

    With ``best(d, n)`` the largest value (relative to the parent's) of the children at depth ``d`` and their
    subtrees using at most ``n`` nodes, and ``H(d, j, n)`` the same with exactly the children of ranks ``0..j-1``:

    .. math::
        H(d, j + 1, n) = \\max_{0 \\le m < n} H(d, j, n - 1 - m) + a_{d, j}\\,(1 + \\mathrm{best}(d + 1, m)),
        \\qquad \\mathrm{best}(d, n) = \\max_j H(d, j, n)

    ``O(D R N^2)`` time. Ties go to fewer nodes, so zero-value nodes are left out (the tree may then have fewer
    than ``num_nodes`` nodes).

    Args:
        acceptance: a :class:`RankAcceptance` or a ``[D, R]`` table of probabilities.
        num_nodes: the budget ``N`` (root excluded).
        max_depth: cap on the depth (default ``D``).

    Returns:
        Tree choices sorted by ``(len(path), path)``.

    Example:
        >>> sequoia_tree([[0.6, 0.5], [0.1, 0.0]], 2)
        ((0,), (1,))

    References:
        Chen et al., "Sequoia", arXiv 2402.12374 (Sec. 3.1, the dynamic programme); Medusa arXiv 2401.10774.
    """
    _check_budget(num_nodes)
    a = _table(acceptance)
    D = len(a) if max_depth is None else min(len(a), max_depth)
    R, N = len(a[0]), num_nodes
    neg = float("-inf")
    best = [[0.0] * (N + 1) for _ in range(D + 2)]          # best[D + 1][n] = 0: no level left
    best_j = [[0] * (N + 1) for _ in range(D + 2)]
    split = {}                                               # (d, j, n) -> m given to child j - 1
    for d in range(D, 0, -1):
        H = [0.0] * (N + 1)                                  # j = 0: no child
        best_row, best_arg = H[:], [0] * (N + 1)
        for j in range(R):
            nxt = [neg] * (N + 1)
            for n in range(1, N + 1):
                for m in range(n):
                    prev = H[n - 1 - m]
                    if prev == neg:
                        continue
                    v = prev + a[d - 1][j] * (1.0 + best[d + 1][m])
                    if v > nxt[n]:
                        nxt[n], split[(d, j + 1, n)] = v, m
            H = nxt
            for n in range(N + 1):
                if H[n] > best_row[n]:
                    best_row[n], best_arg[n] = H[n], j + 1
        best[d], best_j[d] = best_row, best_arg

    paths: list[Path] = []

    def build(d: int, n: int, prefix: Path) -> None:
        j = best_j[d][n]
        for jj in range(j, 0, -1):
            m = split[(d, jj, n)]
            paths.append(prefix + (jj - 1,))
            if d < D and m > 0:
                build(d + 1, m, prefix + (jj - 1,))
            n -= 1 + m

    build(1, N, ())
    return tuple(sorted(paths, key=lambda p: (len(p), p)))
