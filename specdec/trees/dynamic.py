"""EAGLE-2 dynamic draft trees: expand the most likely frontier level by level, then rerank to a node budget.

A node's *value* is the product of the draft's probabilities along its path, kept as a cumulative
log-probability. Per step and per row:

1. **Root.** The head's distribution after the root gives ``top_k`` children: level 1, also the first frontier.
2. **Expansion** (levels ``2..depth``). One head forward runs the whole frontier (``top_k`` nodes) under a tree
   mask; each frontier node proposes its ``top_k`` children (score = parent score + child log-prob). All
   ``top_k**2`` children are recorded as candidates; the best ``top_k`` of them (by score) form the next
   frontier.
3. **Rerank.** Of all ``top_k + (depth - 1) * top_k**2`` candidates, keep the ``total_tokens - 1`` best by
   score and sort them by candidate index, so parents precede children and levels are stored breadth-first.

The selected set is ancestor-closed: a child's score never exceeds its parent's (log-probs are ``<= 0``), and
ties are broken toward the smaller candidate index (the parent), by a stable sort.

The head is abstracted as an ``expand`` callable, so the tree logic runs (and is tested) without a model::

    expand(tokens [B, F], parent_hidden [B, F, H], visible [B, F, S], level) -> (logits [B, F, V'], hidden [B, F, H])

``visible[b, i, s]`` says whether frontier node ``i`` sees tree scratch slot ``s`` (its ancestors and itself);
the frontier's own keys go to the last ``F`` of the ``S`` scratch slots. ``level`` is the frontier's depth.

This callback is the whole interface between a tree policy and a drafter: any autoregressive head (EAGLE's, a
draft model run as a head, ...) drafts any :class:`TreePolicy` (:class:`DynamicTree` here,
:class:`~specdec.trees.StaticTree` and :class:`~specdec.trees.SampledTree` in :mod:`specdec.trees.static`) by
supplying ``expand`` plus the root's logits and hidden state; the policy never sees the head.

References:
    Li et al., "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees", EMNLP 2024,
    arXiv 2406.16858, https://arxiv.org/abs/2406.16858 (the authors' ``topK_genrate``); vLLM ``propose_tree``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..kernels.dynamic_tree import dynamic_tree_level, new_candidates, rerank_candidates
from ..kernels.topk import log_softmax_topk
from ..sampling import RandomSource
from ..types import Draft, DraftScheme, SamplingParams

__all__ = ["DynamicTree", "ExpandFn", "TreePolicy", "VocabMap", "grow_dynamic_tree", "grow_dynamic_tree_ref"]

ExpandFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], "tuple[torch.Tensor, torch.Tensor]"]


class VocabMap:
    """A draft-to-target id map given as a table: draft id ``i`` is target id ``table[i]``.

    Callable like any ``draft_to_target`` function (every policy takes it); :func:`grow_dynamic_tree` instead hands
    the table to :func:`~specdec.kernels.log_softmax_topk` (``index_map``), which reads it inside its last launch,
    so a level's ids need no gather of their own.

    Args:
        table: Shape ``[V']`` int64, the target id of each draft id.

    Example:
        >>> VocabMap(torch.tensor([4, 9, 11]))(torch.tensor([[2, 0]]))
        tensor([[11,  4]])
    """

    def __init__(self, table: torch.Tensor):
        if not isinstance(table, torch.Tensor) or table.dim() != 1 or table.dtype != torch.int64:
            raise ValueError(f"VocabMap: the table must be an int64 vector [V'] of target ids, got "
                             f"{getattr(table, 'dtype', type(table))} {tuple(getattr(table, 'shape', ()))}")
        self.table = table

    def __call__(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target ids of ``draft_ids`` (any shape, int64 in ``[0, V')``), same shape."""
        return self.table[draft_ids]

    def __repr__(self) -> str:
        return f"VocabMap({self.table.shape[0]} draft ids)"


@runtime_checkable
class TreePolicy(Protocol):
    """How a head's distributions become a tree each step; a drafter drives it through ``expand``.

    Attributes:
        scheme: the :class:`~specdec.types.DraftScheme` of its drafts at temperature > 0 (decides the verifier).
    """

    scheme: DraftScheme

    @property
    def max_depth(self) -> int:
        """Deepest level the policy drafts."""

    def scratch_slots(self, depth: int) -> int:
        """Head KV slots one step writes for a tree of ``depth`` levels (the ``S`` of ``expand``'s ``visible``)."""

    def num_forwards(self, depth: int) -> int:
        """``expand`` calls per step for a tree of ``depth`` levels."""

    def grow(self, root_logits: torch.Tensor, root_hidden: torch.Tensor, expand: ExpandFn, *, depth: int,
             draft_to_target: Callable[[torch.Tensor], torch.Tensor] | None = None,
             sampling: SamplingParams | None = None, source: RandomSource | None = None,
             vocab_size: int | None = None) -> Draft:
        """Draft one step's tree (root logits ``[B, V']``, root hidden ``[B, H]``) with ``depth`` levels."""


def _identity(ids: torch.Tensor) -> torch.Tensor:
    return ids


def _check_args(root_logits: torch.Tensor, root_hidden: torch.Tensor, depth: int, top_k: int,
                total_tokens: int) -> None:
    if root_logits.dim() != 2:
        raise ValueError(f"root_logits must have shape [B, V], got {tuple(root_logits.shape)}")
    if root_hidden.dim() != 2 or root_hidden.shape[0] != root_logits.shape[0]:
        raise ValueError(f"root_hidden must have shape [B={root_logits.shape[0]}, H], got "
                         f"{tuple(root_hidden.shape)}")
    if depth < 1 or top_k < 1 or total_tokens < 2:
        raise ValueError(f"need depth >= 1, top_k >= 1 and total_tokens >= 2 (root + 1 draft), got depth={depth}, "
                         f"top_k={top_k}, total_tokens={total_tokens}")


def grow_dynamic_tree(root_logits: torch.Tensor, root_hidden: torch.Tensor, expand: ExpandFn, *, depth: int,
                      top_k: int, total_tokens: int,
                      draft_to_target: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Draft:
    """Build one EAGLE-2 dynamic tree per row (batched, no host sync).

    Args:
        root_logits: the head's logits after the root (level-1 distribution). Shape: ``[B, V']``.
        root_hidden: the head's output at the root, parent hidden of level 1. Shape: ``[B, H]``.
        expand: runs a frontier through the head (see the module docstring).
        depth: ``D``, deepest level (``D - 1`` calls of ``expand``).
        top_k: children per expanded node and frontier width.
        total_tokens: tree size verified by the target, root included (the authors' ``total_token``):
            ``N = min(total_tokens - 1, top_k + (D - 1) top_k^2)`` draft nodes.
        draft_to_target: maps draft-vocabulary ids to target ids (EAGLE-3 ``d2t``); identity if ``None``. A
            :class:`VocabMap` is read inside the top-k's launch (no gather per level).

    Returns:
        A :class:`~specdec.types.Draft` with ``tokens [B, N]`` (target ids), ``parents``/``depths``
        ``[B, N + 1]``, scheme ``DETERMINISTIC``.

    Example:
        >>> V, H = 5, 2
        >>> expand = lambda tok, h, vis, lvl: (torch.zeros(*tok.shape, V), h)
        >>> d = grow_dynamic_tree(torch.randn(1, V), torch.zeros(1, H), expand, depth=2, top_k=2, total_tokens=4)
        >>> d.parents.shape
        torch.Size([1, 4])

    References:
        EAGLE-2 arXiv 2406.16858, Sec. 4 (expansion and reranking).
    """
    _check_args(root_logits, root_hidden, depth, top_k, total_tokens)
    B, V = root_logits.shape
    k = min(top_k, V)
    if isinstance(draft_to_target, VocabMap):  # the top-k's last launch reads the table: target ids come out
        table = draft_to_target.table

        def best(logits):
            return log_softmax_topk(logits, k, index_map=table)
    else:
        to_target = draft_to_target or _identity

        def best(logits):
            lp, ids = log_softmax_topk(logits, k)
            return lp, to_target(ids)

    cands = new_candidates(B, k, depth, root_logits.device)
    # level 1: the root's k best (ties by ascending id, as the reference's (-score, index) order)
    scores, tokens = best(root_logits)
    frontier = dynamic_tree_level(cands, 0, scores, tokens, None, root_hidden, advance=depth > 1)
    offset = k
    for level in range(1, depth):
        logits, hidden = expand(frontier.tokens, frontier.hidden, frontier.visible, level)
        child_lp, child_tokens = best(logits)  # [B, k parents, k children]
        frontier = dynamic_tree_level(cands, offset, child_lp, child_tokens, frontier, hidden,
                                      advance=level + 1 < depth)
        offset += k * k
    tokens, parents, depths = rerank_candidates(cands, k, total_tokens)
    return Draft(tokens, parents, depths, None, DraftScheme.DETERMINISTIC)


def grow_dynamic_tree_ref(root_logits: torch.Tensor, root_hidden: torch.Tensor, expand: ExpandFn, *, depth: int,
                          top_k: int, total_tokens: int,
                          draft_to_target: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Draft:
    """Reference for :func:`grow_dynamic_tree` (same signature): per-row Python lists, the paper's steps literally.

    Candidates are records ``(score, token, parent, level)``; frontiers and the rerank sort by
    ``(-score, candidate index)``. Slow; for tests.

    Args:
        root_logits: Shape ``[B, V']``.
        root_hidden: Shape ``[B, H]``.
        expand: as in :func:`grow_dynamic_tree`.
        depth, top_k, total_tokens, draft_to_target: as in :func:`grow_dynamic_tree`.

    Returns:
        The same :class:`~specdec.types.Draft` as :func:`grow_dynamic_tree` (barring exact score ties).

    References:
        EAGLE-2 arXiv 2406.16858.
    """
    _check_args(root_logits, root_hidden, depth, top_k, total_tokens)
    to_target = draft_to_target or _identity
    B, V = root_logits.shape
    k = min(top_k, V)
    cands: list[list[tuple[float, int, int, int]]] = [[] for _ in range(B)]
    frontier: list[list[int]] = [[] for _ in range(B)]
    hidden_of: list[dict[int, torch.Tensor]] = [{} for _ in range(B)]
    slot_of: list[dict[int, int]] = [{} for _ in range(B)]
    score_t: list[dict[int, torch.Tensor]] = [{} for _ in range(B)]
    for b in range(B):
        lp = torch.log_softmax(root_logits[b].float(), dim=-1)
        s, ids = lp.topk(k)
        toks = to_target(ids)
        for j in range(k):
            score_t[b][j] = s[j]
            cands[b].append((float(s[j]), int(toks[j]), -1, 1))
            frontier[b].append(j)
    for level in range(1, depth):
        S = level * k
        tok = torch.zeros(B, k, dtype=torch.long, device=root_logits.device)
        par_h = root_hidden.new_zeros(B, k, root_hidden.shape[-1])
        vis = torch.zeros(B, k, S, dtype=torch.bool, device=root_logits.device)
        for b in range(B):
            for i, c in enumerate(frontier[b]):
                slot_of[b][c] = (level - 1) * k + i
                tok[b, i] = cands[b][c][1]
                parent = cands[b][c][2]
                par_h[b, i] = root_hidden[b] if parent < 0 else hidden_of[b][parent]
                node = c
                while node >= 0:
                    vis[b, i, slot_of[b][node]] = True
                    node = cands[b][node][2]
        logits, hidden = expand(tok, par_h, vis, level)
        for b in range(B):
            children = []
            for i, c in enumerate(frontier[b]):
                hidden_of[b][c] = hidden[b, i]
                lp = torch.log_softmax(logits[b, i].float(), dim=-1).clamp(max=0.0)
                s, ids = lp.topk(k)
                toks = to_target(ids)
                for j in range(k):
                    cid = len(cands[b])
                    score_t[b][cid] = score_t[b][c] + s[j]
                    cands[b].append((float(score_t[b][cid]), int(toks[j]), c, level + 1))
                    children.append(cid)
            frontier[b] = sorted(children, key=lambda cid: (-cands[b][cid][0], cid))[:k]
    n = min(total_tokens - 1, len(cands[0]))
    tokens = torch.zeros(B, n, dtype=torch.long)
    parents = torch.full((B, n + 1), -1, dtype=torch.long)
    depths = torch.zeros(B, n + 1, dtype=torch.long)
    for b in range(B):
        chosen = sorted(sorted(range(len(cands[b])), key=lambda c: (-cands[b][c][0], c))[:n])
        node_of = {c: i + 1 for i, c in enumerate(chosen)}
        for i, c in enumerate(chosen):
            _, tok_c, parent, lvl = cands[b][c]
            tokens[b, i] = tok_c
            parents[b, i + 1] = 0 if parent < 0 else node_of[parent]
            depths[b, i + 1] = lvl
    dev = root_logits.device
    return Draft(tokens.to(dev), parents.to(dev), depths.to(dev), None, DraftScheme.DETERMINISTIC)


@dataclass(frozen=True)
class DynamicTree:
    """The EAGLE-2 tree policy: per step, expand the most likely frontier and rerank to a node budget.

    Attributes:
        total_tokens: tree size verified by the target, root included (the authors' ``total_token``; the
            EAGLE-2 paper uses 60 for 7B/8B targets, 50 for 13B, 48 for 70B).
        depth: deepest draft level ``D`` (= the authors' ``depth + 1``: their loop runs ``depth`` expansions
            after the root's distribution). A step's ``K`` bounds it further.
        top_k: children per expanded node and frontier width.

    References:
        EAGLE-2 arXiv 2406.16858 (defaults 60 / 6 / 10 in the paper's setup).
    """

    scheme = DraftScheme.DETERMINISTIC  # top-k drafts (a class attribute, not a field)

    total_tokens: int = 60
    depth: int = 6
    top_k: int = 10

    def __post_init__(self) -> None:
        if self.total_tokens < 2 or self.depth < 1 or self.top_k < 1:
            raise ValueError(f"DynamicTree needs total_tokens >= 2, depth >= 1, top_k >= 1, got {self}")

    @property
    def max_depth(self) -> int:
        """Deepest level this policy drafts."""
        return self.depth

    def scratch_slots(self, depth: int) -> int:
        """Head KV slots the expansion writes for a tree of ``depth`` levels (frontiers of levels 1..D-1).

        Args:
            depth: levels drafted.

        Returns:
            ``(depth - 1) * top_k``.
        """
        return max(depth - 1, 0) * self.top_k

    def num_forwards(self, depth: int) -> int:
        """Head forwards per step beyond the root's (one per expanded level).

        Args:
            depth: levels drafted.

        Returns:
            ``depth - 1``.
        """
        return max(depth - 1, 0)

    def grow(self, root_logits: torch.Tensor, root_hidden: torch.Tensor, expand: ExpandFn, *, depth: int,
             draft_to_target=None, sampling: SamplingParams | None = None, source=None,
             vocab_size: int | None = None) -> Draft:
        """Build the step's tree (see :func:`grow_dynamic_tree`); sampling parameters do not change it.

        Args:
            root_logits: Shape ``[B, V']``.
            root_hidden: Shape ``[B, H]``.
            expand: the head's frontier forward.
            depth: levels for this step (``<= self.depth``).
            draft_to_target: draft-to-target id map.
            sampling, source, vocab_size: unused (top-k drafts are deterministic; verified target-only).

        Returns:
            A ``DETERMINISTIC`` :class:`~specdec.types.Draft`.
        """
        return grow_dynamic_tree(root_logits, root_hidden, expand, depth=depth, top_k=self.top_k,
                                 total_tokens=self.total_tokens, draft_to_target=draft_to_target)
