"""Level-wise static trees: every node of level ``d`` takes a rank of level ``d``'s own distribution.

This is Medusa's tree semantics. A parallel head gives one distribution per level from a single forward (head
``d - 1`` predicts the token ``d`` positions after the root), independent of the tokens above it; a node with
path ``(r_1, ..., r_d)`` (tree choices, :mod:`specdec.trees.core`) is the ``r_d``-th most likely token of level
``d``, whatever its parent's token is. Compare :class:`specdec.trees.StaticTree` (EAGLE-1), where a node is the
``r``-th most likely child *of its parent*, drafted autoregressively.

- :class:`LevelTree`: the policy (a compiled tree plus cached index plans); :meth:`LevelTree.chain` is the
  1-wide case, the chain of every level's top-1 (vLLM's Medusa proposer).
- :func:`level_tree_draft` (vectorised: one ``topk`` and one gather) and :func:`level_tree_draft_ref` (a per-row,
  per-node loop over ``argsort``), same signature.

Top-k is a deterministic function of the head's logits, so the drafts are ``DraftScheme.DETERMINISTIC`` and the
target-only tree verifier is exact for them at any temperature.

References:
    Cai et al., "Medusa", arXiv 2401.10774 (Sec. 2.1.2, tree attention; ``medusa_choices``,
    ``generate_candidates``: candidates gathered from every head's top-k by ``tree_indices``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ..types import Draft, DraftScheme
from .core import Tree, chain_tree, compile_tree

__all__ = ["LevelTree", "as_level_policy", "level_tree_draft", "level_tree_draft_ref"]


class _LevelPlan(NamedTuple):
    parents: torch.Tensor     # [N + 1]
    depths: torch.Tensor      # [N + 1]
    flat_index: torch.Tensor  # [N]: (level - 1) * width + rank of each draft node
    width: int                # top-k needed: largest rank + 1
    depth: int                # levels drafted


def _plan(tree: Tree, device) -> _LevelPlan:
    depths = tree.depths[1:]
    ranks = tree.ranks[1:]
    width = int(ranks.max()) + 1 if ranks.numel() else 1
    return _LevelPlan(tree.parents.to(device), tree.depths.to(device),
                      ((depths - 1) * width + ranks).to(device), width, tree.max_depth)


def _check(level_logits: torch.Tensor, tree: Tree, depth: int) -> Tree:
    if level_logits.dim() != 3:
        raise ValueError(f"level_logits must have shape [B, D, V], got {tuple(level_logits.shape)}")
    if not 1 <= depth <= tree.max_depth:
        raise ValueError(f"depth must lie in [1, {tree.max_depth}] (the tree's depth), got {depth}")
    if level_logits.shape[1] < depth:
        raise ValueError(f"the head gave {level_logits.shape[1]} levels but the tree is drafted to depth {depth}: "
                         f"prune the tree (tree.prune({level_logits.shape[1]})) or use a head with more levels")
    pruned = tree.prune(depth)
    width = int(pruned.ranks.max()) + 1
    if width > level_logits.shape[-1]:
        raise ValueError(f"the tree asks for rank {width - 1} but the vocabulary has {level_logits.shape[-1]} tokens")
    return pruned


def level_tree_draft(level_logits: torch.Tensor, tree, depth: int | None = None) -> Draft:
    """Draft a level-wise tree from per-level logits: one ``topk`` over all levels, one gather.

    .. math:: \\mathrm{token}(r_1, \\dots, r_d) = \\mathrm{topk}(z_d)[r_d]

    Args:
        level_logits: draft logits of each level (level ``d`` is row ``d - 1``).
            Shape: ``[B, D, V]``.
        tree: tree choices or a compiled :class:`~specdec.trees.Tree`.
        depth: levels to draft (the tree is pruned to it); default the tree's depth.

    Returns:
        A ``DETERMINISTIC`` :class:`~specdec.types.Draft`, every row the same tree shape.

    Example:
        >>> z = torch.tensor([[[0., 3., 1.], [2., 0., 1.]]])
        >>> level_tree_draft(z, [(0,), (1,), (0, 0)]).tokens.tolist()
        [[1, 2, 0]]

    References:
        Medusa arXiv 2401.10774 (``generate_candidates``).
    """
    tree = compile_tree(tree)
    depth = tree.max_depth if depth is None else depth
    return _draft(level_logits, _plan(_check(level_logits, tree, depth), level_logits.device))


def _draft(level_logits: torch.Tensor, plan: _LevelPlan) -> Draft:
    B = level_logits.shape[0]
    top = level_logits[:, :plan.depth].topk(plan.width, dim=-1).indices          # [B, depth, W]
    tokens = top.reshape(B, -1)[:, plan.flat_index]                          # [B, N]
    return Draft(tokens, plan.parents[None].expand(B, -1).clone(), plan.depths[None].expand(B, -1).clone(),
                 None, DraftScheme.DETERMINISTIC)


def level_tree_draft_ref(level_logits: torch.Tensor, tree, depth: int | None = None) -> Draft:
    """Reference twin of :func:`level_tree_draft`: per row and node, the rank-``r_d`` entry of a stable descending
    ``argsort`` of level ``d`` (identical to ``topk`` when no two logits of a level tie).

    Args:
        level_logits: Shape ``[B, D, V]``.
        tree: tree choices or a compiled tree.
        depth: levels to draft; default the tree's depth.

    Returns:
        A ``DETERMINISTIC`` :class:`~specdec.types.Draft`.
    """
    tree = compile_tree(tree)
    depth = tree.max_depth if depth is None else depth
    pruned = _check(level_logits, tree, depth)
    B = level_logits.shape[0]
    tokens = torch.zeros(B, pruned.num_nodes, dtype=torch.long, device=level_logits.device)
    for b in range(B):
        for i, path in enumerate(pruned.choices):
            order = torch.argsort(level_logits[b, len(path) - 1], descending=True, stable=True)
            tokens[b, i] = order[path[-1]]
    parents, depths = pruned.expand(B, level_logits.device)
    return Draft(tokens, parents, depths, None, DraftScheme.DETERMINISTIC)


class LevelTree:
    """Medusa's tree policy: node ``(r_1, ..., r_d)`` is rank ``r_d`` of level ``d``'s distribution.

    Args:
        tree: tree choices (e.g. ``specdec.trees.MEDUSA_MC_SIM_7B_63``, or the output of
            :func:`specdec.trees.optimal_tree`) or a compiled :class:`~specdec.trees.Tree`. A step's ``K``
            prunes it to depth ``K``.

    Attributes:
        scheme: ``DETERMINISTIC``.
        tree: the compiled tree.

    Example:
        >>> policy = LevelTree([(0,), (1,), (0, 0)])
        >>> policy.draft(torch.randn(2, 2, 10), depth=2).tokens.shape
        torch.Size([2, 3])

    References:
        Medusa arXiv 2401.10774 (``medusa_choices``).
    """

    scheme = DraftScheme.DETERMINISTIC

    def __init__(self, tree):
        self.tree = compile_tree(tree)
        if self.tree.max_depth < 1:
            raise ValueError("the level tree has no draft node: give at least one path, e.g. [(0,)]")
        self._plans: dict = {}

    @classmethod
    def chain(cls, num_levels: int) -> LevelTree:
        """The chain of every level's top-1 (Medusa without tree attention; vLLM's Medusa proposer).

        Args:
            num_levels: ``D``, the chain's length.

        Returns:
            ``LevelTree(chain_tree(num_levels))``.
        """
        return cls(chain_tree(num_levels))

    def __repr__(self) -> str:
        return f"LevelTree({self.tree!r})"

    @property
    def max_depth(self) -> int:
        """Deepest level of the tree."""
        return self.tree.max_depth

    def draft(self, level_logits: torch.Tensor, depth: int | None = None) -> Draft:
        """Draft the tree (pruned to ``depth`` levels) from per-level logits.

        Args:
            level_logits: Shape ``[B, D, V]`` (``D >= depth``).
            depth: levels to draft; default the tree's depth.

        Returns:
            A ``DETERMINISTIC`` :class:`~specdec.types.Draft` (index plans are built once per depth and device).
        """
        depth = self.max_depth if depth is None else min(depth, self.max_depth)
        key = (depth, str(level_logits.device))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _plan(_check(level_logits, self.tree, depth), level_logits.device)
        elif level_logits.dim() != 3 or level_logits.shape[1] < depth or level_logits.shape[-1] < plan.width:
            _check(level_logits, self.tree, depth)  # raises the descriptive error
        return _draft(level_logits, plan)


def as_level_policy(tree) -> LevelTree:
    """A :class:`LevelTree` from a policy, a compiled tree or tree choices.

    Args:
        tree: a :class:`LevelTree`, a :class:`~specdec.trees.Tree`, tree choices or their string form.

    Returns:
        A :class:`LevelTree`.
    """
    if isinstance(tree, LevelTree):
        return tree
    if isinstance(tree, (Tree, Sequence)):
        return LevelTree(tree)
    raise TypeError(f"tree must be a LevelTree, a compiled Tree or tree choices, got {type(tree).__name__}")
