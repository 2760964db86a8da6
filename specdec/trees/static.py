"""Static tree policies: a fixed tree of sibling ranks, drafted level by level by a head.

- :class:`StaticTree`: node ``i`` is its parent's ``rank(i)``-th most likely child (EAGLE-1's
  ``mc_sim_7b_63``). ``DETERMINISTIC``.
- :class:`SampledTree`: each node's children are drawn *without replacement* from the head's processed
  distribution. ``WITHOUT_REPLACEMENT`` (with ``draft_probs``).

A policy's ``grow`` drives a head through an ``expand`` callback (see :mod:`specdec.trees.dynamic`), so any
autoregressive head can draft any policy; nothing here knows which head it is.

References:
    EAGLE arXiv 2401.15077; Jeon et al., "Recursive Speculative Decoding", arXiv 2402.14160.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ..sampling import RandomSource
from ..types import Draft, DraftScheme, SamplingParams
from .dynamic import DynamicTree, ExpandFn, TreePolicy

__all__ = ["StaticTree", "SampledTree", "as_policy"]


def _compile(tree):
    from . import core

    if hasattr(tree, "parents") and hasattr(tree, "prune"):
        return tree
    return core.compile_tree(tree)


class _StaticPlan(NamedTuple):
    parents: torch.Tensor            # [N + 1]
    depths: torch.Tensor             # [N + 1]
    level_nodes: list                # per level d = 1..D: node indices [n_d]
    level_width: list                # per level: top-k width (max rank + 1)
    level_parent_pos: list           # per level d >= 2: position of each node's parent in expanded[d - 1]
    level_ranks: list                # per level: rank of each node
    expanded: list                   # per level d = 1..D-1: expanded node indices [F_d]
    expanded_parent_pos: list        # per level d >= 2: position of each expanded node's parent in expanded[d-1]
    visible: list                    # per level d = 1..D-1: [F_d, S_d] bool over scratch slots
    num_expanded: int


def _build_plan(tree, device) -> _StaticPlan:
    parents = tree.parents.tolist()
    depths = tree.depths.tolist()
    ranks = tree.ranks.tolist()
    children = tree.num_children.tolist()
    anc = tree.ancestor_mask.cpu()
    D = tree.max_depth
    levels = [[i for i in range(1, len(parents)) if depths[i] == d] for d in range(1, D + 1)]
    expanded = [[i for i in nodes if children[i] > 0] for nodes in levels[:-1]]
    slot_order = [i for level in expanded for i in level]
    visible, seen = [], 0
    for level in expanded:
        seen += len(level)
        cols = torch.tensor(slot_order[:seen], dtype=torch.long)
        rows = torch.tensor(level, dtype=torch.long)
        visible.append(anc[rows][:, cols].to(device))

    def t(values):
        return torch.tensor(values, dtype=torch.long, device=device)

    def pos_in(prev, nodes):
        index = {n: j for j, n in enumerate(prev)}
        return t([index[parents[n]] for n in nodes])

    return _StaticPlan(
        parents=t(parents),
        depths=t(depths),
        level_nodes=[t(nodes) for nodes in levels],
        level_width=[max(ranks[i] for i in nodes) + 1 for nodes in levels],
        level_parent_pos=[None] + [pos_in(expanded[d - 1], levels[d]) for d in range(1, D)],
        level_ranks=[t([ranks[i] for i in nodes]) for nodes in levels],
        expanded=[t(level) for level in expanded],
        expanded_parent_pos=[None] + [pos_in(expanded[d - 1], expanded[d]) for d in range(1, D - 1)],
        visible=visible,
        num_expanded=len(slot_order),
    )


class StaticTree:
    """A static tree policy: node ``i`` is its parent's ``rank(i)``-th most likely child (EAGLE-1's policy).

    Args:
        tree: a compiled :class:`specdec.trees.Tree` or tree choices (e.g.
            ``specdec.trees.EAGLE_MC_SIM_7B_63``). A step's ``K`` prunes it to depth ``K``.

    References:
        EAGLE arXiv 2401.15077 (``mc_sim_7b_63``, ``generate_tree_buffers``).
    """

    scheme = DraftScheme.DETERMINISTIC

    def __init__(self, tree):
        self.tree = _compile(tree)
        if self.tree.max_depth < 1:
            raise ValueError("the static tree has no draft node: give at least one path, e.g. [(0,)]")
        self._plans: dict = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.tree!r})"

    @property
    def max_depth(self) -> int:
        """Deepest level of the tree."""
        return self.tree.max_depth

    def plan(self, depth: int, device) -> _StaticPlan:
        """The tree pruned to ``depth`` levels, laid out per level (built once per depth and device).

        Args:
            depth: levels to keep (``Tree.prune``).
            device: where the index tensors live.

        Returns:
            The cached per-level layout (node indices, top-k widths, expanded nodes, scratch visibility).
        """
        key = (depth, str(device))
        if key not in self._plans:
            self._plans[key] = _build_plan(self.tree.prune(depth), torch.device(device))
        return self._plans[key]

    def scratch_slots(self, depth: int) -> int:
        """Head KV slots written per step (nodes with children above the last level).

        Args:
            depth: levels drafted.

        Returns:
            The number of scratch slots.
        """
        return self.plan(depth, "cpu").num_expanded

    def num_forwards(self, depth: int) -> int:
        """Head forwards per step beyond the root's.

        Args:
            depth: levels drafted.

        Returns:
            One per level that has children.
        """
        return len(self.plan(depth, "cpu").expanded)

    def _children(self, logits, width, parent_pos, ranks, to_target, sampling, source, vocab_size):
        # logits [B, F, V']; returns target tokens [B, n], plus (draft_probs [B, n, V], present [B, n]) or None
        ids = logits.float().topk(width, dim=-1).indices
        return to_target(ids[:, parent_pos, ranks]), None

    def grow(self, root_logits: torch.Tensor, root_hidden: torch.Tensor, expand: ExpandFn, *, depth: int,
             draft_to_target=None, sampling: SamplingParams | None = None, source: RandomSource | None = None,
             vocab_size: int | None = None) -> Draft:
        """Draft the tree pruned to ``depth`` levels, one ``expand`` call per level above the last.

        Args:
            root_logits: the head's logits after the root. Shape: ``[B, V']``.
            root_hidden: the head's output at the root. Shape: ``[B, H]``.
            expand: the head's frontier forward (see :mod:`specdec.trees.dynamic`).
            depth: levels to draft (``<= max_depth``).
            draft_to_target: draft-to-target id map (identity if ``None``).
            sampling, source, vocab_size: used by :class:`SampledTree` only (``source``: the run's randomness).

        Returns:
            A :class:`~specdec.types.Draft` (every row the same tree shape).
        """
        to_target = draft_to_target or (lambda x: x)
        plan = self.plan(depth, root_logits.device)
        B, H = root_hidden.shape
        if self.scheme is DraftScheme.DETERMINISTIC or sampling is None or sampling.is_greedy:
            source = None
        elif source is None:
            raise ValueError("a sampled tree at temperature > 0 needs the run's RandomSource (source=...)")
        N = plan.parents.shape[0] - 1
        tokens = root_logits.new_zeros((B, N + 1), dtype=torch.long)
        probs = present = None
        if source is not None:
            probs = root_logits.new_zeros((B, N + 1, vocab_size), dtype=torch.float32)
            present = torch.ones(B, N + 1, dtype=torch.bool, device=root_logits.device)

        def place(level, logits, parent_pos):
            nodes = plan.level_nodes[level]
            got, extra = self._children(logits, plan.level_width[level], parent_pos, plan.level_ranks[level],
                                        to_target, sampling, source, vocab_size)
            tokens[:, nodes] = got
            if extra is not None:
                probs[:, nodes], present[:, nodes] = extra

        zero = torch.zeros(len(plan.level_nodes[0]), dtype=torch.long, device=root_logits.device)
        place(0, root_logits[:, None], zero)
        hidden_prev = root_hidden[:, None]
        for d in range(1, depth):
            nodes = plan.expanded[d - 1]
            F = nodes.shape[0]
            if d == 1:
                parent_hidden = hidden_prev.expand(B, F, H)
            else:
                parent_hidden = hidden_prev.index_select(1, plan.expanded_parent_pos[d - 1])
            visible = plan.visible[d - 1][None].expand(B, -1, -1)
            logits, hidden_prev = expand(tokens[:, nodes], parent_hidden, visible, d)
            place(d, logits, plan.level_parent_pos[d])
        parents = plan.parents[None].expand(B, -1).clone()
        depths = plan.depths[None].expand(B, -1).clone()
        if source is None:
            return Draft(tokens[:, 1:], parents, depths, None, DraftScheme.DETERMINISTIC)
        for d in range(1, depth):  # a node is present only if its whole path is
            nodes = plan.level_nodes[d]
            present[:, nodes] &= present[:, plan.parents[nodes]]
        parents = parents.masked_fill(~present, -1)
        depths = depths.masked_fill(~present, 0)
        return Draft(tokens[:, 1:], parents, depths, probs[:, 1:], DraftScheme.WITHOUT_REPLACEMENT)


class SampledTree(StaticTree):
    """A sampled static tree: each node's children are drawn without replacement from the head (EAGLE-1 v1).

    Child ``r`` of a node is sampled from the head's processed distribution (temperature / top-k / top-p, the
    run's :class:`~specdec.types.SamplingParams`) with its ``r`` earlier siblings removed and the rest
    renormalised. ``draft_probs`` of a node is its parent's full processed distribution (over the target
    vocabulary). A child that cannot be drawn (the distribution has fewer tokens than the tree wants) is
    absent (``parents == -1``), with its subtree. At temperature 0 it drafts the top-k tree
    (``DETERMINISTIC``), like :class:`StaticTree`.

    Args:
        tree: a compiled tree or tree choices.

    References:
        EAGLE arXiv 2401.15077 (v1 code: ``multinomial(..., replacement=False)``); Jeon et al., "Recursive
        Speculative Decoding", arXiv 2402.14160 (lossless verification of drafts sampled without replacement).
    """

    scheme = DraftScheme.WITHOUT_REPLACEMENT

    def _children(self, logits, width, parent_pos, ranks, to_target, sampling, source, vocab_size):
        if source is None:
            return super()._children(logits, width, parent_pos, ranks, to_target, sampling, source, vocab_size)
        from ..sampling import process_logits

        B, F, Vd = logits.shape
        draft_probs = process_logits(logits.float(), sampling)          # [B, F, V']
        weights = draft_probs.clone()
        picks, ok = [], []
        for _ in range(width):
            idx = source.categorical(weights)                            # [B, F]
            ok.append(weights.gather(-1, idx[..., None])[..., 0] > 0)
            weights.scatter_(-1, idx[..., None], 0.0)
            picks.append(idx)
        picks = torch.stack(picks, -1)[:, parent_pos, ranks]             # [B, n]
        ok = torch.stack(ok, -1)[:, parent_pos, ranks]
        targets = to_target(torch.arange(Vd, device=logits.device))
        full = draft_probs.new_zeros(B, F, vocab_size)
        full[..., targets] = draft_probs
        return to_target(picks), (full[:, parent_pos], ok)


def as_policy(tree) -> TreePolicy:
    """A tree policy from a policy, a compiled tree or tree choices (``None``: the default ``DynamicTree()``).

    Args:
        tree: a :class:`~specdec.trees.TreePolicy` (returned as is), a compiled :class:`~specdec.trees.Tree` or
            tree choices (a :class:`StaticTree` of them), or ``None``.

    Returns:
        A tree policy.
    """
    if isinstance(tree, TreePolicy):
        return tree
    if tree is None:
        return DynamicTree()
    if hasattr(tree, "parents") or isinstance(tree, (Sequence, str)):
        return StaticTree(tree)
    raise TypeError(f"tree must be a tree policy (DynamicTree, StaticTree, SampledTree, ...), a compiled Tree or "
                    f"tree choices, got {type(tree).__name__}")
